"""The run's records (requests.parquet, iterations.parquet), built from the one loop's state (kvstudy/engine/loop.py)
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

from kvstudy.engine.states import DONE, ELSEWHERE, REJECTED, EngineResult

STATE_NAMES = np.array(["future", "waiting", "running", "done", "rejected", "swapped", "elsewhere"])
#: iterations.parquet's columns in order, each with its type (docs/engine.md describes them); the MC-SF paper's
#: convention writes the first nine
ITERATION_SCHEMA = (("start", float), ("duration", float), ("batch_size", np.int64), ("prefill_tokens", np.int64),
                    ("decode_tokens", np.int64), ("kv_tokens_in_use", np.int64), ("capacity", np.int64),
                    ("overflow", bool), ("cleared", np.int64), ("blocks_used", np.int64),
                    ("blocks_reserved", np.int64), ("blocks_free", np.int64), ("host_blocks", np.int64),
                    ("swap_seconds", float), ("chunk_tokens", np.int64), ("preempted_recompute", np.int64),
                    ("preempted_swap", np.int64), ("swapped_in", np.int64))
ITERATION_COLUMNS = tuple(name for name, _ in ITERATION_SCHEMA)
ITERATION_TYPES = tuple(kind for _, kind in ITERATION_SCHEMA)


class PaperRows:
    """The iteration rows of the MC-SF paper's convention (memory=paper): the first nine columns, KV in use being the
    decoders' sum(s + j + 1) (the prompts a round admits are not charged: constraint (3)). The one place a row's
    values are put in column order; what the engine's record phase passes is named (the loop's ``Batch``)."""

    width = 9

    def __init__(self, memory) -> None:
        self.rows: list = []
        self.capacity = memory.capacity_tokens

    def decode_only(self, start: float, duration: float, decodes: int, decode_kv: int) -> None:
        """An iteration in which every running request decoded and nothing else happened (the hot path)."""
        self.rows.append((start, duration, decodes, 0, decodes, decode_kv, self.capacity, False, 0))

    def iteration(self, start: float, duration: float, batch, decision) -> None:
        """Any other iteration: ``batch`` (kvstudy/engine/loop.py ``Batch``) names what ran, ``decision`` what was
        preempted and swapped in (the paper's memory: whole prefills and decodes; KV as the decoders' sum)."""
        decodes = batch.decodes
        self.rows.append((start, duration, len(batch.chunks) + decodes, batch.prefill_tokens, decodes,
                          batch.decode_ctx + decodes, self.capacity, False, 0))

    def clearing(self, *, start: float, duration: float, decodes: int, decode_kv: int, cleared: int,
                 blocks_used: int) -> None:
        """An overflow: the running requests' need exceeded the memory; ``cleared`` requests were evicted."""
        self.rows.append((start, duration, decodes, 0, 0, decode_kv, self.capacity, True, cleared))


class PagedRows(PaperRows):
    """The iteration rows of vLLM's convention (memory=paged): all the columns, KV in use being every running
    request's (prefills included), and the memory's block counts after the iteration's decisions."""

    width = len(ITERATION_COLUMNS)

    def __init__(self, memory) -> None:
        super().__init__(memory)
        self.memory = memory
        self.num_blocks = memory.num_blocks

    def decode_only(self, start: float, duration: float, decodes: int, decode_kv: int) -> None:
        used = self.memory.used
        self.rows.append((start, duration, decodes, 0, decodes, decode_kv, self.capacity, False, 0, used, 0,
                          self.num_blocks - used, self.memory.host_used, 0.0, 0, 0, 0, 0))

    def iteration(self, start: float, duration: float, batch, decision) -> None:
        used, decodes, preempted = self.memory.used, batch.decodes, len(decision.preempt)
        self.rows.append((start, duration, len(batch.chunks) + decodes, batch.prefill_tokens, decodes,
                          batch.kv_in_use, self.capacity, False, preempted, used, batch.blocks_reserved,
                          self.num_blocks - used, self.memory.host_used, batch.swap_seconds, batch.partial,
                          batch.recomputes, preempted - batch.recomputes, len(decision.swap_in)))

    def clearing(self, *, start: float, duration: float, decodes: int, decode_kv: int, cleared: int,
                 blocks_used: int) -> None:
        """``blocks_used``: before the evictions."""
        self.rows.append((start, duration, decodes, 0, 0, decode_kv, self.capacity, True, cleared, blocks_used, 0,
                          self.num_blocks - blocks_used, self.memory.host_used, 0.0, 0, cleared, 0, 0))


