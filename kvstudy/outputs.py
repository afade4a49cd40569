"""Run outputs: summary statistics and atomic writes.

A run folder is complete when ``summary.json`` exists: it is written last, and every file is
written to a temporary name and renamed, so a killed run never leaves a file that looks finished.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from kvstudy.atomic import write_atomic, write_text_atomic
from kvstudy.states import EngineResult


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


def write_run(folder: Path, result: EngineResult, summary: dict) -> None:
    folder = Path(folder)
    write_atomic(folder / "requests.parquet", lambda p: result.requests.to_parquet(p, index=False))
    write_atomic(folder / "iterations.parquet", lambda p: result.iterations.to_parquet(p, index=False))
    for name in ("events", "batches"):  # record.events=true (kvstudy/events.py)
        table = getattr(result, name, None)
        if table is not None:
            write_atomic(folder / f"{name}.parquet", lambda p, t=table: t.to_parquet(p, index=False))
    write_text_atomic(folder / "summary.json", json.dumps(summary, indent=1, default=str) + "\n")


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
