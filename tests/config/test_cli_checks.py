"""Issue 46: kvstudy answers before Hydra does, and sweeps say what happened. The real command line, one subprocess
per case: every override key checked against the options the command line chooses (``+`` and ``++`` included),
the launcher's settings, Hydra's flags anywhere on the line, a sweep's lines and its summary, ``kvstudy.reproduce``'s
overrides and failures."""
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from kvstudy.running.paths import REPO_ROOT

FAST = ["latency=linear", "workload.num_requests=20", "engine.progress=false"]


def cli(*args, module="kvstudy", env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def one_error(proc) -> str:
    """The one ``error:`` line of a refused command (status 2, nothing else on stderr, no traceback)."""
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    return lines[0]


# 1. every key against the chosen options -----------------------------------------------------------------------------
@pytest.mark.parametrize("args,line", [
    (["+policy=mcsf", "memory.decode_block_check=vllm"],
     "error: memory.decode_block_check: not a setting of memory 'paper'; it takes capacity_tokens, "
     "gpu_memory_utilization, non_torch_gib (memory 'paged', 'paged_offload' or 'paged_prefix' has it)"),
    (["+policy=mcsf", "memory=paper", "++memory.decode_block_check=vllm"],
     "error: memory.decode_block_check: not a setting of memory 'paper'; it takes capacity_tokens, "
     "gpu_memory_utilization, non_torch_gib (memory 'paged', 'paged_offload' or 'paged_prefix' has it)"),
    (["+policy=vllm", "policy.chunk_size=8"],
     "error: policy.chunk_size: not a setting of policy 'vllm'; it takes preemption_mode, max_num_seqs, "
     "max_num_batched_tokens, running_order, waiting_order (policy 'sarathi' or 'sarathi_lpm' has it)"),
    (["+policy=sarathi", "+policy.chunksize=8"],
     "error: policy.chunksize: not a setting of policy 'sarathi'; it takes chunk_size, preemption_mode, max_num_seqs, "
     "running_order, waiting_order"),
    (["+policy=mcsf", "+engine.stal_limit=3"],
     "error: engine.stal_limit: not a setting of engine; it takes stall_limit, overflow_cost, arrivals, max_batch, "
     "raise_prediction_on_eviction, max_iterations, accept_rejections, progress"),
    (["+policy=mcsf", "+policy.margin=0.1"],
     "error: +policy.margin=0.1: policy.margin exists already; allowed: policy.margin=0.1 (to set it), or "
     "++policy.margin=0.1"),
    (["+policy=mcsf", "seed=0,1"],
     "error: seed=0,1: several values without -m; allowed: -m to run one job per value, seed=[a,b] for a list, or "
     "seed='a,b' for text"),
])
def test_a_key_the_chosen_option_lacks_is_one_line(args, line, tmp_path):
    proc = cli(*args, "+demand=high", *FAST, f"hydra.run.dir={tmp_path}")
    assert one_error(proc) == line
    assert not list(tmp_path.iterdir())  # said before anything ran


def test_an_unknown_top_level_key_says_what_exists(tmp_path):
    line = one_error(cli("+policy=mcsf", "+demand=high", "+foo=1", *FAST, f"hydra.run.dir={tmp_path}"))
    assert line.startswith("error: foo: no such setting; the top-level settings are cluster.*, engine.*, record.*, "
                           "resume, seed, systems.*, and each config group's")
    assert "memory, model" in line and "GROUP.KEY=VALUE" in line


def test_a_sweep_over_policies_checks_keys_against_the_swept_policies(tmp_path):
    line = one_error(cli("-m", "+policy=vllm,rr", "+demand=high", "policy.chunk_size=8", *FAST,
                         f"hydra.sweep.dir={tmp_path}"))
    assert line.startswith("error: policy.chunk_size: not a setting of any policy of this sweep (rr, vllm); "
                           "they take ")
    line = one_error(cli("-m", "+policy=vllm,rr", "+demand=high", "policy.chunksize=8", *FAST,
                         f"hydra.sweep.dir={tmp_path}"))
    assert line.startswith("error: unknown key policy.chunksize; keys of policy: ")
    # the README's use: runs whose policy has the key get it; the summary line counts the runs
    proc = cli("-m", "+policy=vllm,sarathi", "+demand=high", "policy.chunk_size=64", *FAST,
               "hydra.launcher.n_jobs=1", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "policy.chunk_size applies to sarathi; vllm: no such setting, run without it" in proc.stdout
    assert re.search(rf"^sweep done: 2 runs, 2 completed, 0 skipped \(already finished\), 0 failed \(error.txt in "
                     rf"each\), in [0-9.]+ s: {re.escape(str(tmp_path))}$", proc.stdout, re.M), proc.stdout


def test_a_key_only_other_options_of_a_swept_group_have(tmp_path):
    """Hydra composes a multirun's first config without the sweep's choices: memory=paper there."""
    line = one_error(cli("-m", "+policy=vllm,sarathi", "+demand=high", "memory.block_size=32", *FAST,
                         f"hydra.sweep.dir={tmp_path}"))
    assert line.startswith("error: memory.block_size=32: not a setting of memory 'paper', the memory of the sweep's "
                           "first composition (memory 'paged' has it, chosen per run); allowed: "
                           "++memory.block_size=32")
    proc = cli("-m", "+policy=vllm,sarathi", "+demand=high", "++memory.block_size=32", *FAST,
               "hydra.launcher.n_jobs=1", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    blocks = {json.loads((p.parent / "summary.json").read_text())["memory"]["block_size"]
              for p in tmp_path.rglob("resolved_config.yaml")}
    assert blocks == {32}


MINE = textwrap.dedent("""
    from kvstudy.policies.mcsf import MCSF


    class Mine(MCSF):
        def __init__(self, window: int = 0):
            super().__init__()
            self.window = window
""")


def test_a_parameter_the_yaml_lacks_is_added_with_plus(tmp_path):
    """docs/policies.md: a parameter ``__init__`` takes that the YAML lacks is added with ``+policy.K=V``; a misspelt
    one is refused, naming what the policy takes (its own ``_target_``'s parameters)."""
    (tmp_path / "my_policy.py").write_text(MINE)
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "mine.yaml").write_text("_target_: my_policy.Mine\nname: mine\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    base = [f"hydra.searchpath=[file://{tmp_path}]", "+policy=mine", "+demand=high", *FAST]
    proc = cli(*base, "+policy.window=3", f"hydra.run.dir={tmp_path / 'r'}", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "window: 3" in (tmp_path / "r" / "resolved_config.yaml").read_text()
    line = one_error(cli(*base, "+policy.windw=3", f"hydra.run.dir={tmp_path / 'x'}", env=env))
    assert line == "error: policy.windw: not a setting of policy 'mine'; it takes window"
    line = one_error(cli(*base, "policy.window=3", f"hydra.run.dir={tmp_path / 'x'}", env=env))
    assert line == ("error: policy.window=3: policy 'mine' has no window in its config; allowed: +policy.window=3 "
                    "(to add it: its _target_ takes it)")


def test_legitimate_additions_still_run(tmp_path):
    proc = cli("+policy=vllm", "+demand=high", "++memory.block_size=32", "++seed=1", *FAST,
               f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["memory"]["block_size"] == 32


# 2. the launcher's values ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value,line", [
    ("0", "error: hydra.launcher.n_jobs=0: allowed a whole number >= 1, or null (one worker process per core)"),
    ("-1", "error: hydra.launcher.n_jobs=-1: allowed a whole number >= 1, or null (one worker process per core)"),
    ("abc", "error: hydra.launcher.n_jobs='abc': allowed a whole number >= 1, or null (one worker process per core)"),
    ("2.5", "error: hydra.launcher.n_jobs=2.5: allowed a whole number >= 1, or null (one worker process per core)"),
])
def test_n_jobs_below_one_or_not_a_number_is_refused(value, line, tmp_path):
    proc = cli("-m", "+policy=mcsf", "+demand=high", "seed=0,1", *FAST, f"hydra.launcher.n_jobs={value}",
               f"hydra.sweep.dir={tmp_path}")
    assert one_error(proc) == line
    assert not list(tmp_path.rglob("summary.json"))


def test_slurm_off_a_cluster_is_one_line(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if not os.path.exists(os.path.join(p, "sbatch")))
    proc = cli("-m", "+policy=mcsf", "+demand=high", "seed=0,1", *FAST, "hydra/launcher=slurm",
               f"hydra.sweep.dir={tmp_path}", env={**os.environ, "PATH": path})
    assert one_error(proc) == ("error: hydra/launcher=slurm: SLURM was not found (no sbatch on the PATH); on a "
                               "machine without SLURM use hydra/launcher=kvstudy (the default: worker processes here) "
                               "or hydra/launcher=local_submitit")


def test_the_slurm_launcher_itself_says_slurm_is_missing(monkeypatch, capsys):
    """The same line from the launcher (a config choosing it where the command line's check does not look)."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    import shutil

    from hydra_plugins.kvstudy_sweeps.submitit_launchers import KvstudySlurmLauncher

    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SystemExit) as info:
        KvstudySlurmLauncher(submitit_folder="x").launch([["seed=0"]], 0)
    assert info.value.code == 2
    assert capsys.readouterr().err.startswith("error: hydra/launcher=slurm: SLURM was not found")


# 3. Hydra's flags: anywhere on the line, and their rules in one line ---------------------------------------------------
def test_cfg_job_before_the_overrides_works_as_after_them():
    before = cli("--cfg", "job", "+policy=mcsf", "+demand=high")
    after = cli("+policy=mcsf", "+demand=high", "--cfg", "job")
    assert before.returncode == 0 and after.returncode == 0, (before.stderr[-2000:], after.stderr[-2000:])
    assert before.stdout == after.stdout and "name: mcsf" in before.stdout


@pytest.mark.parametrize("args,line", [
    (["-m", "--cfg", "job"], "error: -m and --cfg together: allowed one of --run, -m (--multirun), --cfg, --info, "
                             "--shell-completion at a time (--cfg job prints the config a run would use)"),
    (["--resolve"], "error: --resolve: allowed only with --cfg (it resolves the interpolations of the config --cfg "
                    "prints)"),
    (["--cfg", "jobs"], "error: --cfg 'jobs': allowed job, hydra, all (see python -m kvstudy --help)"),
    (["--package", "policy"], "error: --package policy: allowed only with --cfg (the part of the config --cfg "
                              "prints)"),
])
def test_flags_hydra_would_refuse_with_a_traceback_are_one_line(args, line):
    assert one_error(cli("+policy=mcsf", "+demand=high", *args)) == line


# 4. a sweep's output --------------------------------------------------------------------------------------------------
def test_a_sweep_prints_one_line_per_run_and_a_summary(tmp_path):
    args = ["-m", "+policy=mcsf", "+demand=high", "latency=linear", "workload.num_requests=20", "engine.progress=true",
            "memory.capacity_tokens=16492,-1,8000", f"hydra.sweep.dir={tmp_path}"]
    proc = cli(*args)
    assert proc.returncode == 2, proc.stderr[-3000:]
    runs = [ln for ln in proc.stdout.splitlines() if ln.startswith("#")]
    assert len(runs) == 3 and sum(": completed, 20/20 requests" in ln for ln in runs) == 2
    assert sum(": error: memory.capacity_tokens=-1" in ln for ln in runs) == 1
    assert re.search(r"^sweep done: 3 runs, 2 completed, 0 skipped \(already finished\), 1 failed \(error.txt in "
                     r"each\), in [0-9.]+ s: ", proc.stdout, re.M), proc.stdout
    assert "req/s" not in proc.stderr and "it/s" not in proc.stderr  # no worker's progress bar
    again = cli(*args)
    assert re.search(r"^sweep done: 3 runs, 0 completed, 2 skipped \(already finished\), 1 failed", again.stdout, re.M)


def test_local_submitit_says_each_run_and_the_summary(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    proc = cli("-m", "+policy=mcsf,mc_benchmark", "+demand=high", *FAST, "hydra/launcher=local_submitit",
               f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [ln for ln in proc.stdout.splitlines() if ln.startswith("#")]
    assert len(runs) == 2 and all(": completed, 20/20 requests" in ln for ln in runs), proc.stdout
    assert re.search(rf"^sweep done: 2 runs, 2 completed, 0 skipped \(already finished\), 0 failed \(error.txt in "
                     rf"each\), in [0-9.]+ s: {re.escape(str(tmp_path))}$", proc.stdout, re.M), proc.stdout


# 1. kvstudy.reproduce: its overrides checked as kvstudy's, a failure's reason on the terminal --------------------------
@pytest.mark.parametrize("dry", [["--dry-run"], []])
def test_reproduce_checks_its_overrides_before_anything_runs(dry, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kvstudy.reproduce", "rr_sjf", *dry, "--", "policy.chunk_size=8"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    line = one_error(proc)
    assert line.startswith("error: policy.chunk_size: not a setting of any policy of this sweep (fcfs, rr, rr_sjf, "
                           "sjf); they take ")
    assert "(-- policy.chunk_size=8, in experiment 1/" in line and proc.stdout == ""
    assert not (tmp_path / "outputs" / "reproduce").exists()


def test_a_failed_experiment_gives_its_reason_on_the_terminal(monkeypatch, tmp_path):
    from kvstudy import reproduce
    from kvstudy.reproduce import PAPERS, Paper, Step

    monkeypatch.chdir(tmp_path)
    bad = Step("kvstudy", ("+experiment=no_such_experiment",), "nothing", 1)
    monkeypatch.setitem(PAPERS, "tiny", Paper("a tiny paper", (bad,), ()))
    error = reproduce.run_steps("tiny", tmp_path / "outputs", None, [])
    assert error.startswith("experiment 1/1 of tiny (nothing) failed with status 2: unknown experiment "
                            "'no_such_experiment'; allowed: ")
    assert "; command: python -m kvstudy +experiment=no_such_experiment (log: " in error
