"""Issue 54's held-out campaign, the kinds about files, state and interruption (mechanisms, not cases):

* a lock on a run folder (kvstudy/running/folder_lock.py): two commands writing one folder at once;
* hit rates per lookup (kvstudy/memory/offload.py): an offload tier's hit rate above 1 under preemption;
* every cached input file checked (kvstudy/profiles/generated.py's manifest): a truncated profile CSV in the cache;
* a full disk, a name too long and Ctrl-C in every long phase answered in one line (kvstudy/errors.py).
"""
import errno
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from kvstudy.errors import ConfigError, KvStudyError


# --- hit rates per lookup ---------------------------------------------------------------------------------------------
def test_a_tiers_hit_rate_counts_hits_and_lookups_at_the_same_lookups_by_hand():
    """One host tier holding three blocks of 16 tokens. A request looks up 64 tokens and loads the three (48 tokens);
    preempted, it restarts and looks up its 66 tokens of context, loading the three again: 96 tokens loaded over
    64 + 66 = 130 looked up, 0.738. Counted against its prompt once (the old rule) it was 96 / 64 = 1.5."""
    from kvstudy.memory.offload import OffloadTiers, OffloadConnector, Tier

    view = OffloadConnector(OffloadTiers([Tier("host", 1.0, 31.5, 31.5)], choice="load"))
    view.bind(16, 1000)
    keys = [(1 << 32) + 16 * (j + 1) for j in range(3)]  # three blocks of one chain, as the cache keys them
    view.save(keys[::-1])
    for tokens in (64, 66):
        view.looked_up(tokens)
        assert view.plan(keys, 0, (tokens - 1) // 16, tokens) == 3
        view.load(0, keys, 0, 3)
    summary = view.summary()
    assert (summary["lookups"], summary["lookup_tokens"]) == (2, 130)
    assert summary["tiers"]["host"]["read_blocks"] == 6
    assert summary["tiers"]["host"]["hit_rate"] == pytest.approx(96 / 130)


def test_tier_and_gpu_hit_rates_stay_in_0_1_under_preemption():
    """rr_sjf on a 2,048-token GPU with an unlimited host tier: thousands of preemptions, each restart reloading its
    prefix. Every hit rate lies in [0, 1] (the tiers' together too) and is its hits over its lookups; the instance
    is one where counting reloads against each prompt once exceeds 1."""
    from kvstudy import api

    cfg = api.compose(["+policy=rr_sjf", "memory=paged_offload", "workload=shared_prompt", "+demand=high",
                       "latency=linear", "workload.num_requests=200", "memory.capacity_tokens=2048",
                       "memory.offload.host_gb=1e9", "memory.offload.choice=load", "engine.progress=false"])
    result, summary = api.simulate(cfg)
    req = result.requests
    assert summary["preemptions"] > 1000
    offload, bs = summary["offload"], summary["memory"]["block_size"]
    host = offload["tiers"]["host"]
    started = req["first_scheduled_time"].notna()
    assert host["read_blocks"] * bs / req.loc[started, "prompt_tokens"].sum() > 1  # the old rule's number
    assert offload["lookups"] > started.sum()  # restarts are lookups too
    assert host["hit_rate"] == pytest.approx(host["read_blocks"] * bs / offload["lookup_tokens"])
    assert 0 < sum(t["hit_rate"] for t in offload["tiers"].values()) <= 1
    assert host["read_blocks"] * bs == offload["loaded_tokens"] == req["offload_loaded_tokens"].sum()
    # the GPU's: first prefills' hits over first prefills' prompts
    cache = summary["prefix_cache"]
    assert 0 <= summary["prefix_hit_rate"] <= 1
    assert cache["cached_prompt_tokens"] == req.loc[started, "prefix_cached_tokens"].sum()
    assert cache["prompt_tokens"] == req.loc[started, "prompt_tokens"].sum()
    assert (req["prefix_cached_tokens"] < req["prompt_tokens"]).all()


# --- a lock on a run folder -------------------------------------------------------------------------------------------
RUN = ["+policy=vllm", "+demand=high", "latency=linear", "workload.num_requests=20", "engine.progress=false"]
HOLD = """
import sys, time
from kvstudy.running import folder_lock
folder_lock.acquire(sys.argv[1])
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _hold(folder, seconds=60):
    """Another process holding ``folder``'s lock (as a run writing it does) until killed or ``seconds`` pass."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_run_into_a_locked_folder_is_refused_and_touches_nothing(tmp_path):
    """api.run (every launcher's runs) into a folder another process writes: FolderBusy naming the folder and the
    process, no error.txt, nothing written; once the holder is gone the same run goes through, leaving no lock file."""
    from kvstudy import api
    from kvstudy.running.folder_lock import LOCK_NAME, FolderBusy
    from kvstudy.running.sweep_callback import run_recording_errors

    folder = tmp_path / "run"
    cfg = api.compose(RUN)
    holder = _hold(folder)
    try:
        with pytest.raises(FolderBusy, match=f"{folder}: process {holder.pid} is writing this run folder now"):
            run_recording_errors(cfg, folder)
        assert sorted(p.name for p in folder.iterdir()) == [LOCK_NAME]
    finally:
        holder.kill()
        holder.wait()
    # a lock file left by a dead process (killed: it could not remove it) is taken over
    assert (folder / LOCK_NAME).read_text().strip() == str(holder.pid)
    summary = api.run(cfg, folder)
    assert summary["status"] == "completed" and not (folder / LOCK_NAME).exists()


def test_the_lock_is_reentrant_in_one_process_and_a_failed_run_leaves_no_folder(tmp_path):
    from kvstudy.running import folder_lock

    folder = tmp_path / "new"
    with folder_lock.locked(folder):
        with folder_lock.locked(folder):  # the command's hold (on_run_start) and api.run's
            assert (folder / folder_lock.LOCK_NAME).read_text().strip() == str(os.getpid())
        assert (folder / folder_lock.LOCK_NAME).exists()
    assert not folder.exists()  # made for the lock, left empty: removed


def test_the_command_line_refuses_a_locked_run_folder_before_hydra_writes_there(tmp_path):
    """`python -m kvstudy` into a folder another process writes: one `error:` line naming the folder and the
    process, status 2, and no Hydra record (.hydra/) or log written into the other run's folder."""
    folder = tmp_path / "run"
    holder = _hold(folder)
    try:
        proc = subprocess.run([sys.executable, "-m", "kvstudy", *RUN, f"hydra.run.dir={folder}"], capture_output=True,
                              text=True, timeout=300)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: {folder}: process {holder.pid} is writing this run folder now (it holds {folder}/.kvstudy.lock); "
        f"wait for it to finish, or choose another run folder (hydra.run.dir)"]
    assert sorted(p.name for p in folder.iterdir()) == [".kvstudy.lock"]


