"""Sweeps: resume after a kill, the submitit local launcher, no state leaking between jobs of a worker."""
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from kvstudy import analysis
from kvstudy.running.paths import REPO_ROOT

BASE = ["+policy=mcsf", "+demand=high", "latency=linear", "engine.progress=false"]


def kvstudy(*args, **kw):
    return subprocess.run([sys.executable, "-m", "kvstudy", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=600, **kw)

pytestmark = pytest.mark.slow  # whole sweeps in subprocesses


def test_resume_after_killing_a_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    args = [sys.executable, "-m", "kvstudy", "-m", *BASE, "workload.num_requests=4000", "seed=range(0,10)",
            "hydra/launcher=basic", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen(args, cwd=REPO_ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while len(list(sweep.rglob("summary.json"))) < 3:
        assert time.time() < deadline and proc.poll() is None, "sweep ended before it could be killed"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = {p: p.stat().st_mtime_ns for p in sweep.rglob("summary.json")}
    assert 3 <= len(finished) < 10
    assert analysis.load_sweep(sweep).shape[0] == len(finished)
    again = subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.count("complete already, skipped") == len(finished)
    for path, mtime in finished.items():
        assert path.stat().st_mtime_ns == mtime  # finished runs were not redone
    df = analysis.load_sweep(sweep)
    assert len(df) == 10 and sorted(df["seed"]) == list(range(10)) and (df["status"] == "completed").all()


def test_submitit_local_launcher(tmp_path):
    proc = kvstudy("-m", "+policy=mcsf,mc_benchmark", "+demand=high", "latency=linear", "workload.num_requests=50",
                   "engine.progress=false", "hydra/launcher=local_submitit", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    df = analysis.load_sweep(tmp_path)
    assert sorted(df["policy.name"]) == ["mc_benchmark", "mcsf"]


@pytest.mark.parametrize("launcher", ["joblib", "kvstudy"])
def test_no_state_leaks_between_jobs_of_one_worker(tmp_path, launcher):
    """One worker runs seed 1 then seed 0; seed 0 must equal a run in a fresh process (joblib and kvstudy launchers)."""
    sweep = kvstudy("-m", *BASE, "workload.num_requests=300", "seed=1,0", f"hydra/launcher={launcher}",
                    "hydra.launcher.n_jobs=1", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert sweep.returncode == 0, sweep.stderr[-2000:]
    alone = kvstudy(*BASE, "workload.num_requests=300", "seed=0", f"hydra.run.dir={tmp_path / 'alone'}")
    assert alone.returncode == 0, alone.stderr[-2000:]
    in_sweep = next(p for p in (tmp_path / "sweep").iterdir() if "seed=0," in p.name)
    a = pd.read_parquet(in_sweep / "requests.parquet")
    b = pd.read_parquet(tmp_path / "alone" / "requests.parquet")
    assert a.equals(b)


def test_kvstudy_launcher_gives_the_same_folders_configs_and_results_as_hydras(tmp_path):
    """The default launcher (one composition per group choice, many runs per worker) against Hydra's basic
    launcher (one full composition and run_job per run), on a small Table 1 with a group sweep and a plain one."""
    args = ["+experiment=table1", "seed=0,1", "workload.num_requests=60", "latency=linear",
            "+algo=mcsf,a020_b010,mc_benchmark", "hardware=a100_tp2,a100_vidur_default"]
    ours = kvstudy(*args, f"hydra.sweep.dir={tmp_path / 'ours'}/${{hardware.name}}")
    theirs = kvstudy(*args, "hydra/launcher=basic", f"hydra.sweep.dir={tmp_path / 'theirs'}/${{hardware.name}}")
    assert ours.returncode == 0 and theirs.returncode == 0, (ours.stderr[-2000:], theirs.stderr[-2000:])
    mine = sorted(p.parent.relative_to(tmp_path / "ours") for p in (tmp_path / "ours").rglob("summary.json"))
    hydra = sorted(p.parent.relative_to(tmp_path / "theirs") for p in (tmp_path / "theirs").rglob("summary.json"))
    assert mine == hydra and len(mine) == 12
    for rel in mine:
        a, b = tmp_path / "ours" / rel, tmp_path / "theirs" / rel
        assert (a / "resolved_config.yaml").read_text() == (b / "resolved_config.yaml").read_text()
        assert pd.read_parquet(a / "requests.parquet").equals(pd.read_parquet(b / "requests.parquet"))
    again = kvstudy(*args, f"hydra.sweep.dir={tmp_path / 'theirs'}/${{hardware.name}}")  # resume Hydra's folders
    assert again.returncode == 0 and again.stdout.count("complete already, skipped") == 12, again.stdout[-2000:]
