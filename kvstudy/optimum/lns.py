"""Better schedules than MC-SF's by large-neighbourhood search (LNS) on the IP (1)-(4).

A move frees the ``window`` requests that are consecutive in the current start order, keeps every other
request where it is, and solves the IP restricted to the freed requests exactly (``branch.py``'s
branch-and-bound on eqs. (1)-(4) with the memory of the fixed requests subtracted from M round by round). Freed requests may start
anywhere from ``pad`` rounds before the earliest of them to ``pad`` rounds after the latest (never before their
arrival). Any schedule of the freed requests that fits the residual memory keeps the whole schedule feasible,
so each accepted move strictly lowers the total latency of a feasible schedule; the checker verifies the final
one independently. Windows slide by half their width (the last one ends at the last request); passes repeat until one
finds nothing.

A second family of moves (``span`` > 0) frees the requests *active* during a stretch of ``span`` rounds (those
whose rounds S+1 .. S+o meet it), for stretches starting every ``span // 2`` rounds; sets of fewer than 2 or
more than ``span_most`` requests are skipped and a set equal to the previous one is not solved again. It reaches
what consecutive windows cannot: a long request started early that holds the memory later requests need, which
sit far from it in start order. Example: the Sec. 5.1 Arrival Model 2 draw 13 cut to 10 requests, MC-SF 332,
consecutive windows 330, with span moves 261 = OPT (proven by the IP).

This is a heuristic for the *upper* end of OPT: it never proves optimality. Its purpose is to give the ratio
MC-SF / best-known-schedule the role the paper's Gurobi incumbents play (Sec. 5.1), while the lower end comes
from the bounds (``bounds.py``) and the exact IP where it finishes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from kvstudy.errors import ConfigError
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


def _neighbourhoods(inst: Instance, start: np.ndarray, window: int, span: int, span_most: int):
    """The freed sets of one pass, each computed from ``start`` as it stands when the set is reached (the
    caller updates ``start`` in place after an accepted move)."""
    firsts = list(range(0, inst.n - window + 1, max(1, window // 2)))
    if firsts[-1] != inst.n - window:  # the last window always ends at the last request
        firsts.append(inst.n - window)
    for first in firsts:
        yield np.sort(np.argsort(start, kind="stable")[first:first + window])
    if span <= 0:
        return
    previous = None
    stretch_start = 0
    while stretch_start < int((start + inst.output).max()):
        # active in some round of stretch_start + 1 .. stretch_start + span: S < stretch_start + span, C > stretch_start
        free = np.flatnonzero((start < stretch_start + span) & (start + inst.output > stretch_start))
        if 2 <= len(free) <= span_most and (previous is None or not np.array_equal(free, previous)):
            previous = free
            yield free
        stretch_start += max(1, span // 2)


def improve(inst: Instance, start, window: int = 5, pad: int = 10, max_passes: int = 2,
            node_limit: int = 50_000, time_limit: float = 60.0, budget: float = float("inf"),
            span: int = 0, span_most: int = 8) -> LNSResult:
    """Slide a window of ``window`` consecutive requests (in start order) over the schedule and re-solve it
    exactly, then (``span`` > 0) the sets of requests active in a stretch of ``span`` rounds (module
    docstring); stop after a pass without improvement or ``max_passes`` passes. ``node_limit`` caps each
    sub-problem's search deterministically (same input, same result on any machine); ``time_limit`` (per
    sub-problem) and ``budget`` (whole search) are wall-clock safety stops that make results machine-dependent
    only when they trigger."""
    if span < 0 or span_most < 2:
        raise ConfigError(f"LNS span={span}, span_most={span_most}: allowed span >= 0 (0: off) and span_most >= 2")
    started = time.perf_counter()
    start = np.asarray(start, dtype=np.int64).copy()
    best = initial = check(inst, start)
    moves = solves = unproven = 0
    window = min(window, inst.n)
    for _ in range(max_passes):
        improved = False
        for free in _neighbourhoods(inst, start, window, span, span_most):
            if time.perf_counter() - started > budget:
                break
            new_free, proven = _solve_window(inst, start, free, pad, time_limit, node_limit)
            solves += 1
            unproven += not proven
            candidate = start.copy()
            candidate[free] = new_free
            value = check(inst, candidate)  # every accepted schedule is independently checked
            if value < best:
                start[:], best, moves, improved = candidate, value, moves + 1, True
        if not improved or time.perf_counter() - started > budget:
            break
    return LNSResult(start, best, initial, moves, solves, unproven, time.perf_counter() - started)


__all__ = ["LNSResult", "improve"]
