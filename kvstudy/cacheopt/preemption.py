"""CacheOPT's preemption policy and strategy selection (Shen et al., Secs. 3.4-3.5; spec B2.6, B2.7).

Victim order: three bucketed keys. The TBT-SLO buckets are [0.05, 0.2), [0.2, 0.5) and [0.5, 2] s. Remaining
predicted output tokens and KV tokens held use 128-token buckets. The sort key is (loosest TBT SLO first, most
remaining work first, least KV held first), i.e. FCFS is replaced by SLO slack, then SRTF, then LKVO. Ties keep the
given order.

Swap or recompute: swap when the victim's sequence length S exceeds the sweet spot S_s, where the fitted
recompute and swap latencies cross (kvstudy/costs/preemption_cost.py fits both); otherwise recompute. With no crossing
(S_s = None), the cheaper side at S is taken.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Callable, Optional, Sequence

TBT_EDGES = (0.05, 0.2, 0.5)  # bucket 0: below 0.05 s, 1: [0.05, 0.2), 2: [0.2, 0.5), 3: [0.5, ...)
TOKEN_BUCKET = 128


def tbt_bucket(slo_tbt: float) -> int:
    # numpy's searchsorted(TBT_EDGES, slo_tbt, side="right") for one value, without making an array of the edges at
    # each call (a tenth of CacheOPT's step went there, issue 59); NaN lands past the last edge in both
    return bisect_right(TBT_EDGES, slo_tbt)


def token_bucket(tokens: int) -> int:
    return int(tokens) // TOKEN_BUCKET


def victim_order(slo_tbt: Sequence[float], remaining: Sequence[int], kv_held: Sequence[int]) -> list:
    """Positions of the running requests, first victim first (B2.6)."""
    keys = [(-tbt_bucket(s), -token_bucket(r), token_bucket(k), pos)
            for pos, (s, r, k) in enumerate(zip(slo_tbt, remaining, kv_held))]
    return [k[-1] for k in sorted(keys)]


def choose_mode(seq_len: int, sweet_spot: Optional[float],
                recompute_s: Optional[Callable[[float], float]] = None,
                swap_s: Optional[Callable[[float], float]] = None) -> str:
    """``swap`` above the sweet spot, ``recompute`` at or below it (B2.7); without a crossing, the cheaper one."""
    if sweet_spot is not None:
        return "swap" if seq_len > sweet_spot else "recompute"
    if recompute_s is None or swap_s is None:
        raise ValueError("without a sweet spot, choose_mode needs both cost functions")
    return "swap" if swap_s(seq_len) < recompute_s(seq_len) else "recompute"
