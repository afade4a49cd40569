"""``run``: one config simulated into its run folder (resolved_config.yaml, the tables, summary.json written last),
the resume of a folder that holds a finished run (the same config, and for ``resume=code`` the same code
fingerprint: kvstudy/running/provenance.py), and SIGTERM taken as Ctrl-C so a stopped run writes what it did.
A finished run's files are replaced only by a run that finished too (kvstudy/running/outputs.py's ``write_run``
replaces them all together): a re-run that is interrupted, or fails, leaves them as they were.
Simulating is kvstudy/running/assemble.py's ``simulate``."""
from __future__ import annotations

import contextlib
import signal
import threading
import warnings

from omegaconf import DictConfig, OmegaConf

from kvstudy.config.validate import check_config
from kvstudy.errors import ConfigError, file_system, phase
from kvstudy.running import folder_lock, provenance
from kvstudy.running.assemble import policy_target, profile_paths, simulate
from kvstudy.running.outputs import finished_summary, write_run
from kvstudy.running.paths import prepare_dir


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM (``kill``, a cluster scheduler's stop) as Ctrl-C for the duration of one run, so the engine stops
    with status ``interrupted`` and what is done is written. Only in the main thread (signals are delivered
    there); the previous handler comes back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


#: keys that do not change a run's results: left out when a finished run's config is compared with a new one
_NOT_RESULTS = ("resume", "record", "engine.progress")


def _result_config(plain: dict) -> dict:
    plain = dict(plain)
    for key in _NOT_RESULTS:
        head, _, rest = key.partition(".")
        if rest and isinstance(plain.get(head), dict):
            plain[head] = {k: v for k, v in plain[head].items() if k != rest}
        elif not rest:
            plain.pop(head, None)
    hw = plain.get("hardware")
    if isinstance(hw, dict) and hw.get("memory_gb_per_gpu") is not None:
        # configs before issue 54 wrote the device's datasheet GB there; null now means the device's own memory
        # (kvstudy/profiles/devices.py), so a finished run with that number holds the same setting
        from kvstudy.profiles.devices import DEVICES

        gpu = DEVICES.get(hw.get("device"))
        if gpu is not None and hw["memory_gb_per_gpu"] == gpu.memory_gb:
            plain["hardware"] = {**hw, "memory_gb_per_gpu": None}
    return plain


#: keys added to conf/ after runs began recording their config, each with the value that means what a config
#: without it meant (a finished run's folder from before the key is the same config when this one has that value)
ADDED_KEYS = {"memory.prefix_caching": False, "policy.waiting_order": "fcfs", "workload.hash_block_size": 512,
              "policy.prefix_aware": False, "cluster": {"replicas": 1, "pools": None, "handoff": None}, "cluster.pools": None,
              "cluster.handoff": None,
              "engine.accept_rejections": False,
              "memory.gpu_memory_utilization": 0.9, "memory.non_torch_gib": None,
              "router": {"_target_": "kvstudy.cluster.routers.RoundRobin", "name": "round_robin"}}


def _first_difference(a, b, prefix: str = ""):
    """The first dotted key at which two plain configs differ, with both values (None: equal). A key of
    ``ADDED_KEYS`` absent from ``a`` (the earlier run) equals its value there."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            key = f"{prefix}.{k}" if prefix else str(k)
            there = a.get(k, ADDED_KEYS.get(key, "<absent>"))
            found = _first_difference(there, b.get(k, "<absent>"), key)
            if found:
                return found
        return None
    return None if a == b else (prefix, a, b)


def fingerprint(cfg: DictConfig) -> str:
    """What a finished run's results depend on beyond its config (kvstudy/running/provenance.py)."""
    return provenance.fingerprint(policy_target(cfg), profile_paths(cfg))


def _resume_mode(cfg: DictConfig, resume) -> str:
    if resume is False:
        return "never"
    mode = OmegaConf.select(cfg, "resume", default="code") if resume is True else resume
    if mode not in provenance.RESUME_MODES:
        raise ConfigError(f"resume={mode!r}: allowed {', '.join(provenance.RESUME_MODES)} (code: skip a finished run "
                          f"of the same config and code; config: of the same config; never: run again)")
    return mode


_FOLDER_FIX = "choose another run folder (hydra.run.dir; hydra.sweep.dir for a sweep)"


def run(cfg: DictConfig, out_dir, resume=True) -> dict:
    """Simulate ``cfg`` and write resolved_config.yaml, requests.parquet, iterations.parquet (events.parquet and
    batches.parquet with ``record.events=true``), summary.json.

    A folder that already holds a finished run of the same config (keys that do not change results, ``resume``,
    ``record``, ``engine.progress``, aside) is handled by the ``resume`` mode, the config's ``resume`` key unless
    ``resume`` here is ``False`` (``never``) or a mode: ``code`` (the default) leaves it as it is and returns its
    summary (``"skipped": true``) if its code fingerprint (kvstudy/running/provenance.py) is this code's too, else runs it
    again; ``config`` leaves it whatever the code; ``never`` runs it again. A folder holding a finished run of a
    different config is an error in every mode, never overwritten.

    A re-run of a finished run (stale code, ``resume=never``, events asked for) replaces its files only if it
    finishes too: interrupted, it leaves them untouched and returns its own summary with a note (``"kept": True``).
    A first run that is interrupted writes what it finished (status ``interrupted``).
    """
    # the folder checked before any work (kvstudy/running/paths.py; made when the run is written): whether it is
    # writable too, once it is clear the run is not skipped (a read-only folder of finished runs can be resumed)
    out = prepare_dir(out_dir, fix=_FOLDER_FIX, create=False, writable=False)
    mode = _resume_mode(cfg, resume)
    check_config(cfg)  # before the config is resolved here: an interpolation that fails is named in one line
    resolved = OmegaConf.to_yaml(cfg, resolve=True)
    # one writer at a time (kvstudy/running/folder_lock.py): a second command into this folder is refused in one line
    with folder_lock.locked(out, f"wait for it to finish, or {_FOLDER_FIX}"):
        return _run_locked(cfg, out, mode, resolved)


#: the files a run writes into its folder: none may be a folder (issue 54: a summary.json that is a folder)
RUN_FILES = ("resolved_config.yaml", "requests.parquet", "iterations.parquet", "events.parquet", "batches.parquet",
             "summary.json")


def _run_locked(cfg: DictConfig, out, mode: str, resolved: str) -> dict:
    """``run`` once it holds its folder's lock."""
    for name in RUN_FILES:
        if (out / name).is_dir():
            raise ConfigError(f"{out / name}: a folder, where the run writes its {name}; remove it, or "
                              f"{_FOLDER_FIX}")
    config_file = out / "resolved_config.yaml"
    finished = summary = finished_summary(out)
    if summary is not None:
        if not config_file.exists():
            raise ConfigError(f"{out} holds a finished run without its resolved_config.yaml; choose another folder")
        try:
            old = OmegaConf.to_container(OmegaConf.load(config_file), resolve=False)
        except Exception as exc:  # a file another program wrote or a crash truncated
            raise ConfigError(f"{config_file}: not a readable config ({type(exc).__name__}); choose another folder "
                              f"or delete it") from None
        diff = _first_difference(_result_config(old), _result_config(OmegaConf.to_container(cfg, resolve=True)))
        if diff:
            key, there, here = diff
            raise ConfigError(f"{out} already holds a finished run of a different config ({key}: {there!r} there, "
                              f"{here!r} here); choose another folder (hydra.run.dir), or delete that one")
        stale = mode == "never"
        if mode == "code":
            stored = (summary.get("provenance") or {}).get("fingerprint")
            stale = stored != fingerprint(cfg)
            if stale:
                warnings.warn("a finished run of this config was made by other code (kvstudy's source, the policy's "
                              "module or the profiles differ, or it predates fingerprints): running it again "
                              "(resume=config keeps finished runs of the same config)", stacklevel=2)
        if OmegaConf.select(cfg, "record.events", default=False) and not (out / "events.parquet").exists():
            stale = True  # asked for what the finished run did not record
        if not stale:
            return {**summary, "skipped": True}
    prepare_dir(out, fix=_FOLDER_FIX, create=False)
    with _sigterm_as_interrupt(), phase(f"preparing the run into {out}", "nothing of this run was written"):
        result, summary = simulate(cfg)
    if finished is not None and summary["status"] == "interrupted":  # the finished run stays whole
        note = (f"{out} keeps its finished run (status {finished['status']}): this re-run was interrupted and "
                f"its partial results are not written")
        return {**summary, "message": "; ".join(m for m in (summary.get("message"), note) if m), "kept": True}
    # every file replaced together, summary.json last; a full disk leaves the folder as it was, said in one line
    with file_system(out, f"free space there, or {_FOLDER_FIX}"):
        write_run(out, result, summary, resolved)
    return summary

