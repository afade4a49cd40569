"""The run's records (requests.parquet, iterations.parquet), built from the one loop's state (kvstudy/step_engine.py)
when a run ends, in the columns of its memory model's convention.

* ``paged_result``: vLLM's convention (kvstudy/memory/paged.py): every column docs/engine.md lists, each request's
  largest gap between tokens over all its lives, and ``pooled_tbt`` (every gap of every request; CacheOPT's B8.11).
* ``paper_result``: the MC-SF paper's convention (kvstudy/memory/paper.py): the paper loop's tables exactly as it
  wrote them before issue 34 (the first nine iteration columns; fifteen request columns): time between tokens over a
  request's completing life, from its admission round (moved one round later by each overflow it survived) to its
  last round, on the rounds' stamps (``_tbt``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from kvstudy.states import DONE, REJECTED, EngineResult

STATE_NAMES = np.array(["future", "waiting", "running", "done", "rejected", "swapped", "elsewhere"])
ITERATION_COLUMNS = ("start", "duration", "batch_size", "prefill_tokens", "decode_tokens", "kv_tokens_in_use",
                     "capacity", "overflow", "cleared", "blocks_used", "blocks_reserved", "blocks_free",
                     "host_blocks", "swap_seconds", "chunk_tokens", "preempted_recompute", "preempted_swap",
                     "swapped_in")
ITERATION_TYPES = (float, float, np.int64, np.int64, np.int64, np.int64, np.int64, bool, np.int64, np.int64, np.int64,
                   np.int64, np.int64, float, np.int64, np.int64, np.int64, np.int64)



def pooled_tbt(engine) -> dict:
    """Quantiles of every gap between consecutive tokens of every request, pooled (spec B8.11's tail TBT),
    including the tokens a request produced before it was rejected after a preemption (they were streamed)."""
    return pooled_tbt_of([engine])


def token_gaps(engine):
    """(gaps, weights): every gap between consecutive tokens of the engine's requests, each with its count."""
    values, weights = engine.clock.pooled_gaps()
    return (np.concatenate([values, np.asarray(engine.off_clock_gaps, dtype=float)]),
            np.concatenate([weights, np.ones(len(engine.off_clock_gaps))]))


def pooled_tbt_of(engines) -> dict:
    """``pooled_tbt`` over several engines' requests (the replicas of a cluster)."""
    parts = [token_gaps(e) for e in engines]
    values, weights = np.concatenate([v for v, _ in parts]), np.concatenate([w for _, w in parts])
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    if not len(values):
        return {"count": 0}
    order = np.argsort(values, kind="stable")
    values, cum = values[order], np.cumsum(weights[order])
    total = cum[-1]

    def q(p):  # the smallest gap with at least p of all gaps at or below it (inverted CDF)
        return float(values[min(len(values) - 1, int(np.searchsorted(cum, p * total - 1e-9)))])

    return {"count": int(round(total)), "mean": float((values * weights[order]).sum() / total),
            "p50": q(0.5), "p95": q(0.95), "p99": q(0.99), "max": float(values[-1])}

def paged_result(engine, log, status, message, clearing: int) -> EngineResult:
    r, mem, state = engine.r, engine.memory, engine.state
    first_sched, first_token, completion, max_gap = engine.first_sched, engine.first_token, engine.completion, engine.max_gap
    pre_rec, pre_swap, fallbacks, preempted_s = engine.pre_rec, engine.pre_swap, engine.fallbacks, engine.preempted_s
    recomputed, swapped_bytes, reason = engine.recomputed, engine.swapped_bytes, engine.reason
    # one float array, then column by column: much faster than DataFrame.from_records on 10^5+ tuples
    # (every integer column is far below 2^53, so the float round trip is exact)
    table = np.array(log, dtype=float).reshape(len(log), len(ITERATION_COLUMNS))
    iterations = pd.DataFrame({c: table[:, k].astype(kind)
                               for k, (c, kind) in enumerate(zip(ITERATION_COLUMNS, ITERATION_TYPES))})
    a, o = r.arrival_time, r.output_tokens
    first_token, completion = np.array(first_token), np.array(completion)
    done = state == DONE
    mean_tbt = np.where(done & (o > 1), (completion - first_token) / np.maximum(o - 1, 1), np.nan)
    max_tbt = np.where(done & (o > 1), np.array(max_gap), np.nan)
    pre_rec, pre_swap = np.array(pre_rec, dtype=np.int64), np.array(pre_swap, dtype=np.int64)
    requests = pd.DataFrame({
        "request_id": r.request_id, "arrival_time": a, "prompt_tokens": r.prompt_tokens, "output_tokens": o,
        "predicted_output_tokens": engine.pred, "state": STATE_NAMES[state],
        "first_scheduled_time": np.array(first_sched), "first_token_time": first_token,
        "completion_time": completion, "ttft": first_token - a, "e2e_latency": completion - a,
        "mean_tbt": mean_tbt, "max_tbt": max_tbt, "preemptions": pre_rec + pre_swap, "restarts": pre_rec,
        "preemptions_recompute": pre_rec, "preemptions_swap": pre_swap,
        "swap_fallbacks": np.array(fallbacks, dtype=np.int64), "preempted_seconds": np.array(preempted_s),
        "recomputed_tokens": np.array(recomputed, dtype=np.int64),
        "swapped_bytes": np.array(swapped_bytes, dtype=np.int64), "reject_reason": reason,
    }).sort_values("request_id", kind="stable").reset_index(drop=True)
    if engine.cache is not None:
        _prefix_records(engine, requests, iterations)
    result = EngineResult(requests, iterations, status, message, clearing, mem.capacity_tokens)
    result.extra = {"memory": mem.describe(), "swap": engine.swap.describe()}
    if engine.cache is not None:
        result.extra["prefix_cache"] = prefix_summary(requests, iterations)
    return result


def _prefix_records(engine, requests: pd.DataFrame, iterations: pd.DataFrame) -> None:
    """Prefix caching's columns (memory.prefix_caching=true only): per request ``prefix_cached_tokens`` (prompt
    tokens its first prefill took from the cache) and ``prefix_cached_later_tokens`` (tokens its later prefills,
    recomputes after a preemption, took from it); per iteration ``cached_blocks`` (blocks holding a cached prefix, in
    use or evictable, after the iteration's decisions) and ``evictions`` (cached blocks evicted in it)."""
    order = np.argsort(engine.r.request_id, kind="stable")  # the requests table is sorted by request_id
    requests["prefix_cached_tokens"] = np.asarray(engine.prefix_first, dtype=np.int64)[order]
    requests["prefix_cached_later_tokens"] = np.asarray(engine.prefix_again, dtype=np.int64)[order]
    rows = np.asarray(engine.cache_rows, dtype=np.int64).reshape(len(engine.cache_rows), 2)
    iterations["cached_blocks"] = rows[:, 0]
    iterations["evictions"] = np.diff(rows[:, 1], prepend=0)


def prefix_summary(requests: pd.DataFrame, iterations: pd.DataFrame) -> dict:
    """A run's prefix caching in numbers: ``hit_rate`` = prompt tokens served from the cache at their request's first
    prefill / prompt tokens of the requests that started one (issue 36's per-run hit rate)."""
    started = requests["first_scheduled_time"].notna()
    prompt = int(requests.loc[started, "prompt_tokens"].sum())
    cached = int(requests.loc[started, "prefix_cached_tokens"].sum())
    return {"hit_rate": cached / prompt if prompt else 0.0, "cached_prompt_tokens": cached, "prompt_tokens": prompt,
            "cached_later_tokens": int(requests["prefix_cached_later_tokens"].sum()),
            "evictions": int(iterations["evictions"].sum()) if len(iterations) else 0}


#: the paper convention's iteration columns: the first nine of ``ITERATION_COLUMNS``
PAPER_ITERATION_COLUMNS = ITERATION_COLUMNS[:9]


def paper_result(engine, log, status, message, clearing: int) -> EngineResult:
    r, M, state = engine.r, engine.memory.capacity_tokens, engine.state
    if status == "completed" and (state == REJECTED).any():
        message = f"{int((state == REJECTED).sum())} request(s) rejected: prompt + output exceeds capacity {M}"
    table = np.array(log, dtype=float).reshape(len(log), 9)  # the loop logs nine columns on the paper's memory
    iterations = pd.DataFrame({c: table[:, k].astype(kind)
                               for k, (c, kind) in enumerate(zip(PAPER_ITERATION_COLUMNS, ITERATION_TYPES))})
    start, dur, over = (iterations[c].to_numpy() for c in ("start", "duration", "overflow"))
    o, a = r.output_tokens, r.arrival_time
    completion, first_token = np.array(engine.completion), np.array(engine.first_token)
    mean_tbt, max_tbt = _tbt(state, o, completion, np.array(engine.admit_stamp),
                             np.array(engine.p_round, dtype=np.int64), np.array(engine.done_round, dtype=np.int64),
                             start, dur, over, engine.at_start)
    evictions = np.array(engine.pre_rec, dtype=np.int64)
    requests = pd.DataFrame({
        "request_id": r.request_id, "arrival_time": a, "prompt_tokens": r.prompt_tokens, "output_tokens": o,
        "predicted_output_tokens": engine.pred, "state": STATE_NAMES[state],  # never swapped on this memory
        "first_scheduled_time": np.array(engine.first_sched), "first_token_time": first_token,
        "completion_time": completion, "ttft": first_token - a, "e2e_latency": completion - a, "mean_tbt": mean_tbt,
        "max_tbt": max_tbt, "preemptions": evictions, "restarts": evictions.copy(),
    }).sort_values("request_id", kind="stable").reset_index(drop=True)
    return EngineResult(requests, iterations, status, message, clearing, M)


def _range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo_k..hi_k]) for each k (inclusive ranges, lo <= hi), with a sparse table."""
    table = [values]
    span = 1
    while 2 * span <= len(values):
        prev = table[-1]
        table.append(np.maximum(prev[:-span], prev[span:]))
        span *= 2
    length = hi - lo + 1
    level = np.floor(np.log2(np.maximum(length, 1))).astype(int)
    out = np.empty(len(lo))
    for lv in np.unique(level):
        sel = level == lv
        tab = table[lv]
        out[sel] = np.maximum(tab[lo[sel]], tab[hi[sel] - (1 << lv) + 1])
    return out



def _tbt(state, o, completion, admit_stamp, p_round, done_round, start, dur, over, at_start):
    """Time between tokens over a request's completing life: its tokens are stamped in its admission
    round and each decode round after it (overflow rounds produce no token, so a gap spans them)."""
    n = len(state)
    mean_tbt = np.full(n, np.nan)
    max_tbt = np.full(n, np.nan)
    done = np.flatnonzero(state == DONE)
    if not len(done):
        return mean_tbt, max_tbt
    mean_tbt[done] = (completion[done] - admit_stamp[done]) / o[done]
    stamps = start if at_start else start + dur
    token_rounds = np.flatnonzero(~over)
    gaps = np.zeros(len(stamps))
    gaps[token_rounds[1:]] = np.diff(stamps[token_rounds])
    max_tbt[done] = _range_max(gaps, p_round[done] + 1, done_round[done])
    return mean_tbt, max_tbt