class PagedCacheRows(PagedRows):
    """``PagedRows`` with prefix caching: each row also keeps the cache's (cached blocks, evictions so far) after it
    (``memory.cache_stats()``), for the columns ``cached_blocks`` and ``evictions``."""

    def __init__(self, memory) -> None:
        super().__init__(memory)
        #: per row: cached blocks, evictions so far (flat, two ints a row: a tuple a row would be one more object for
        #: the garbage collector to walk, and a run has hundreds of thousands of rows)
        self.cache_rows: list = []

    def decode_only(self, start: float, duration: float, decodes: int, decode_kv: int) -> None:
        super().decode_only(start, duration, decodes, decode_kv)
        self.cache_rows.extend(self.memory.cache_stats())

    def iteration(self, start: float, duration: float, batch, decision) -> None:
        super().iteration(start, duration, batch, decision)
        self.cache_rows.extend(self.memory.cache_stats())

    def clearing(self, **values) -> None:
        super().clearing(**values)
        self.cache_rows.extend(self.memory.cache_stats())


def row_log(memory) -> PaperRows:
    """The iteration rows of ``memory``'s convention."""
    if memory.convention == "paper":
        return PaperRows(memory)
    return PagedCacheRows(memory) if memory.prefix_caching else PagedRows(memory)


def _iterations(rows: PaperRows) -> pd.DataFrame:
    # one float array, then column by column: much faster than DataFrame.from_records on 10^5+ tuples
    # (every integer column is far below 2^53, so the float round trip is exact)
    table = np.array(rows.rows, dtype=float).reshape(len(rows.rows), rows.width)
    return pd.DataFrame({c: table[:, k].astype(kind) for k, (c, kind) in enumerate(ITERATION_SCHEMA[:rows.width])})


def pooled_tbt(engine) -> dict:
    """Quantiles of every gap between consecutive tokens of every request, pooled (spec B8.11's tail TBT),
    including the tokens a request produced before it was rejected after a preemption (they were streamed)."""
    return pooled_tbt_of([engine])


def token_gaps(engine):
    """(gaps, weights): every gap between consecutive tokens of the engine's requests, each with its count."""
    st = engine.state
    values, weights = st.clock.pooled_gaps()
    return (np.concatenate([values, np.asarray(st.off_clock_gaps, dtype=float)]),
            np.concatenate([weights, np.ones(len(st.off_clock_gaps))]))


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


def own_rows(result: EngineResult, st) -> None:
    """A cluster replica's requests table (sorted by request_id) cut to the rows of requests not routed to another
    replica when its run ended (state not ELSEWHERE: its own, and those not routed yet or nowhere), with their
    positions in request_id order (``result.rows``: kvstudy/cluster/driver.py ``merge`` takes each request's row from
    its replica). Its other rows hold nothing of its own: the per-request lists are the cluster's (RunState
    ``shared``)."""
    order = np.argsort(st.requests.request_id, kind="stable")
    kept = st.request_state[order] != ELSEWHERE
    result.requests = result.requests[kept].reset_index(drop=True)
    result.rows = np.flatnonzero(kept)


def paged_result(engine, rows: PagedRows, status, message, clearing: int) -> EngineResult:
    """The run's tables in vLLM's convention (memory=paged)."""
    st, mem = engine.state, engine.memory
    r, state = st.requests, st.request_state
    iterations = _iterations(rows)
    a, o = r.arrival_time, r.output_tokens
    first_token, completion = np.array(st.first_token), np.array(st.completion)
    done = state == DONE
    mean_tbt = np.where(done & (o > 1), (completion - first_token) / np.maximum(o - 1, 1), np.nan)
    max_tbt = np.where(done & (o > 1), np.array(st.max_gap), np.nan)
    pre_rec = np.array(st.preemptions_recompute, dtype=np.int64)
    pre_swap = np.array(st.preemptions_swap, dtype=np.int64)
    requests = pd.DataFrame({
        "request_id": r.request_id, "arrival_time": a, "prompt_tokens": r.prompt_tokens, "output_tokens": o,
        "predicted_output_tokens": st.predicted_array, "state": STATE_NAMES[state],
        "first_scheduled_time": np.array(st.first_scheduled), "first_token_time": first_token,
        "completion_time": completion, "ttft": first_token - a, "e2e_latency": completion - a,
        "mean_tbt": mean_tbt, "max_tbt": max_tbt, "preemptions": pre_rec + pre_swap, "restarts": pre_rec,
        "preemptions_recompute": pre_rec, "preemptions_swap": pre_swap,
        "swap_fallbacks": np.array(st.swap_fallbacks, dtype=np.int64),
        "preempted_seconds": np.array(st.preempted_seconds),
        "recomputed_tokens": np.array(st.recomputed_tokens, dtype=np.int64),
        "swapped_bytes": np.array(st.swapped_bytes, dtype=np.int64), "reject_reason": st.reject_reason,
    }).sort_values("request_id", kind="stable").reset_index(drop=True)
    if mem.prefix_caching:
        _prefix_records(st, rows, requests, iterations)
    result = EngineResult(requests, iterations, status, message, clearing, mem.capacity_tokens)
    result.extra = {"memory": mem.describe(), "swap": engine.swap.describe()}
    if mem.prefix_caching:
        result.extra["prefix_cache"] = prefix_summary(requests, iterations)
    summary = mem.connector.summary()
    if summary is not None:
        _connector_records(st, mem.connector, summary, requests, result)
    return result


