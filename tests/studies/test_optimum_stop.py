"""A stopped study leaves nothing running: SIGTERM to a ``--jobs`` study terminates its workers, and a CP-SAT
child dies with the process that started it. Linux only (process table from /proc, prctl in cpsat.py)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from kvstudy.optimum import cpsat

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc process table")


def _stat(pid) -> list:
    """The fields of /proc/PID/stat after "pid (comm) ": state, ppid, ... (comm may hold spaces and ")")."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2:].split()


def _children(pid: int) -> list:
    """(pid, command line) of the live processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat(entry.name)
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # the process ended while we looked
            continue
        if fields[0] != "Z" and int(fields[1]) == pid:
            found.append((int(entry.name), cmd))
    return found


def _workers(pid: int) -> list:
    """The pool's worker processes of study ``pid`` (multiprocessing's spawn start-up in the command line)."""
    return [p for p, cmd in _children(pid) if "spawn_main" in cmd]


def _alive(pid: int) -> bool:
    try:
        return _stat(pid)[0] != "Z"
    except OSError:
        return False


def _wait_for(what, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = what()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"gave up after {timeout:.0f} s waiting for {what}")


def _sigterm_study(args: list, ready) -> tuple:
    """Run ``python -m kvstudy.optimum study --jobs 2 ARGS``, wait until ``ready(pid)`` returns something, send
    SIGTERM to the study (the parent only, as ``kill`` does) and return (what ready returned, exit code, stderr)."""
    cmd = [sys.executable, "-m", "kvstudy.optimum", "study", "--model", "1", "--cut", "10", "--time-limit", "30",
           "--jobs", "2", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = _wait_for(lambda: ready(proc.pid))
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)  # orphaned workers would hold the pipes open: this would time out
    finally:
        if proc.poll() is None:
            proc.kill()
    return seen, proc.returncode, err


@pytest.mark.slow  # over about 4 s (measured 4.3-14 s, issue 54's fast-tier budget)
def test_sigterm_to_a_jobs_study_stops_its_workers(tmp_path):
    out = tmp_path / "stop.parquet"

    def both_busy(pid):
        workers = _workers(pid)
        if len(workers) == 2:
            time.sleep(3.0)  # let both start a trial
            return workers
        return None

    # cut-10 Model 1 draws 1, 4, 9 and 10: HiGHS needs more than 30 s on each, so both workers are busy
    workers, code, err = _sigterm_study(["--only", "1", "4", "9", "10", "--out", str(out)], both_busy)
    assert code == 143, err
    assert "study stopped by SIGTERM; no trial had finished" in err
    _wait_for(lambda: not any(_alive(p) for p in workers), timeout=10)
    assert not out.exists()


def test_cpsat_child_dies_with_its_parent():
    if not cpsat.available():
        pytest.skip("OR-Tools is not installed (test extras): no CP-SAT child to watch")
    script = ("from kvstudy.optimum.study import instance\n"
              "from kvstudy.optimum.online import starts\n"
              "from kvstudy.policies.mcsf import MCSF\n"
              "from kvstudy.optimum.cpsat import improve\n"
              "inst = instance(1, 0)\n"
              "improve(inst, starts(inst, MCSF()), work=500.0)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        child = _wait_for(lambda: [p for p, c in _children(parent.pid) if "kvstudy.optimum.cpsat" in c])[0]
        time.sleep(1.0)  # past the child's start-up, into the search
        os.kill(parent.pid, signal.SIGKILL)  # no handler, no cleanup: only the kernel can end the child now
        parent.wait(timeout=10)
        _wait_for(lambda: not _alive(child), timeout=10)
    finally:
        if parent.poll() is None:
            parent.kill()


@pytest.mark.slow
def test_a_study_that_finished_trials_reports_them_when_stopped(tmp_path):
    out = tmp_path / "some.parquet"
    # cut-10 trials 0 and 2 are proven in a few seconds, trials 1 and 4 run into the 30-s limit
    _, code, err = _sigterm_study(["--only", "0", "1", "2", "4", "--out", str(out)], lambda pid: out.exists())
    kept = pd.read_parquet(out)
    assert code == 143
    # stopped as soon as the file appears: trial 0 is in it, trial 2 needs another ~1.5 s
    assert kept["trial"].tolist() == [0] and kept["proven_optimal"].all()
    assert f"its 1 finished trial is in {out}" in err, err