def test_two_commands_into_one_folder_at_once_one_writes_one_is_refused(tmp_path):
    """The campaign's case: two commands of different configs started together into one folder. Exactly one
    completes, and the record Hydra keeps there is its config; the other ends in one line: refused by the lock if
    they overlap (the usual case: each run takes seconds), or by the finished run's config if it came later."""
    folder = tmp_path / "run"
    common = ["+policy=vllm", "+demand=high", "latency=linear", "engine.progress=false", f"hydra.run.dir={folder}"]
    procs = [subprocess.Popen([sys.executable, "-m", "kvstudy", *common, f"workload.num_requests={n}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in (20000, 20001)]
    outs = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    codes = sorted(rc for _, _, rc in outs)
    assert codes == [0, 2], outs
    refused = next(err for _, err, rc in outs if rc == 2)
    assert len(refused.strip().splitlines()) == 1 and refused.startswith("error: ")
    assert "is writing this run folder now" in refused or "already holds a finished run of a different" in refused
    summary = json.loads((folder / "summary.json").read_text())
    record = (folder / ".hydra" / "config.yaml").read_text()
    assert f"num_requests: {summary['num_requests']}" in record  # the record is the run whose tables are there


# --- every cached input file checked ----------------------------------------------------------------------------------
@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("KVSTUDY_CACHE_DIR", str(cache))
    return cache


def test_a_truncated_profile_csv_in_the_cache_is_rebuilt_with_one_warning(empty_cache):
    """H100 profiles of Llama-3.2-1B built into the cache with their manifest; mlp.csv cut short (a full disk, a
    copy stopped): the next use says so in one warning naming the file and rebuilds it, byte for byte the first
    build's. A cut manifest is caught the same way; a folder without one (an older kvstudy's) is rebuilt quietly."""
    from kvstudy.profiles import generated
    from kvstudy.running.paths import load_model_arch

    arch = load_model_arch("llama32_1b")
    folder = generated.compute_dir(arch, "h100")
    manifest = json.loads((folder / generated.MANIFEST).read_text())
    assert set(manifest) == {"mlp.csv", "attention.csv"}
    good = (folder / "mlp.csv").read_bytes()
    assert manifest["mlp.csv"]["bytes"] == len(good)
    (folder / "mlp.csv").write_bytes(good[: len(good) // 2])
    with pytest.warns(UserWarning, match=r"mlp\.csv \(\d+ bytes, \d+ when built\): damaged profile cache; rebuilding"):
        assert generated.compute_dir(arch, "h100") == folder
    assert (folder / "mlp.csv").read_bytes() == good
    # same size, one byte changed
    (folder / "mlp.csv").write_bytes(good[:-2] + (b"7" if good[-2:-1] != b"7" else b"8") + good[-1:])
    with pytest.warns(UserWarning, match="SHA-256 is not the one recorded"):
        generated.compute_dir(arch, "h100")
    assert (folder / "mlp.csv").read_bytes() == good
    (folder / generated.MANIFEST).write_text('{"mlp.csv": ')
    with pytest.warns(UserWarning, match=r"manifest\.json \(JSONDecodeError\): damaged profile cache"):
        generated.compute_dir(arch, "h100")
    assert generated.damaged(folder) is None
    (folder / generated.MANIFEST).unlink()
    (folder / "attention.csv").write_text("x")
    assert generated.damaged(folder) == ""  # nothing to check against: rebuilt
    generated.compute_dir(arch, "h100")
    assert generated.damaged(folder) is None and (folder / "attention.csv").stat().st_size > 1


# --- a full disk, a name too long, Ctrl-C: one line in every long phase -----------------------------------------------
def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/the/disk/file")


def test_a_full_disk_while_writing_a_run_leaves_the_earlier_run_whole(tmp_path, monkeypatch):
    """The first run finishes; a re-run (resume=never) meets a full disk writing its tables: one ResourceError
    naming the path and what to do, the earlier run's files as they were, no staging folder left."""
    import pandas as pd

    from kvstudy import api

    folder = tmp_path / "run"
    cfg = api.compose(RUN)
    api.run(cfg, folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    monkeypatch.setattr(pd.DataFrame, "to_parquet", _full_disk)
    with pytest.raises(KvStudyError, match=r"^/the/disk/file: no space left on the device while preparing|"
                                           r"^/the/disk/file: no space left on the device; free space there, or "
                                           r"choose another run folder"):
        api.run(cfg, folder, resume="never")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_a_summary_json_that_is_a_folder_is_one_line(tmp_path):
    from kvstudy import api

    folder = tmp_path / "run"
    (folder / "summary.json").mkdir(parents=True)
    with pytest.raises(ConfigError, match=f"{folder}/summary.json: a folder, where the run writes its summary.json"):
        api.run(api.compose(RUN), folder)
    with pytest.raises(ConfigError, match="summary.json: a folder, not the run's summary file"):
        api.load_run(folder)


@pytest.mark.parametrize("where", ["cache", "run"])
def test_a_name_too_long_for_the_file_system_is_one_line_before_any_work(tmp_path, monkeypatch, where):
    from kvstudy import api
    from kvstudy.running.paths import cache_dir

    long = tmp_path / ("x" * 300)
    if where == "cache":
        monkeypatch.setenv("KVSTUDY_CACHE_DIR", str(long))
        with pytest.raises(ConfigError, match=r"^KVSTUDY_CACHE_DIR=.*: the name 'xxx.*' is 300 bytes, more than the "
                                              r"255 this file system allows for one name"):
            cache_dir()
    else:
        with pytest.raises(ConfigError, match=r"is 300 bytes, more than the 255 this file system allows"):
            api.run(api.compose(RUN), long / "run")
    assert os.listdir(tmp_path) == []  # nothing made


def _llama1b_h100():
    from kvstudy.latency.tables import HardwareSpec
    from kvstudy.running.paths import load_model_arch

    return load_model_arch("llama32_1b"), HardwareSpec("h100_tp1", "h100", "h100_pairwise_nvlink", 1)


@pytest.mark.parametrize("failure, match", [
    (OSError(errno.ENOSPC, "No space left on device", "/cache/vidur/x/model.pkl"),
     r"^/cache/vidur/x/model\.pkl: no space left on the device while training Vidur's predictor for llama32_1b on "
     r"h100_tp1 into .*; free space there or set KVSTUDY_CACHE_DIR to a folder on another disk, then run again$"),
    (__import__("pickle").UnpicklingError("pickle data was truncated"),
     r"a model Vidur wrote while training could not be read back \(pickle data was truncated\), as when the disk is "
     r"full \([\d,]+ MB free there\)"),
])
def test_a_full_disk_while_training_a_predictor_is_one_line(empty_cache, monkeypatch, failure, match):
    """Vidur's training meets a full disk (an OSError, or the truncated pickle it then reads back): one line naming
    the cache folder, and no tables.npz (nothing half-written is left as valid)."""
    from kvstudy.latency import models, vidur_adapter

    def fail(*args, **kwargs):
        raise failure

    monkeypatch.setattr(vidur_adapter, "make_predictor", fail)
    arch, hw = _llama1b_h100()
    with pytest.raises(KvStudyError, match=match):
        models.vidur(arch, hw, capacity_tokens=4096)
    assert not list(empty_cache.rglob("tables.npz")) and not list(empty_cache.rglob("vidur-build-*"))


def test_a_full_disk_while_building_profiles_is_one_line(empty_cache, monkeypatch):
    from kvstudy.profiles import builder, generated

    monkeypatch.setattr(builder, "write_csv", _full_disk)
    arch, _ = _llama1b_h100()
    with pytest.raises(KvStudyError, match=r"^/the/disk/file: no space left on the device while building h100 "
                                           r"profiles of llama32_1b into .*; free space there or set "
                                           r"KVSTUDY_CACHE_DIR"):
        generated.compute_dir(arch, "h100")


@pytest.mark.parametrize("phase", ["build", "train"])
def test_ctrl_c_while_building_profiles_or_training_is_one_line_and_130(empty_cache, monkeypatch, capsys, phase):
    """`python -m kvstudy.latency hardware=h100_tp1` on an empty cache (every command wrapped by cli_entry): Ctrl-C
    while the profiles build or the predictor trains is `error: interrupted (Ctrl-C) while <that phase>`, status
    130, and nothing left in the cache that a later run would take as whole."""
    from kvstudy.latency import models
    from kvstudy.latency.__main__ import main
    from kvstudy.profiles import builder, generated

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(builder if phase == "build" else models, "build_model" if phase == "build" else "_train", stop)
    assert main(["model=llama32_1b", "hardware=h100_tp1"]) == 130
    stderr = capsys.readouterr().err
    err = [ln for ln in stderr.strip().splitlines() if not ln.startswith(("building ", "training "))]  # progress
    assert "Traceback" not in stderr
    what = ("building h100 profiles of llama32_1b into .*; the cache keeps only whole files" if phase == "build" else
            "training Vidur's predictor for llama32_1b on h100_tp1 into .*; the cache keeps nothing of it")
    assert len(err) == 1 and __import__("re").match(f"error: interrupted \\(Ctrl-C\\) while {what}", err[0]), err
    assert not list(empty_cache.rglob("tables.npz"))
    if phase == "build":
        assert not list(empty_cache.rglob(generated.MANIFEST))


PATCHED = """
import errno, os, runpy, sys
import pandas as pd
from kvstudy.latency import models
import kvstudy.running.sweep_callback as sweep_callback

def full(*a, **k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), a[1] if len(a) > 1 else None)

def stop(*a, **k):
    raise KeyboardInterrupt

case = sys.argv.pop(1)
if case == "full":
    pd.DataFrame.to_parquet = full
elif case == "train":
    models._train = stop
    models.VidurTables.load = staticmethod(lambda path: None)
else:
    sweep_callback.run_recording_errors = stop
runpy.run_module("kvstudy", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("case, code, line", [
    ("full", 2, r"error: .*requests\.parquet\.part: no space left on the device; free space there, or choose "
                r"another run folder \(hydra\.run\.dir"),
    ("train", 130, r"error: interrupted \(Ctrl-C\) while training Vidur's predictor for llama2_70b on a100_tp2 into "
                   r".*; the cache keeps nothing of it; the next run trains it again"),
    ("sweep", 130, r"error: interrupted \(Ctrl-C\) after 0 of 2 runs; finished runs are kept"),
])
def test_the_command_line_says_a_full_disk_or_ctrl_c_in_one_line(tmp_path, case, code, line):
    """`python -m kvstudy` (a run, and a sweep with -m) with the disk full under its run folder, or Ctrl-C while its
    predictor trains or its sweep runs: one `error:` line on stderr (no traceback), status 2 or 130."""
    import re

    args = ["+policy=vllm", "+demand=high", "workload.num_requests=20", "engine.progress=false"]
    if case == "sweep":
        args = ["-m", "+policy=vllm,rr", *args[1:], "latency=linear", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                "hydra.launcher.n_jobs=1"]
    else:
        args += ["latency=linear"] if case == "full" else []
        args += [f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run([sys.executable, "-c", PATCHED, case, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KVSTUDY_CACHE_DIR": str(tmp_path / "cache")} if case == "train"
                          else None)
    errors = [ln for ln in proc.stderr.splitlines() if not ln.startswith(("warning:", "building ", "training "))]
    assert proc.returncode == code and len(errors) == 1 and re.match(line, errors[0]), proc.stderr
    if case == "full":
        assert not (tmp_path / "run" / "summary.json").exists()
    if case == "sweep":  # the summary line says the sweep was interrupted, not "done: 0 runs" (the new-user trial)
        assert re.search(r"^sweep interrupted: 0 of 2 runs ended, .*\(no run ended, so no folder to name\)$",
                         proc.stdout, re.M), proc.stdout


@pytest.mark.parametrize("failure, code, line", [
    (_full_disk, 2, r"^error: /the/disk/file: no space left on the device while building h100 profiles into .*; "
                    r"free space there, then run again$"),
    (KeyboardInterrupt, 130, r"^error: interrupted \(Ctrl-C\) while building h100 profiles into .*; each file listed "
                             r"above is whole, the others are not written"),
])
def test_profiles_build_says_a_full_disk_or_ctrl_c_in_one_line(tmp_path, monkeypatch, capsys, failure, code, line):
    import re

    from kvstudy.profiles import builder
    from kvstudy.profiles.__main__ import main

    def fail(*args, **kwargs):
        if failure is KeyboardInterrupt:
            raise KeyboardInterrupt
        failure()

    monkeypatch.setattr(builder, "write_csv", fail)
    assert main(["build", "--device", "h100", "--models", "llama32_1b", "--out", str(tmp_path / "p")]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.match(line, err[0]), err


def test_a_sweep_whose_run_folder_another_process_writes_skips_it_and_says_so(tmp_path):
    """A sweep of two runs, one of whose folders another process holds: the other run completes, the held one is
    refused without an error.txt in it (the folder is not the sweep's to mark), and the sweep ends with one line
    saying so, status 2."""
    sweep = tmp_path / "sweep"
    held = sweep / "+demand=high,+policy=rr,latency=linear,workload.num_requests=20"
    holder = _hold(held)
    try:
        proc = subprocess.run([sys.executable, "-m", "kvstudy", "-m", "+policy=vllm,rr", "+demand=high",
                               "latency=linear", "workload.num_requests=20", f"hydra.sweep.dir={sweep}",
                               "hydra.launcher.n_jobs=1"], capture_output=True, text=True, timeout=300)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 2, proc.stderr
    assert "1 completed, 0 skipped (already finished), 1 failed" in proc.stdout
    assert f"process {holder.pid} is writing this run folder now" in proc.stdout
    assert proc.stderr.strip().splitlines()[-1].startswith("error: 1 run(s) not run: another process is writing")
    assert sorted(p.name for p in held.iterdir()) == [".kvstudy.lock"]


def test_without_preemption_a_lookup_per_request_gives_the_earlier_number():
    """Requests one at a time (no preemption; tests/memory/test_offload.py's A, B, C: C loads A's three blocks from the host
    after B evicted them): each request looks up once, its prompt, so the per-lookup rate is the number the offload
    study printed (loaded tokens over the started requests' prompt tokens): 48 / (48 + 64 + 64)."""
    from kvstudy.costs.swap_models import PcieSwap
    from kvstudy.engine.assembly import build_engine
    from kvstudy.latency.models import LinearLatency
    from kvstudy.latency.tables import HardwareSpec
    from kvstudy.memory import PagedMemory
    from kvstudy.policies.vllm import VLLM
    from kvstudy.running.paths import load_model_arch
    from kvstudy.workloads.requests import make_requests

    prompt, output = np.array([48, 64, 64]), np.array([2, 2, 2])
    segments = [[(1, 48)], [(2, 64)], [(1, 48), (3, 16)]]
    reqs = make_requests(np.arange(3) * 1e4, prompt, output, source="test", segments=segments)
    memory = PagedMemory(80, block_size=16, watermark=0.0, prefix_caching=True,
                         offload={"host_gb": 1.0, "host_read_gbps": 31.5, "host_write_gbps": 31.5, "choice": "load"})
    policy = VLLM()
    policy.reset(0)
    engine = build_engine(reqs, output.copy(), policy, LinearLatency(0.01, 1e-5), memory, PcieSwap(),
                          load_model_arch("llama2_70b"), HardwareSpec("a100_tp2", "a100", "a100_pairwise_nvlink", 2),
                          progress=False)
    result = engine.run()
    offload = result.extra["offload"]
    assert int(result.requests["preemptions"].sum()) == 0
    assert (offload["lookups"], offload["lookup_tokens"]) == (3, 176)
    assert offload["tiers"]["host"]["hit_rate"] == pytest.approx(48 / 176)
