"""Exact branch-and-bound for the IP (1)-(4) on a few requests under a round-by-round memory budget.

Given requests (a, s, o) and a residual budget r(t) (M minus the memory of requests held fixed, or M itself),
find start rounds minimising sum(start) such that in every round the freed requests' memory fits r(t)
(checker.py's convention: started at k, a request holds s + t - k tokens in rounds k + 1 .. k + o).

Search: schedules are built in non-decreasing start order (ties in increasing request index, and identical
requests in index order: both only remove duplicate orderings of the same schedule). A node fixes a prefix of
that order; its children choose the next request j and its start p >= the last start, among the rounds where j
fits the budget left by the prefix. "Fits" is one vectorised test: with g(t) = r(t) - t, request j fits at p iff
min g over rounds p+1..p+o is >= s - p. Bound: every unplaced request starts no earlier than the last start and
no earlier than its first fitting round in the current budget (the budget only shrinks deeper in the tree),
so  cost + sum_i max(p_last, e_i)  is a valid lower bound; children are cut when it reaches the incumbent.

Exact when it returns ``proven=True``; a node or time limit returns the incumbent with ``proven=False``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from kvstudy.optimum.bounds import heavy_completion_bound


@dataclass
class BranchResult:
    start: np.ndarray
    cost: int  # sum of start rounds
    proven: bool
    nodes: int
    seconds: float


class _Limit(Exception):
    pass


def solve(arrival, prompt, output, budget, incumbent=None, lo: int = 0, hi: int | None = None,
          node_limit: int = 2_000_000, time_limit: float = 60.0) -> BranchResult:
    """Minimise sum(start) with every start in [max(lo, a_j), hi]. ``budget[t]`` is the memory available in
    round t (rounds past its end have none). ``incumbent``: a feasible start vector to beat (optional)."""
    a = np.asarray(arrival, dtype=np.int64)
    s = np.asarray(prompt, dtype=np.int64)
    o = np.asarray(output, dtype=np.int64)
    r = np.asarray(budget, dtype=np.int64).copy()
    n = len(a)
    H = len(r) - 1
    hi = H if hi is None else min(hi, H)
    started = time.perf_counter()
    best_cost = np.iinfo(np.int64).max
    best = None
    if incumbent is not None:
        best = np.asarray(incumbent, dtype=np.int64).copy()
        best_cost = int(best.sum())
    twin = [[k for k in range(i) if a[k] == a[i] and s[k] == s[i] and o[k] == o[i]] for i in range(n)]
    lower = np.maximum(a, lo)
    ramp = [np.arange(1, int(o[j]) + 1, dtype=np.int64) + s[j] for j in range(n)]
    idx = np.arange(H + 1, dtype=np.int64)
    nodes = 0
    placed = np.full(n, -1, dtype=np.int64)
    seen: dict = {}

    def fitting(j: int, first: int) -> np.ndarray:
        """Rounds p in [first, hi] (ascending) where request j fits the current budget."""
        oj = int(o[j])
        last = min(hi, H - oj)
        if last < first:
            return np.empty(0, dtype=np.int64)
        g = r[first + 1:last + oj + 1] - idx[first + 1:last + oj + 1]
        win = sliding_window_view(g, oj).min(axis=1)
        p = idx[first:last + 1]
        return p[win >= s[j] - p]

    def search(cost: int, p_last: int, j_last: int, remaining: list) -> None:
        nonlocal best_cost, best, nodes
        nodes += 1
        if nodes > node_limit or (nodes & 1023) == 0 and time.perf_counter() - started > time_limit:
            raise _Limit
        if not remaining:
            if cost < best_cost:
                best_cost, best = cost, placed.copy()
            return
        # Dominance: the future depends only on which requests are placed, the last start (and index, for the
        # tie rule) and the placed requests still holding memory after it. Reached again at no lower cost:
        # nothing new below this node.
        key = (frozenset(remaining), p_last, j_last,
               tuple((j, int(placed[j])) for j in range(n) if placed[j] >= 0 and placed[j] + o[j] > p_last))
        if seen.get(key, best_cost + 1) <= cost:
            return
        seen[key] = cost
        options = {}
        earliest = {}
        for j in remaining:
            first = max(int(lower[j]), p_last)
            for k in twin[j]:  # identical requests start in index order
                if placed[k] >= 0:
                    first = max(first, int(placed[k]))
            ps = fitting(j, first)
            if len(ps) == 0:
                return  # j can never be placed below this node
            options[j] = ps
            earliest[j] = int(ps[0])
        if cost + sum(earliest.values()) >= best_cost:  # every earliest start is already >= p_last
            return
        # Heavy tails and the gaps after them (bounds.heavy_completion_bound, with the largest budget still
        # ahead as capacity) bound the sum of the heavy requests' completions, hence of their starts.
        capacity = int(r[p_last + 1:].max()) if p_last + 1 <= H else 0
        heavy_sum, heavy = heavy_completion_bound([earliest[j] for j in remaining], s[remaining], o[remaining],
                                                  capacity)
        if heavy.sum() > 1:
            light = sum(earliest[j] for j, h in zip(remaining, heavy) if not h)
            if cost + light + heavy_sum - int(o[remaining][heavy].sum()) >= best_cost:
                return
        # Try requests with the earliest feasible start first (shortest output breaks ties), as MC-SF would.
        for j in sorted(remaining, key=lambda q: (earliest[q], o[q], q)):
            if any(placed[k] < 0 for k in twin[j]):
                continue
            others = [earliest[i] for i in remaining if i != j]
            rest = [q for q in remaining if q != j]
            for p in options[j]:
                p = int(p)
                if p == p_last and j < j_last:
                    continue
                # children start no earlier than p
                bound = cost + p + sum(max(p, e) for e in others)
                if bound >= best_cost:
                    break
                oj = int(o[j])
                r[p + 1:p + oj + 1] -= ramp[j]
                placed[j] = p
                search(cost + p, p, j, rest)
                placed[j] = -1
                r[p + 1:p + oj + 1] += ramp[j]

    proven = True
    try:
        search(0, int(lower.min()) if n else 0, -1, list(range(n)))
    except _Limit:
        proven = False
    if best is None:
        best = np.full(n, -1, dtype=np.int64)
    return BranchResult(best, int(best_cost) if best_cost < np.iinfo(np.int64).max else -1, proven, nodes,
                        time.perf_counter() - started)


def solve_instance(inst, warm_start=None, time_limit: float = 60.0):
    """The whole instance (budget M in every round up to the valid horizon), reported like ``ip.solve``: the
    status is "optimal" only when the search finished; otherwise the bound is ``bounds.best_bound``."""
    from kvstudy.optimum.bounds import best_bound
    from kvstudy.optimum.checker import check
    from kvstudy.optimum.ip import IPResult

    budget = np.full(inst.horizon() + 1, inst.capacity, dtype=np.int64)
    res = solve(inst.arrival, inst.prompt, inst.output, budget, incumbent=warm_start, time_limit=time_limit,
                node_limit=10**12)
    objective = check(inst, res.start) if res.start.min() >= 0 else None
    bound = float(objective) if res.proven and objective is not None else best_bound(inst)
    gap = (objective - bound) / objective if objective else float("nan")
    return IPResult("optimal" if res.proven else "time_limit", objective, bound, gap,
                    res.start if objective is not None else None, res.seconds, inst.n, res.nodes)


__all__ = ["BranchResult", "solve", "solve_instance"]
