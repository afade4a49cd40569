"""Lower bounds on the optimal total latency that scale to 1,000+ requests.

``volume_bound``: the LP (9) relaxation. A request with output o and prompt s occupies
vol = s*o + o(o+1)/2 token-rounds, all inside rounds 1..c where c is its completion round, and M
token-rounds are available per round; so the volume of requests completed by round t is at most t*M.
Minimising the sum of completion rounds under that constraint alone is solved exactly by filling rounds
in increasing order of volume (the exchange argument after LP (9)), fractionally. With arrivals the
bound on total latency is LP9 - sum(a), since sum(c) >= LP9 for any feasible schedule. Every request
also needs at least o rounds after arriving, so latency >= sum(o); the bound is the larger of the two.

``block_bound``: heavy tails with their after-gaps on one machine (derived here, not in the paper; see
``heavy_completion_bound``). On the Sec. 5.1 instances it beats the volume bound in 169 of 200 Arrival Model 1
and 198 of 200 Model 2 trials; it adds nothing when no request peaks above M/2 (e.g. LMSYS-like workloads at
M = 16,492). ``best_bound`` is the larger of the two; both take O(n log n).
"""
from __future__ import annotations

import heapq

import numpy as np

from kvstudy.optimum.instance import Instance


def srpt_sum_of_completions(release, processing) -> int:
    """Optimal sum of completion times on one machine with release dates and preemption (SRPT rule)."""
    jobs = sorted(zip(release, processing))
    left = []
    t = total = 0
    i = 0
    while i < len(jobs) or left:
        if not left and t < jobs[i][0]:
            t = jobs[i][0]
        while i < len(jobs) and jobs[i][0] <= t:
            heapq.heappush(left, jobs[i][1])
            i += 1
        rem = heapq.heappop(left)
        next_release = jobs[i][0] if i < len(jobs) else None
        if next_release is not None and t + rem > next_release:
            heapq.heappush(left, rem - (next_release - t))
            t = next_release
        else:
            t += rem
            total += t
    return total


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


def heavy_blocks(prompt, output, capacity: int):
    """(heavy mask, tail length L, gap beta) per request, zero where not heavy; see ``heavy_completion_bound``.
    Heavy request i started at k occupies the block of rounds k + o - L + 1 .. k + o + beta, and the blocks of
    any two heavy requests are disjoint in every feasible schedule."""
    s, o = np.asarray(prompt, dtype=np.int64), np.asarray(output, dtype=np.int64)
    theta = int(capacity) // 2
    peak = s + o
    heavy = peak > theta
    s_max = int(s[heavy].max()) if heavy.any() else 0
    tail = np.where(heavy, np.minimum(o, peak - theta), 0)
    beta = np.where(heavy, np.maximum(0, np.minimum(peak + theta - capacity, theta - s_max)), 0)
    return heavy, tail, beta


def heavy_completion_bound(earliest_start, prompt, output, capacity: int):
    """Lower bound on the sum of completion rounds of the *heavy* requests, and their mask.

    Rounds follow ``checker.py``: started at S, a request holds s + t - S tokens in rounds S+1 .. C, C = S + o,
    peaking at P = s + o in round C. Let theta = capacity // 2 and call a request heavy if P > theta.
    (i) Its *tail*, the rounds where it holds more than theta tokens, is its last L = min(o, P - theta)
        rounds, and two tails never share a round (2 (theta + 1) > capacity).
    (ii) If heavy j finishes after heavy i, at least beta_i = max(0, min(P_i + theta - capacity,
        theta - s_max)) rounds separate i's tail from j's (s_max: the largest prompt of a heavy request).
        If j is active in round C_i it holds at most capacity - P_i tokens there, gains one per round and
        enters its tail above theta, so theta - (capacity - P_i) rounds pass first; if j starts at or after
        C_i it holds s_j + 1 in its first round, so theta - s_j rounds pass before its tail.
    So the blocks [C_i - L_i + 1, C_i + beta_i] of the heavy requests are disjoint: a one-machine schedule of
    jobs with processing L + beta, released at earliest_start + o - L. Its optimal sum of completions with
    preemption allowed (SRPT) is at most sum(C + beta) of any feasible schedule, so
    sum_heavy C >= SRPT - sum(beta). With capacity = max memory available in the rounds ahead it also holds
    under a round-by-round budget below M (branch.py)."""
    e, o = np.asarray(earliest_start, dtype=np.int64), np.asarray(output, dtype=np.int64)
    heavy, tail, beta = heavy_blocks(prompt, output, capacity)
    if not heavy.any():
        return 0, heavy
    tail, beta = tail[heavy], beta[heavy]
    blocks = srpt_sum_of_completions((e[heavy] + o[heavy] - tail).tolist(), (tail + beta).tolist())
    return int(blocks - beta.sum()), heavy


def block_bound(inst: Instance) -> float:
    """Total-latency bound from ``heavy_completion_bound``: heavy requests by their blocks, the others by
    a + o (they cannot finish sooner)."""
    heavy_sum, heavy = heavy_completion_bound(inst.arrival, inst.prompt, inst.output, inst.capacity)
    light = inst.arrival[~heavy] + inst.output[~heavy]
    return float(heavy_sum + light.sum() - inst.arrival.sum())


def best_bound(inst: Instance) -> float:
    """The larger of ``volume_bound`` and ``block_bound``."""
    return max(volume_bound(inst), block_bound(inst))


def latest_starts(inst: Instance, upper: float) -> np.ndarray:
    """Per request, the latest start any schedule of total latency <= ``upper`` can give it.

    Dropping request i from a feasible schedule leaves a feasible schedule of the other requests, so their
    total latency is at least L_i = ceil(best_bound(instance without i)) (latencies are integers), and
    S_i + o_i - a_i <= upper - L_i. With ``upper`` the value of a known schedule, every optimal schedule (and
    that schedule) keeps S_i <= floor(upper) - L_i - o_i + a_i, so the IP needs no start variable past it.
    Measured on Sec. 5.1 draws: on small Arrival Model 2 ones (n = 18-20) it removes 12-41% of the variables
    of ``Instance.horizon``; at the paper's sizes the bounds sit ~30% below the best schedules and it
    removes none."""
    n = inst.n
    latest = np.empty(n, dtype=np.int64)
    for i in range(n):
        rest = 0
        if n > 1:
            keep = np.arange(n) != i
            others = Instance(inst.arrival[keep], inst.prompt[keep], inst.output[keep], inst.capacity)
            rest = int(np.ceil(best_bound(others) - 1e-9))
        latest[i] = int(np.floor(upper + 1e-9)) - rest - inst.output[i] + inst.arrival[i]
    return latest
