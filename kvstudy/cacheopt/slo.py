"""The CacheOPT study's SLOs and metrics (Shen et al., Sec. 5; spec B5, B8.11, B8.12), from a run's requests table.

* SLOs (B8.12): per (model, trace, rate), the reference TTFT and TBT are the means over the compared systems of
  each system's mean TTFT and mean time between tokens. Each request draws a scale from U[0.5, 2.5], independently
  for TTFT and for TBT: SLO_tft = s * TTFT_ref * ceil(prompt / token_budget) (a long prompt is chunked), and
  SLO_tbt = s' * TBT_ref.
* Attainment: TTFT, the share of requests with TTFT <= SLO_tft. TBT, the share whose *every* gap meets SLO_tbt,
  i.e. whose worst gap (``max_tbt``) does. An unfinished request meets neither.
* Tails (B8.11: the paper never names the percentile): p99 and p95 of TTFT and of each request's worst gap. The
  spec's pooled p99 over all inter-token gaps is in each paged run's summary (``tbt_pooled``, computed by the engine
  from every gap; kvstudy/cacheopt/study.py reads it).
* Normalized latency: end-to-end latency / output tokens, averaged over finished requests.
* Waiting, execution and preemption time (the motivation study, Sec. 2.2). Waiting is arrival to first
  scheduled. Execution is first scheduled to completion, minus the time preempted. Preemption is the time
  preempted (``preempted_seconds``, paged engine).
* Sustainable rate: the highest arrival rate at which the normalized latency stays at or below a target,
  interpolated linearly between measured rates.
"""
from __future__ import annotations

from typing import Iterable, Tuple

import numpy as np
import pandas as pd

from kvstudy.errors import ConfigError


def reference(runs: Iterable[pd.DataFrame]) -> Tuple[float, float]:
    """(TTFT_ref, TBT_ref): means over systems of each system's mean TTFT and mean time between tokens."""
    ttft, tbt = [], []
    for req in runs:
        done = req[req["state"] == "done"]
        ttft.append(float(done["ttft"].mean()))
        tbt.append(float(done["mean_tbt"].mean()))
    if not ttft:
        raise ConfigError("SLO reference: no runs given")
    ttft_ref, tbt_ref = float(np.mean(ttft)), float(np.mean(tbt))
    if not (np.isfinite(ttft_ref) and np.isfinite(tbt_ref)):  # every SLO, and the deadline order, would be NaN
        raise ConfigError(f"SLO reference: the reference runs give TTFT_ref={ttft_ref}, TBT_ref={tbt_ref} (a system "
                          f"that completed no request, or none with two or more output tokens); give "
                          f"policy.slo.ttft_ref and policy.slo.tbt_ref")
    return ttft_ref, tbt_ref


def draw_slos(prompt: np.ndarray, ttft_ref: float, tbt_ref: float, token_budget: int, seed: int,
              low: float = 0.5, high: float = 2.5) -> Tuple[np.ndarray, np.ndarray]:
    """Per-request (SLO_tft, SLO_tbt), the scales drawn independently from U[low, high] with ``seed``."""
    if not 0 < low <= high:
        raise ConfigError(f"SLO scale range [{low}, {high}]: allowed 0 < low <= high")
    rng = np.random.default_rng(seed)
    n = len(prompt)
    chunks = np.ceil(np.asarray(prompt, dtype=float) / float(token_budget))
    return rng.uniform(low, high, n) * ttft_ref * chunks, rng.uniform(low, high, n) * tbt_ref


def attainment(req: pd.DataFrame, slo_tft: np.ndarray, slo_tbt: np.ndarray) -> Tuple[float, float]:
    """(TTFT attainment, TBT attainment); requests in ``request_id`` order, the SLOs in the same order."""
    req = req.sort_values("request_id")
    done = (req["state"] == "done").to_numpy()
    ttft_ok = done & (req["ttft"].to_numpy() <= slo_tft)
    tbt_ok = done & (req["max_tbt"].fillna(0.0).to_numpy() <= slo_tbt)
    return float(ttft_ok.mean()), float(tbt_ok.mean())


def tails(req: pd.DataFrame) -> dict:
    done = req[req["state"] == "done"]
    return {"ttft_p99": float(done["ttft"].quantile(0.99)), "ttft_p95": float(done["ttft"].quantile(0.95)),
            "worst_gap_p99": float(done["max_tbt"].quantile(0.99)),
            "worst_gap_p95": float(done["max_tbt"].quantile(0.95)),
            "normalized_latency": float((done["e2e_latency"] / done["output_tokens"]).mean())}


def time_split(req: pd.DataFrame) -> dict:
    """Mean waiting, execution and preemption time of finished requests (Sec. 2.2), seconds."""
    done = req[req["state"] == "done"]
    preempted = done["preempted_seconds"] if "preempted_seconds" in done else pd.Series(0.0, index=done.index)
    waiting = done["first_scheduled_time"] - done["arrival_time"]
    execution = done["completion_time"] - done["first_scheduled_time"] - preempted
    return {"waiting": float(waiting.mean()), "execution": float(execution.mean()),
            "preemption": float(preempted.mean()), "preemptions": float(done["preemptions"].mean())}


def sustainable_rate(rates: np.ndarray, normalized_latency: np.ndarray, target: float) -> float:
    """The highest rate with normalized latency <= target, interpolated between measured rates (nan if none)."""
    order = np.argsort(rates)
    r, y = np.asarray(rates, dtype=float)[order], np.asarray(normalized_latency, dtype=float)[order]
    if not len(r) or y[0] > target:
        return float("nan")
    for k in range(1, len(r)):
        if y[k] > target:  # crosses between k - 1 and k
            return float(r[k - 1] + (target - y[k - 1]) * (r[k] - r[k - 1]) / (y[k] - y[k - 1]))
    return float(r[-1])
