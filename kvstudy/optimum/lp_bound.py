"""The LP relaxation of the IP (1)-(4) made small enough for 1,000+ requests, still a valid lower bound.

Start rounds are grouped into buckets of ``bucket`` consecutive rounds and memory rows are kept only every
``row_step`` rounds. Variable y[i, b] is the fraction of request i starting in bucket b (sum_b y[i, b] = 1). Its
cost is the earliest round of the bucket it may use (max(a_i, first round of b)); its memory coefficient in a
kept round t is the *least* memory i can hold at t over all starts k in the bucket (0 if some such k leaves i
inactive at t, else s_i + t - k_max). Any feasible integer schedule gives a feasible y (put i in the bucket of
its start) whose cost is at most its true sum of starts, and dropping rows only enlarges the feasible set, so
the LP optimum plus sum(o - a) is a lower bound on OPT's total latency. ``bucket=1, row_step=1`` is exactly the
LP relaxation of (1)-(4) over the horizon of ``Instance.horizon``.

Any horizon T is allowed, because every request also gets an *overflow* variable "starts after T" with cost
T + 1 and no memory, and only rows t <= T are kept: a schedule that starts i after T maps to it at a cost no
higher than its own. So T may be far below the valid completion horizon of ``Instance.horizon`` (max a +
sum(o + 1), loose when many requests run at once), e.g. a known schedule's makespan; a smaller T is faster and
gives a weaker but still valid bound.

``blocks`` (default) adds ``ip.block_rows`` for the rounds kept: a bucket's variable covers the rounds its heavy
block covers for every start in the bucket, so those rows stay valid; ``bucket=1`` then equals the relaxation
of ``ip.solve(..., blocks=True)``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from kvstudy.optimum.instance import Instance
from kvstudy.optimum.ip import block_rows, highs_model


@dataclass
class LPBound:
    value: float  # lower bound on total latency (objective (1))
    status: str
    seconds: float
    num_vars: int
    num_rows: int
    num_nonzeros: int


def lp_bound(inst: Instance, bucket: int = 1, row_step: int = 1, horizon: int | None = None,
             time_limit: float = 600.0, blocks: bool = True) -> LPBound:
    import highspy

    if bucket < 1 or row_step < 1:
        raise ValueError(f"bucket={bucket}, row_step={row_step}: both must be whole numbers >= 1")
    started = time.perf_counter()
    T = int(horizon or inst.horizon())
    rows_kept = np.arange(row_step, T + 1, row_step)  # rounds t >= 1 whose memory row is kept
    cost, eq_rows, mem_rows, mem_cols, mem_vals, k_lo, k_hi = [], [], [], [], [], [], []
    nvar = 0
    for i in range(inst.n):
        a, s, o = int(inst.arrival[i]), int(inst.prompt[i]), int(inst.output[i])
        last = T
        for b in range(a // bucket, last // bucket + 1):
            k_min = max(a, b * bucket)
            k_max = min(last, (b + 1) * bucket - 1)
            # rounds active for every k in [k_min, k_max]: k_max + 1 .. k_min + o
            lo_t, hi_t = k_max + 1, k_min + o
            if lo_t <= hi_t:
                first = np.searchsorted(rows_kept, lo_t)
                stop = np.searchsorted(rows_kept, hi_t, side="right")
                t = rows_kept[first:stop]
                mem_rows.append(np.arange(first, stop))
                mem_cols.append(np.full(len(t), nvar))
                mem_vals.append(s + t - k_max)
            cost.append(k_min)
            eq_rows.append(i)
            k_lo.append(k_min)
            k_hi.append(k_max)
            nvar += 1
        cost.append(max(a, T + 1))  # overflow: starts after the horizon
        eq_rows.append(i)
        k_lo.append(T + 1)  # its block lies after the horizon too
        k_hi.append(T + 1)
        nvar += 1
    cost = np.asarray(cost, dtype=float)
    eq = sparse.csr_matrix((np.ones(nvar), (np.asarray(eq_rows), np.arange(nvar))), shape=(inst.n, nvar))
    if mem_rows:
        mem = sparse.csr_matrix((np.concatenate(mem_vals).astype(float),
                                 (np.concatenate(mem_rows), np.concatenate(mem_cols))), shape=(len(rows_kept), nvar))
    else:
        mem = sparse.csr_matrix((len(rows_kept), nvar))
    packing = block_rows(inst, eq_rows, k_lo, k_hi, rows_kept) if blocks else None
    h, A = highs_model(cost, eq, mem, inst.capacity, float(np.sum(inst.output - inst.arrival)),
                       upper=highspy.kHighsInf, integer=False, time_limit=time_limit, packing=packing)
    h.run()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kOptimal:
        value, label = float(h.getInfo().objective_function_value), "optimal"
    else:
        # an LP stopped early gives no valid bound from its primal value; report the trivial one
        value, label = float(np.sum(inst.output)), f"stopped:{status}"
    return LPBound(value, label, time.perf_counter() - started, nvar, A.shape[0], A.nnz)


__all__ = ["LPBound", "lp_bound"]
