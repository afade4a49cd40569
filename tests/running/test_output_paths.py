"""Issue 46, "mechanisms, not cases": output paths and results that are never lost.

1. One place prepares every output path (kvstudy/running/paths.py's ``prepare_dir`` and ``prepare_file``): a run
   folder, a sweep folder, the predictor cache and every command's ``--out`` / ``out=``. Every file-system mistake
   is one line ``error: <path>: <what is wrong>; <what to do>``, status 2, before any work.
2. A finished run's files (tables, summary.json, resolved_config.yaml, Hydra's ``.hydra/`` record) are replaced only
   by a run that finished: ``write_run`` stages a run's files and renames them into place together, an interrupted
   re-run writes nothing, and Hydra's record is put back when a run leaves the results as they were
   (kvstudy/running/sweep_callback.py).
"""
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from kvstudy import api
from kvstudy.errors import ConfigError
from kvstudy.running import paths, provenance
from kvstudy.running.paths import REPO_ROOT, prepare_dir, prepare_file

FAST = ["latency=linear", "workload.num_requests=30", "engine.progress=false"]
RUN = ["+policy=mcsf", "+demand=high", *FAST]
RESULTS = ("requests.parquet", "iterations.parquet", "summary.json", "resolved_config.yaml")


def cli(module, *args, cwd=REPO_ROOT, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def one_line(status, err, expected):
    """Status 2 and exactly one line on stderr, ``error: <expected>...`` (no traceback)."""
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith(f"error: {expected}"), err


def must_not_run(*args, **kwargs):
    raise AssertionError("work started before the output path was checked")


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "f"
    path.write_text("x")
    return path


@pytest.fixture
def read_only(tmp_path, monkeypatch):
    """A folder this process cannot write. Root writes a chmod'ed folder anyway (CI runs as root): there the folder
    is reported unwritable as a non-root user's would be, by ``os.access`` as kvstudy/running/paths.py asks it."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):
        real = os.access

        def access(path, mode, *args, **kw):
            inside = Path(path) == folder or folder in Path(path).parents
            return False if inside and mode & os.W_OK else real(path, mode, *args, **kw)

        monkeypatch.setattr(paths.os, "access", access)
    yield folder
    folder.chmod(0o755)


# 1. the helper --------------------------------------------------------------------------------------------------------
def test_prepare_dir_names_each_mistake_in_one_line(tmp_path, a_file):
    with pytest.raises(ConfigError, match=re.escape(f"out={a_file}: is a file, not a folder; choose another folder")):
        prepare_dir(a_file, "out")
    with pytest.raises(ConfigError, match=re.escape(f"--out {a_file / 'x' / 'y'}: lies under {a_file}, a file, not "
                                                    f"a folder; choose another folder")):
        prepare_dir(a_file / "x" / "y", "--out")
    with pytest.raises(ConfigError, match=re.escape(f"{a_file}: is a file, not a folder; pick one")):
        prepare_dir(a_file, fix="pick one", create=False)
    assert prepare_dir(tmp_path / "a" / "b", "out").is_dir()
    assert not prepare_dir(tmp_path / "c", create=False).exists()  # only checked


def test_prepare_file_names_each_mistake_in_one_line(tmp_path, a_file):
    with pytest.raises(ConfigError, match=re.escape(f"--out {tmp_path}: a directory; choose another file")):
        prepare_file(tmp_path, "--out")
    with pytest.raises(ConfigError, match=re.escape(f"--out {a_file}: exists; add --resume")):
        prepare_file(a_file, "--out", overwrite=False, exists_fix="add --resume")
    assert prepare_file(a_file, "--out") == a_file  # a file the command may overwrite
    with pytest.raises(ConfigError, match=re.escape(f"out={a_file / 's.json'}: lies under {a_file}, a file, not a "
                                                    f"folder")):
        prepare_file(a_file / "s.json", "out")
    prepare_file(tmp_path / "new" / "s.parquet")
    assert (tmp_path / "new").is_dir() and not (tmp_path / "new" / "s.parquet").exists()


def test_folders_that_cannot_be_written(read_only):
    with pytest.raises(ConfigError, match=re.escape(f"hydra.run.dir={read_only / 'r'}: cannot be created: {read_only} "
                                                    f"is not writable")):
        prepare_dir(read_only / "r", "hydra.run.dir", create=False)
    with pytest.raises(ConfigError, match=re.escape(f"out={read_only}: not writable")):
        prepare_dir(read_only, "out")
    with pytest.raises(ConfigError, match="is not writable"):
        prepare_file(read_only / "s.parquet", "--out")


def test_the_predictor_cache(tmp_path, a_file, monkeypatch):
    monkeypatch.setenv("KVSTUDY_CACHE_DIR", str(a_file))
    with pytest.raises(ConfigError, match=re.escape(f"KVSTUDY_CACHE_DIR={a_file}: is a file, not a folder; set "
                                                    f"KVSTUDY_CACHE_DIR to a folder kvstudy can write")):
        paths.cache_dir()
    monkeypatch.setenv("KVSTUDY_CACHE_DIR", str(a_file / "sub"))
    with pytest.raises(ConfigError, match=re.escape(f"lies under {a_file}, a file")):
        paths.cache_dir()
    monkeypatch.setenv("KVSTUDY_CACHE_DIR", str(tmp_path / "cache"))
    assert paths.cache_dir() == tmp_path / "cache" and not (tmp_path / "cache").exists()


def test_a_read_only_cache_is_refused_only_for_training(read_only, monkeypatch):
    monkeypatch.setenv("KVSTUDY_CACHE_DIR", str(read_only))
    assert paths.cache_dir() == read_only  # tables already there can be read
    with pytest.raises(ConfigError, match=re.escape(f"KVSTUDY_CACHE_DIR={read_only}: cannot be created")):
        paths.prepare_cache(read_only / "vidur" / "key")


# 1. every command ----------------------------------------------------------------------------------------------------
def test_kvstudy_run_folder_before_hydra_makes_it(tmp_path, a_file):
    proc = cli("kvstudy", *RUN, f"hydra.run.dir={a_file / 'r'}")
    one_line(proc.returncode, proc.stderr, f"hydra.run.dir={a_file / 'r'}: lies under {a_file}, a file, not a folder; "
                                           f"choose another folder")
    (tmp_path / "outputs").write_text("")  # the default folder, outputs/runs/..., where ./outputs is a file
    proc = cli("kvstudy", *RUN, cwd=tmp_path)
    one_line(proc.returncode, proc.stderr, "hydra.run.dir=outputs/runs/mcsf/high/seed0-")
    assert ": lies under outputs, a file, not a folder; choose another folder" in proc.stderr


def test_kvstudy_sweep_folder_before_hydra_makes_it(a_file):
    proc = cli("kvstudy", "-m", *RUN, "seed=0,1", f"hydra.sweep.dir={a_file / 's'}")
    one_line(proc.returncode, proc.stderr, f"hydra.sweep.dir={a_file / 's'}: lies under {a_file}, a file, not a folder")


def test_kvstudy_run_folder_that_cannot_be_written(read_only):
    if os.geteuid() == 0:  # the command is a child process, which the fixture's stand-in for os.access cannot reach
        pytest.skip("running as root: a chmod'ed folder stays writable for the command (tested in-process above)")
    proc = cli("kvstudy", *RUN, f"hydra.run.dir={read_only / 'r'}")
    one_line(proc.returncode, proc.stderr, f"hydra.run.dir={read_only / 'r'}: cannot be created: {read_only} is not "
                                           f"writable")


def test_kvstudy_cache_that_is_a_file_before_any_training(tmp_path, a_file):
    env = {**os.environ, "KVSTUDY_CACHE_DIR": str(a_file)}
    proc = cli("kvstudy", "+policy=mcsf", "+demand=high", "workload.num_requests=30", "engine.progress=false",
               f"hydra.run.dir={tmp_path / 'r'}", env=env)
    one_line(proc.returncode, proc.stderr, f"KVSTUDY_CACHE_DIR={a_file}: is a file, not a folder")
    assert not (tmp_path / "r" / "summary.json").exists()


def test_optimum_study_out(tmp_path, a_file, monkeypatch, capsys):
    from kvstudy.optimum import __main__ as optimum

    monkeypatch.setattr(optimum, "study", must_not_run)
    args = ["study", "--model", "1", "--trials", "1", "--time-limit", "0", "--out"]
    one_line(optimum.main([*args, str(a_file / "s.parquet")]), capsys.readouterr().err,
             f"--out {a_file / 's.parquet'}: lies under {a_file}, a file, not a folder; choose another file")
    one_line(optimum.main([*args, str(tmp_path)]), capsys.readouterr().err,
             f"--out {tmp_path}: a directory; allowed a .parquet file path (e.g. {tmp_path / 'study.parquet'})")
    one_line(optimum.main([*args, str(a_file)]), capsys.readouterr().err,
             f"--out {a_file}: exists; add --resume to keep its trials")
    assert a_file.read_text() == "x"


def test_profiles_out(tmp_path, a_file, monkeypatch, capsys):
    from kvstudy.profiles import __main__ as profiles

    one_line(profiles.main(["build", "--out", str(a_file)]), capsys.readouterr().err,
             f"--out {a_file}: is a file, not a folder; allowed: a folder for compute/ and network/")
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "network").write_text("")
    one_line(profiles.main(["build", "--out", str(tmp_path / "p")]), capsys.readouterr().err,
             f"--out {tmp_path / 'p' / 'network'}: is a file, not a folder")
    one_line(profiles.main(["calibrate", "--vidur-data", str(tmp_path), "--out", str(tmp_path)]),
             capsys.readouterr().err, f"--out {tmp_path}: a directory; allowed: a .json file path")
    one_line(profiles.main(["calibrate", "--vidur-data", str(tmp_path), "--out", str(a_file / "c.json")]),
             capsys.readouterr().err, f"--out {a_file / 'c.json'}: lies under {a_file}, a file, not a folder")


def test_studies_out_before_the_scan(tmp_path, a_file, monkeypatch, capsys):
    from kvstudy import studies

    monkeypatch.setattr(studies, "alpha_search", must_not_run)
    one_line(studies.main(["alpha-search", "+demand=high", *FAST, f"out={a_file}"]), capsys.readouterr().err,
             f"out={a_file}: is a file, not a folder; choose another folder (out=DIR)")
    (tmp_path / "s" / "high.json").mkdir(parents=True)
    one_line(studies.main(["alpha-search", "+demand=high", *FAST, f"out={tmp_path / 's'}"]), capsys.readouterr().err,
             f"{tmp_path / 's' / 'high.json'}: a directory")


def test_preemption_cost_out_before_the_predictor(tmp_path, a_file, monkeypatch, capsys):
    from kvstudy import preemption_cost

    monkeypatch.setattr(api, "model_setup", must_not_run)
    args = ["model=opt_13b", "hardware=a100_tp1"]
    one_line(preemption_cost.main([*args, f"out={a_file / 'pc'}"]), capsys.readouterr().err,
             f"out={a_file / 'pc'}: lies under {a_file}, a file, not a folder; choose another folder (out=DIR)")
    (tmp_path / "pc" / "opt_13b_a100_tp1_pcie.png").mkdir(parents=True)
    one_line(preemption_cost.main([*args, f"out={tmp_path / 'pc'}"]), capsys.readouterr().err,
             f"{tmp_path / 'pc' / 'opt_13b_a100_tp1_pcie.png'}: a directory")


def test_reproduce_outputs(tmp_path, monkeypatch, capsys):
    from kvstudy import reproduce

    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").write_text("")
    one_line(reproduce.main(["mcsf", "--dry-run"]), capsys.readouterr().err,
             "outputs: is a file, not a folder; run it from a folder where it can write outputs/")


# 2. results replaced only by a finished run ------------------------------------------------------------------------------
def _files(folder):
    return {name: (folder / name).read_bytes() for name in RESULTS}


@pytest.fixture
def stop_after(monkeypatch):
    """Ctrl-C after this many iterations (``stop_after["n"]``; None: never), raised where the engine times one."""
    from kvstudy.latency.models import LinearLatency

    state = {"n": None, "calls": 0}
    real = LinearLatency.iteration_seconds

    def iteration_seconds(self, *args, **kwargs):
        state["calls"] += 1
        if state["n"] is not None and state["calls"] > state["n"]:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(LinearLatency, "iteration_seconds", iteration_seconds)
    return state


def test_an_interrupted_rerun_leaves_the_finished_run_as_it_was(tmp_path, monkeypatch, stop_after):
    cfg, out = api.compose(RUN), tmp_path / "r"
    first = api.run(cfg, out)
    finished = _files(out)
    monkeypatch.setattr(provenance, "code_digest", lambda: "0" * 64)  # the code was edited: resume=code runs it again
    stop_after.update(n=5, calls=0)
    with pytest.warns(UserWarning, match="made by other code"):
        again = api.run(cfg, out)
    assert again["status"] == "interrupted" and again["kept"]
    assert f"{out} keeps its finished run (status completed)" in again["message"]
    assert _files(out) == finished and not list(out.glob(".incoming-*"))
    stop_after["n"] = None  # the re-run that finishes replaces it
    with pytest.warns(UserWarning, match="made by other code"):
        done = api.run(cfg, out)
    assert done["status"] == "completed" and "kept" not in done
    stored = json.loads((out / "summary.json").read_text())["provenance"]["fingerprint"]
    assert stored == done["provenance"]["fingerprint"] != first["provenance"]["fingerprint"]


def test_a_first_run_that_is_interrupted_writes_what_it_finished(tmp_path, stop_after):
    stop_after.update(n=5, calls=0)
    summary = api.run(api.compose(RUN), tmp_path / "r")
    assert summary["status"] == "interrupted" and "kept" not in summary
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["status"] == "interrupted"
    assert len(pd.read_parquet(tmp_path / "r" / "requests.parquet")) == 30


def test_a_rerun_that_fails_while_writing_leaves_the_finished_run_as_it_was(tmp_path, monkeypatch):
    cfg, out = api.compose(RUN), tmp_path / "r"
    api.run(cfg, out)
    finished = _files(out)
    real = pd.DataFrame.to_parquet

    def disk_full(self, path, *args, **kwargs):
        if "iterations" in str(path):
            raise OSError(28, "No space left on device")
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", disk_full)
    from kvstudy.errors import ResourceError

    with pytest.raises(ResourceError, match=f"^{out}: no space left on the device; free space there"):  # one line
        api.run(cfg, out, resume=False)
    assert _files(out) == finished and not list(out.glob(".incoming-*"))


STOP_POLICY = """
import os

from kvstudy.policies.mcsf import MCSF


class Stop(MCSF):
    name = "stop"

    def schedule(self, view):
        if os.environ.get("KVSTUDY_TEST_STOP"):
            raise KeyboardInterrupt  # as Ctrl-C in the middle of the run
        return super().schedule(view)
"""


@pytest.mark.slow
def test_the_command_keeps_a_finished_run_and_hydras_record_of_it(tmp_path):
    """``python -m kvstudy`` into a folder holding a finished run: refused (another config), skipped, and a re-run
    after a code edit that is interrupted leave its files and its ``.hydra/`` as they were; one that finishes
    replaces both."""
    (tmp_path / "stop_policy.py").write_text(textwrap.dedent(STOP_POLICY))
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "stop.yaml").write_text("_target_: stop_policy.Stop\nname: stop\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = tmp_path / "r"
    args = [f"hydra.searchpath=[file://{tmp_path}]", "+policy=stop", "+demand=high", *FAST, f"hydra.run.dir={out}"]

    def files():
        return {**_files(out), **{f".hydra/{p.name}": p.read_bytes() for p in (out / ".hydra").iterdir()}}

    proc = cli("kvstudy", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    finished = files()
    assert {".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml"} <= set(finished)

    proc = cli("kvstudy", *args, "seed=1", env=env)
    one_line(proc.returncode, proc.stderr, f"{out} already holds a finished run of a different config (seed: 0 there, "
                                           f"1 here)")
    assert files() == finished

    proc = cli("kvstudy", *args, "resume=config", env=env)
    assert proc.returncode == 0 and "complete already, skipped" in proc.stdout, proc.stderr
    assert files() == finished

    module = tmp_path / "stop_policy.py"
    module.write_text(module.read_text() + "\nEDITED = True\n")  # the policy's code changed: resume=code runs again
    proc = cli("kvstudy", *args, "resume=code", env={**env, "KVSTUDY_TEST_STOP": "1"})
    assert proc.returncode == 130, proc.stderr
    assert "made by other code" in proc.stderr and "keeps its finished run (status completed)" in proc.stdout
    assert files() == finished and not list(out.glob(".incoming-*"))

    proc = cli("kvstudy", *args, "resume=code", env=env)
    assert proc.returncode == 0, proc.stderr
    now = files()
    assert now["summary.json"] != finished["summary.json"] and "resume=code" in now[".hydra/overrides.yaml"].decode()
