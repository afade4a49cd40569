"""The card's command line, as a user types it (one subprocess per case)."""
import json
import subprocess
import sys

import pytest

from kvstudy.api import options
from kvstudy.running.paths import REPO_ROOT


def kvstudy(*args, cwd=REPO_ROOT):
    return subprocess.run([sys.executable, "-m", "kvstudy", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_card_command_small_workload(tmp_path):
    proc = kvstudy("+policy=mcsf", "+demand=high", "workload.num_requests=60", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert "e2e_latency" in proc.stdout and f"outputs: {tmp_path}" in proc.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["latency"]["name"] == "vidur"
    assert {p.name for p in tmp_path.iterdir()} >= {"requests.parquet", "iterations.parquet", "summary.json"}


def test_missing_policy_is_one_clear_line(tmp_path):
    proc = kvstudy(f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: no policy chosen; add +policy=NAME with NAME one of: "
                                   + ", ".join(options("policy")))
    assert "mcsf" in options("policy") and "mc_benchmark" in options("policy")


def test_unknown_option_is_one_clear_line(tmp_path):
    proc = kvstudy("+policy=mcsf,nope", "+demand=high", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: unknown policy 'nope'; allowed: " + ", ".join(options("policy")) + \
        "; an option of your own: put nope.yaml in <folder>/policy/ and add hydra.searchpath=[file:///absolute/path/" \
        "to/<folder>]"


@pytest.mark.slow  # over about 4 s (measured 4.3-14 s, issue 54's fast-tier budget)
def test_latency_printout():
    proc = subprocess.run([sys.executable, "-m", "kvstudy.latency"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "(a) one 512-token prefill" in proc.stdout and " ms" in proc.stdout


def test_an_error_is_printed_once_and_kept_in_the_log(tmp_path):
    """A bad value inside a run: one ``error:`` line on the terminal (stderr), none on stdout, and the same line in
    the run's log file and error.txt (issue 46: it was printed twice, the log line and stderr)."""
    proc = kvstudy("+policy=mcsf", "+demand=high", "seed=-1", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    line = "error: seed=-1: allowed a whole number >= 0 and <= 4,294,967,295"
    assert proc.stderr.strip() == line and "error" not in proc.stdout
    assert line in (tmp_path / "__main__.log").read_text() and "seed=-1" in (tmp_path / "error.txt").read_text()
