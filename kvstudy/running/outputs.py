"""Run outputs: summary statistics and the writing of a run's files.

A run folder is complete when ``summary.json`` exists (and its status is not ``interrupted``). ``write_run`` writes
every file of a run into a hidden staging folder inside the run folder first, then moves them into place by renames,
taking an earlier run's ``summary.json`` away before the first move and putting the new one in last: at no moment
does the folder hold a finished run made of two runs' files, and a run that fails while writing leaves the earlier
run's files as they were.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from kvstudy.engine.states import EngineResult


def _stats(values: pd.Series) -> dict:
    v = values.dropna().to_numpy(dtype=float)
    if not len(v):
        return {"mean": None, "median": None, "p90": None, "p99": None}
    return {"mean": float(v.mean()), "median": float(np.median(v)), "p90": float(np.percentile(v, 90)),
            "p99": float(np.percentile(v, 99))}


def summarize(result: EngineResult) -> dict:
    req, it = result.requests, result.iterations
    done = req[req["state"] == "done"]
    makespan = float((it["start"] + it["duration"]).max() - req["arrival_time"].min()) if len(it) else 0.0
    return {
        "status": result.status,
        "message": result.message,
        "num_requests": int(len(req)),
        "completed": int(len(done)),
        "rejected": int((req["state"] == "rejected").sum()),
        "e2e_latency": _stats(done["e2e_latency"]),
        "ttft": _stats(done["ttft"]),
        "tbt": _stats(done["mean_tbt"]),
        "max_tbt": _stats(done["max_tbt"]),
        "total_e2e_latency": float(done["e2e_latency"].sum()),
        "makespan": makespan,
        "throughput_requests_per_time": float(len(done) / makespan) if makespan > 0 else None,
        "throughput_tokens_per_time": float(done["output_tokens"].sum() / makespan) if makespan > 0 else None,
        "iterations": int(len(it)),
        "peak_kv_tokens": int(it["kv_tokens_in_use"].max()) if len(it) else 0,
        "capacity_tokens": int(result.capacity),
        "clearing_events": int(result.clearing_events),
        "preemptions": int(req["preemptions"].sum()),
        "workload": {"prompt_mean": float(req["prompt_tokens"].mean()),
                     "prompt_median": float(req["prompt_tokens"].median()),
                     "output_mean": float(req["output_tokens"].mean()),
                     "output_median": float(req["output_tokens"].median())},
        **_preemption_summary(req, it),
        **_prefix_summary(result.extra),
        **result.extra,
    }


def _prefix_summary(extra: dict) -> dict:
    """memory.prefix_caching=true: the run's hit rate (cached prompt tokens / prompt tokens, first prefills) and the
    cached blocks evicted, as top-level keys (columns of ``analysis.load_sweep``)."""
    cache = extra.get("prefix_cache")
    if not cache:
        return {}
    return {"prefix_hit_rate": cache["hit_rate"], "prefix_evictions": cache["evictions"]}


def _preemption_summary(req: pd.DataFrame, it: pd.DataFrame) -> dict:
    """Totals of the preemptive engine's records (memory=paged); nothing for the paper's engine."""
    if "preemptions_swap" not in req:
        return {}
    return {"preemptions_recompute": int(req["preemptions_recompute"].sum()),
            "preemptions_swap": int(req["preemptions_swap"].sum()),
            "swap_fallbacks": int(req["swap_fallbacks"].sum()),
            "recomputed_tokens": int(req["recomputed_tokens"].sum()),
            "swapped_bytes": int(req["swapped_bytes"].sum()),
            "preempted_seconds_total": float(req["preempted_seconds"].sum()),
            "swap_seconds_total": float(it["swap_seconds"].sum()) if len(it) else 0.0,
            "peak_blocks_used": int(it["blocks_used"].max()) if len(it) else 0}


#: the staging folder's prefix: inside the run folder, its files named ``*.part`` (no reader looks for those)
STAGING_PREFIX = ".incoming-"


@contextlib.contextmanager
def _signals_held():
    """Ctrl-C and SIGTERM held back while one run's files replace another's (a few renames); delivered after."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def write_run(folder: Path, result: EngineResult, summary: dict, config_text: Optional[str] = None) -> None:
    """Write a run's tables, ``summary.json`` and (``config_text``) ``resolved_config.yaml`` into ``folder``,
    replacing an earlier run's only once every file is written (module docstring)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder, prefix=STAGING_PREFIX))
    try:
        staged = {}

        def stage(name: str, write) -> None:
            path = staging / f"{name}.part"
            write(path)
            staged[name] = path

        if config_text is not None:
            stage("resolved_config.yaml", lambda p: p.write_text(config_text))
        stage("requests.parquet", lambda p: result.requests.to_parquet(p, index=False))
        stage("iterations.parquet", lambda p: result.iterations.to_parquet(p, index=False))
        for name in ("events", "batches"):  # record.events=true (kvstudy/engine/events.py)
            table = getattr(result, name, None)
            if table is not None:
                stage(f"{name}.parquet", lambda p, t=table: t.to_parquet(p, index=False))
        stage("summary.json", lambda p: p.write_text(json.dumps(summary, indent=1, default=str) + "\n"))
        with _signals_held():  # every file is written: the earlier run's are replaced by renames only
            (folder / "summary.json").unlink(missing_ok=True)  # from here until the end: no finished run
            for name in ("events.parquet", "batches.parquet"):  # a re-run without record.events leaves no stale tables
                if name not in staged:
                    (folder / name).unlink(missing_ok=True)
            for name, path in staged.items():
                if name != "summary.json":
                    os.replace(path, folder / name)
            os.replace(staged["summary.json"], folder / "summary.json")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def finished_summary(folder: Path) -> Optional[dict]:
    """The summary of a finished run in ``folder``, else None: summary.json is written last, and an interrupted
    run's (status ``interrupted``) does not count, so a resumed sweep runs it again."""
    path = Path(folder) / "summary.json"
    if not path.exists():
        return None
    try:
        summary = json.loads(path.read_text())
    except (ValueError, OSError):
        return None
    return summary if isinstance(summary, dict) and summary.get("status") != "interrupted" else None


def is_complete(folder: Path) -> bool:
    """A finished run (``finished_summary``)."""
    return finished_summary(folder) is not None
