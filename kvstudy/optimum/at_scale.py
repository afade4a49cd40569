"""How far from optimal can a policy be on a 1,000+ request workload in the paper's unit-time model?

The IP is out of reach there, so we bound the gap from above: the policy's total latency (an upper bound on
OPT) over the best of three valid lower bounds on OPT, the Lemma 4.7 volume bound and the heavy-tail block
bound (``bounds.py``) and the bucketed LP relaxation of (1)-(4) (``lp_bound.py``). The workload comes from
the same Hydra configs as the real study (``+demand=high workload.num_requests=1000 model=... hardware=...``);
in the unit-time model one round is one time unit, so a request that arrives at time x is available from
round ceil(x), M is the configured KV capacity in tokens, and output lengths are the true ones (the paper's
model has exact lengths).
A policy that preempts (e.g. ``fcfs_watermark``) leaves the IP's non-preemptive model, but its latency over a
lower bound on OPT still bounds its ratio to the non-preemptive hindsight optimum from above.
"""
from __future__ import annotations

import math
import time

import numpy as np

from kvstudy.optimum.bounds import block_bound, volume_bound
from kvstudy.optimum.checker import check
from kvstudy.optimum.instance import Instance
from kvstudy.optimum.lp_bound import lp_bound
from kvstudy.optimum.online import run


def instance_from_config(overrides) -> tuple:
    from kvstudy import api

    cfg = api.compose(list(overrides))
    arch, _, capacity, _ = api.model_setup(cfg, latency=False)
    requests, _ = api.build_requests(cfg, arch, np.random.SeedSequence(int(cfg.seed)))
    inst = Instance(np.ceil(requests.arrival_time).astype(np.int64), requests.prompt_tokens.astype(np.int64),
                    requests.output_tokens.astype(np.int64), int(capacity))
    return inst, api.build_policy(cfg), cfg


def gap_bound(overrides=("+policy=mcsf",), buckets: int = 150, lp: bool = True, time_limit: float = 600.0) -> dict:
    """Policy latency, the lower bounds, and the ratio policy / best bound (>= the policy's true ratio)."""
    started = time.perf_counter()
    inst, policy, cfg = instance_from_config(overrides)
    start, latency, preemptions = run(inst, policy)
    if preemptions == 0:  # a non-preemptive schedule is a solution of the IP: check it independently
        assert check(inst, start) == latency, (check(inst, start), latency)
    makespan = int((start + inst.output).max())
    row = {"policy": cfg.policy.name, "n": inst.n, "M": inst.capacity, "policy_latency": latency,
           "preemptions": preemptions, "makespan": makespan, "volume_bound": volume_bound(inst),
           "block_bound": block_bound(inst)}
    best = max(row["volume_bound"], row["block_bound"])
    if lp:
        bucket = max(1, math.ceil(makespan / buckets))
        res = lp_bound(inst, bucket=bucket, row_step=bucket, horizon=makespan, time_limit=time_limit)
        row.update(lp_bound=res.value, lp_status=res.status, lp_seconds=round(res.seconds, 2), lp_bucket=bucket,
                   lp_vars=res.num_vars, lp_nonzeros=res.num_nonzeros)
        best = max(best, res.value)
    row.update(best_bound=best, ratio_at_most=latency / best, seconds=round(time.perf_counter() - started, 2))
    return row


__all__ = ["gap_bound", "instance_from_config"]
