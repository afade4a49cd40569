"""Offered load relative to the hardware's capacity (``demand.load``), so that GPUs are compared at equal load.

A hardware study compares GPUs "at equal offered load relative to each GPU's capacity" (issue 48): the same arrival
rate is light on an H200 and overload on an A40. With ``demand.load = rho`` the Poisson rate is

    rate = rho * capacity,   capacity = N / makespan of vLLM serving the run's N requests, all arriving at once,

vLLM as ``+policy=vllm`` composes it on ``memory=paged`` with the run's own KV capacity (``memory.capacity_tokens``,
``auto`` from the GPU's memory), latency model, swap model and model/hardware: the throughput in requests per
second this hardware sustains on these requests when it always has work (the saturation throughput; vLLM as the
reference because every paper compares against it). rho < 1 is a stable queue for vLLM, rho > 1 an overloaded one
(the MC-SF paper's high demand). The capacity and the rate are recorded in the run's summary (``offered_load``).
The capacity run is deterministic (no randomness: all arrivals at 0, true lengths) and memoised per process.
The capacity run's memory is ``memory=paged`` as composed (blocks of 16, vLLM's watermark, 4 GB of swap, no prefix
caching) with the run's capacity in tokens, whatever the run's own memory settings: a capacity of the hardware for
these requests, the same for every policy and memory setting compared on it. One replica only: a cluster's capacity depends on its router, so ``demand.load`` with ``cluster.replicas > 1`` is
refused (give ``demand.rate``).
"""
from __future__ import annotations

import hashlib
from typing import Callable, Dict

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from kvstudy.errors import ConfigError

_MEMO: Dict[tuple, float] = {}


def capacity_rate(cfg, arch, hw, capacity: int, latency, prompt: np.ndarray, output: np.ndarray) -> float:
    """Requests per second vLLM completes when these requests all arrive at time 0 (module docstring)."""
    from kvstudy.engine.assembly import build_engine
    from kvstudy.running.compose import compose_group, compose_policy
    from kvstudy.running.targets import instantiate
    from kvstudy.workloads.requests import make_requests

    prompt = np.asarray(prompt, dtype=np.int64)
    output = np.asarray(output, dtype=np.int64)
    digest = hashlib.sha256(prompt.tobytes() + b"|" + output.tobytes()).hexdigest()
    swap = OmegaConf.to_container(cfg.swap, resolve=True)
    # the latency model by what it is, not how it was loaded (Vidur's describe() has the load's time and source)
    timing = {k: v for k, v in latency.describe().items() if k not in ("load_seconds", "source")}
    key = (arch.fingerprint(), repr(hw), int(capacity), repr(sorted(timing.items())), repr(swap), digest)
    if key in _MEMO:
        return _MEMO[key]
    requests = make_requests(np.zeros(len(prompt)), prompt, output, source="offered_load capacity")
    policy = instantiate(compose_policy("vllm"))
    policy.reset(0)  # nothing random in vLLM's policy; reset as every run's policy is (assemble._prepared_engine)
    memory = instantiate(compose_group("memory", "paged"), capacity_tokens=int(capacity))
    engine = build_engine(requests, output.copy(), policy, latency, memory, instantiate(cfg.swap), arch, hw,
                          stall_limit=int(cfg.engine.stall_limit), max_iterations=int(cfg.engine.max_iterations),
                          progress=False)
    result = engine.run()
    done = result.requests["state"] == "done"
    if result.status != "completed" or not done.any():
        raise ConfigError(f"demand.load: the capacity run (vLLM serving the run's {len(prompt)} requests at once on "
                          f"hardware '{hw.name}', {capacity:,} KV tokens) ended {result.status}: {result.message}; "
                          f"give demand.rate instead")
    makespan = float(result.requests.loc[done, "completion_time"].max())
    rate = float(done.sum()) / makespan
    _MEMO[key] = rate
    return rate


def rate_function(cfg, arch, hw, capacity: int, latency) -> Callable[[pd.DataFrame], float]:
    """``df -> capacity in requests/s`` for a workload's lengths, on this run's hardware (``build_requests``'s
    ``capacity_of``)."""
    def capacity_of(df: pd.DataFrame) -> float:
        return capacity_rate(cfg, arch, hw, capacity, latency, df["prompt_tokens"].to_numpy(),
                             df["output_tokens"].to_numpy())
    return capacity_of
