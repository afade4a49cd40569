"""Better schedules than MC-SF's by large-neighbourhood search (LNS) on the IP (1)-(4).

A move frees the ``window`` requests that are consecutive in the current start order, keeps every other
request where it is, and solves the IP restricted to the freed requests exactly (``branch.py``'s
branch-and-bound on eqs. (1)-(4) with the memory of the fixed requests subtracted from M round by round). Freed requests may start
anywhere from ``pad`` rounds before the earliest of them to ``pad`` rounds after the latest (never before their
arrival). Any schedule of the freed requests that fits the residual memory keeps the whole schedule feasible,
so each accepted move strictly lowers the total latency of a feasible schedule; the checker verifies the final
one independently. Windows slide by half their width (the last one ends at the last request); passes repeat until one
finds nothing.

This is a heuristic for the *upper* end of OPT: it never proves optimality. Its purpose is to give the ratio
MC-SF / best-known-schedule the role the paper's Gurobi incumbents play (Sec. 5.1), while the lower end comes
from the bounds (``bounds.py``) and the exact IP where it finishes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from kvstudy.optimum import branch
from kvstudy.optimum.checker import check, memory_use
from kvstudy.optimum.instance import Instance


@dataclass
class LNSResult:
    start: np.ndarray
    objective: int
    initial: int
    moves: int  # accepted improving moves
    solves: int  # sub-IPs solved
    unproven_solves: int  # sub-problems stopped by their node or time limit (their incumbent is still feasible)
    seconds: float


def _solve_window(inst: Instance, start: np.ndarray, free: np.ndarray, pad: int, time_limit: float,
                  node_limit: int):
    """Exact sub-problem over the freed requests (branch.py); returns (new starts for ``free``, proven?)."""
    horizon = int((start + inst.output).max()) + pad + int(inst.output.max()) + 2
    fixed = np.ones(inst.n, dtype=bool)
    fixed[free] = False
    budget = inst.capacity - memory_use(inst, start, horizon, fixed)
    result = branch.solve(inst.arrival[free], inst.prompt[free], inst.output[free], budget,
                          incumbent=start[free], lo=int(start[free].min()) - pad, hi=int(start[free].max()) + pad,
                          time_limit=time_limit, node_limit=node_limit)
    return result.start, result.proven


def improve(inst: Instance, start, window: int = 5, pad: int = 10, max_passes: int = 2,
            node_limit: int = 50_000, time_limit: float = 60.0, budget: float = float("inf")) -> LNSResult:
    """Slide a window of ``window`` consecutive requests (in start order) over the schedule and re-solve it
    exactly; stop after a pass without improvement or ``max_passes`` passes. ``node_limit`` caps each
    sub-problem's search deterministically (same input, same result on any machine); ``time_limit`` (per
    sub-problem) and ``budget`` (whole search) are wall-clock safety stops that make results machine-dependent
    only when they trigger."""
    started = time.perf_counter()
    start = np.asarray(start, dtype=np.int64).copy()
    best = initial = check(inst, start)
    moves = solves = unproven = 0
    window = min(window, inst.n)
    for _ in range(max_passes):
        improved = False
        order = np.argsort(start, kind="stable")
        firsts = list(range(0, inst.n - window + 1, max(1, window // 2)))
        if firsts[-1] != inst.n - window:  # the last window always ends at the last request
            firsts.append(inst.n - window)
        for first in firsts:
            if time.perf_counter() - started > budget:
                break
            free = np.sort(order[first:first + window])
            new_free, proven = _solve_window(inst, start, free, pad, time_limit, node_limit)
            solves += 1
            unproven += not proven
            candidate = start.copy()
            candidate[free] = new_free
            value = check(inst, candidate)  # every accepted schedule is independently checked
            if value < best:
                start, best, moves, improved = candidate, value, moves + 1, True
                order = np.argsort(start, kind="stable")
        if not improved or time.perf_counter() - started > budget:
            break
    return LNSResult(start, best, initial, moves, solves, unproven, time.perf_counter() - started)


__all__ = ["LNSResult", "improve"]
