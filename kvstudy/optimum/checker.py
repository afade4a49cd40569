"""Independent feasibility check of a schedule for the IP (1)-(4), written from the model text only:
every request starts once, at or after its arrival; at every round t the requests started at k with
k + 1 <= t <= k + o hold s + t - k tokens and their sum is at most M."""
from __future__ import annotations

import numpy as np

from kvstudy.optimum.instance import Instance


class InfeasibleSchedule(ValueError):
    pass


def total_latency(inst: Instance, start: np.ndarray) -> int:
    """Objective (1): sum of (start + o - a)."""
    return int(np.sum(np.asarray(start) + inst.output - inst.arrival))


def memory_use(inst: Instance, start, horizon: int, mask=None) -> np.ndarray:
    """Tokens held in each round 0..horizon by the requests (all, or those selected by ``mask``): a request
    started at k holds s + t - k tokens in rounds k + 1 .. k + o."""
    start = np.asarray(start, dtype=np.int64)
    keep = np.ones(inst.n, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    memory = np.zeros(horizon + 1, dtype=np.int64)
    for k, s, o in zip(start[keep], inst.prompt[keep], inst.output[keep]):
        t = np.arange(k + 1, k + o + 1)
        memory[t] += s + t - k
    return memory


def check(inst: Instance, start) -> int:
    start = np.asarray(start, dtype=np.int64)
    if start.shape != (inst.n,):
        raise InfeasibleSchedule(f"expected {inst.n} start rounds, got shape {start.shape}")
    early = np.flatnonzero(start < inst.arrival)
    if len(early):
        i = int(early[0])
        raise InfeasibleSchedule(f"request {i} starts at {start[i]} before its arrival {inst.arrival[i]}")
    memory = memory_use(inst, start, int((start + inst.output).max()) + 1)
    over = np.flatnonzero(memory > inst.capacity)
    if len(over):
        t = int(over[0])
        raise InfeasibleSchedule(f"round {t} uses {memory[t]} tokens > M = {inst.capacity}")
    return total_latency(inst, start)