def _connector_records(st, connector, summary: dict, requests: pd.DataFrame, result: EngineResult) -> None:
    """A KV connector's (kvstudy/memory/connector.py; the offload tiers: kvstudy/memory/offload.py): per request
    ``offload_loaded_tokens`` (prompt tokens its prefills loaded through it), per run ``offload`` (its summary: the
    tiers' blocks, bytes and hit rates)."""
    order = np.argsort(st.requests.request_id, kind="stable")
    loaded = np.zeros(st.n, dtype=np.int64)
    for i, tokens in connector.loaded_tokens().items():
        loaded[i] = tokens
    requests["offload_loaded_tokens"] = loaded[order]
    result.extra["offload"] = {**summary, "loaded_tokens": int(loaded.sum())}


def _prefix_records(st, rows: PagedCacheRows, requests: pd.DataFrame, iterations: pd.DataFrame) -> None:
    """Prefix caching's columns (memory.prefix_caching=true only): per request ``prefix_cached_tokens`` (prompt
    tokens its first prefill took from the cache) and ``prefix_cached_later_tokens`` (tokens its later prefills,
    recomputes after a preemption, took from it); per iteration ``cached_blocks`` (blocks holding a cached prefix, in
    use or evictable, after the iteration's decisions) and ``evictions`` (cached blocks evicted in it)."""
    order = np.argsort(st.requests.request_id, kind="stable")  # the requests table is sorted by request_id
    requests["prefix_cached_tokens"] = np.asarray(st.prefix_cached_first, dtype=np.int64)[order]
    requests["prefix_cached_later_tokens"] = np.asarray(st.prefix_cached_later, dtype=np.int64)[order]
    cache = np.asarray(rows.cache_rows, dtype=np.int64).reshape(len(rows.cache_rows) // 2, 2)
    iterations["cached_blocks"] = cache[:, 0]
    iterations["evictions"] = np.diff(cache[:, 1], prepend=0)


def prefix_summary(requests: pd.DataFrame, iterations: pd.DataFrame) -> dict:
    """A run's prefix caching in numbers: ``hit_rate`` = prompt tokens served from the cache at their request's first
    prefill / prompt tokens of the requests that started one (issue 36's per-run hit rate)."""
    started = requests["first_scheduled_time"].notna()
    prompt = int(requests.loc[started, "prompt_tokens"].sum())
    cached = int(requests.loc[started, "prefix_cached_tokens"].sum())
    return {"hit_rate": cached / prompt if prompt else 0.0, "cached_prompt_tokens": cached, "prompt_tokens": prompt,
            "cached_later_tokens": int(requests["prefix_cached_later_tokens"].sum()),
            "evictions": int(iterations["evictions"].sum()) if len(iterations) else 0}




def paper_result(engine, rows: PaperRows, status, message, clearing: int) -> EngineResult:
    """The run's tables in the MC-SF paper's convention (memory=paper)."""
    st, M = engine.state, engine.memory.capacity_tokens
    r, state = st.requests, st.request_state
    if status == "completed" and (state == REJECTED).any():
        message = f"{int((state == REJECTED).sum())} request(s) rejected: prompt + output exceeds capacity {M}"
    iterations = _iterations(rows)
    start, dur, over = (iterations[c].to_numpy() for c in ("start", "duration", "overflow"))
    o, a = r.output_tokens, r.arrival_time
    completion, first_token = np.array(st.completion), np.array(st.first_token)
    mean_tbt, max_tbt = _tbt(state, o, completion, np.array(st.admission_stamp),
                             np.array(st.admission_round, dtype=np.int64), np.array(st.last_round, dtype=np.int64),
                             start, dur, over, engine.at_start)
    evictions = np.array(st.preemptions_recompute, dtype=np.int64)
    requests = pd.DataFrame({
        "request_id": r.request_id, "arrival_time": a, "prompt_tokens": r.prompt_tokens, "output_tokens": o,
        "predicted_output_tokens": st.predicted_array, "state": STATE_NAMES[state],  # never swapped on this memory
        "first_scheduled_time": np.array(st.first_scheduled), "first_token_time": first_token,
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
