"""Run an online policy (MC-SF by default) on an Instance with the paper's unit-time model, through
kvstudy's own engine, and return its start rounds (and its total latency)."""
from __future__ import annotations

from typing import Tuple

import numpy as np

from kvstudy.engine import Engine
from kvstudy.latency.models import UnitLatency
from kvstudy.optimum.instance import Instance
from kvstudy.policies.base import Policy
from kvstudy.workloads.requests import make_requests


def run(inst: Instance, policy: Policy, seed: int = 0) -> Tuple[np.ndarray, int, int]:
    """(first start round per request, total latency sum(completion - arrival), preemptions). A policy that
    preempts (clears and restarts requests) has a schedule outside the IP's non-preemptive model; its total
    latency is still what it achieved."""
    req = make_requests(inst.arrival.astype(float), inst.prompt, inst.output, source="instance", sort="error")
    policy.reset(seed)
    result = Engine(req, req.output_tokens, policy, UnitLatency(), inst.capacity).run()
    if result.status != "completed":
        raise RuntimeError(f"policy '{policy.name}' did not complete the instance: {result.status} {result.message}")
    table = result.requests.sort_values("request_id")
    start = table["first_scheduled_time"].to_numpy().astype(np.int64)
    return start, int(round(table["e2e_latency"].sum())), int(table["preemptions"].sum())


def starts(inst: Instance, policy: Policy, seed: int = 0) -> np.ndarray:
    return run(inst, policy, seed)[0]
