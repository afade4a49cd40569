"""Lower bounds on the optimal total latency that scale to 1,000+ requests (Jaillet et al., Lemma 4.7).

``volume_bound``: the LP (9) relaxation. A request with output o and prompt s occupies
vol = s*o + o(o+1)/2 token-rounds, all inside rounds 1..c where c is its completion round, and M
token-rounds are available per round; so the volume of requests completed by round t is at most t*M.
Minimising the sum of completion rounds under that constraint alone is solved exactly by filling rounds
in increasing order of volume (the exchange argument after LP (9)), fractionally. With arrivals the
bound on total latency is LP9 - sum(a), since sum(c) >= LP9 for any feasible schedule. Every request
also needs at least o rounds after arriving, so latency >= sum(o); the bound is the larger of the two.
"""
from __future__ import annotations

import numpy as np

from kvstudy.optimum.instance import Instance


def lp9_sum_of_completions(prompt, output, capacity: int) -> float:
    s = np.asarray(prompt, float)
    o = np.asarray(output, float)
    vol = np.sort(s * o + o * (o + 1) / 2)
    # Fractional filling: a request completes (as a fraction) when the cumulative volume reaches it; in the
    # LP a unit of request assigned to round t costs t, rounds hold M volume each. Item k occupies the
    # cumulative-volume interval [V_{k-1}, V_k]; the part in round t (volume ((t-1)M, tM]) has weight
    # (overlap / vol_k) and costs t.
    total = 0.0
    cum_prev = 0.0
    for v in vol:
        lo, hi = cum_prev, cum_prev + v
        t_lo = int(np.floor(lo / capacity)) + 1
        t_hi = int(np.ceil(hi / capacity))
        ts = np.arange(t_lo, t_hi + 1)
        overlap = np.minimum(hi, ts * capacity) - np.maximum(lo, (ts - 1) * capacity)
        total += float(np.sum(ts * np.clip(overlap, 0, None)) / v)
        cum_prev = hi
    return total


def volume_bound(inst: Instance) -> float:
    lp9 = lp9_sum_of_completions(inst.prompt, inst.output, inst.capacity) - float(np.sum(inst.arrival))
    return max(lp9, float(np.sum(inst.output)))
