"""What a policy may prepare before a run, and the hook through which it does (issue 34, item 4).

A policy that needs more than its config before the first iteration (CacheOPT: SLOs drawn from reference runs of
other systems, error ranges from a calibration split, swap/recompute regressors) implements

* ``before_run(ctx: RunContext) -> dict | None``: called once per run, before ``reset(seed)``; returns extra inputs for the engine (today only ``direction``: CacheOPT's deviation-direction classifier, which
  the engine shows through ``StepView.direction``), or None;
* ``after_run(result, ctx)`` (optional): annotate the engine's result (columns of its requests table, entries of
  ``result.extra``) once the run has ended.

The API calls the two hooks for every policy that has them and knows no policy by name. ``RunContext`` carries what
the run has built (requests, predictions, model, hardware, latency model, KV capacity, the composed config) and the
means to run other configurations (``simulate``, ``build_requests``, ``compose_policy``, ``instantiate``), so a
policy's set-up never imports ``kvstudy.api`` (no import circle: api -> policy set-up -> api).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from kvstudy.engine.states import PolicyError

#: the engine inputs a ``before_run`` hook may return (StepEngine's keyword arguments)
ENGINE_INPUTS = ("direction",)


@dataclass
class RunContext:
    cfg: Any  # the run's composed config (omegaconf.DictConfig)
    requests: Any  # kvstudy.workloads.requests.Requests
    predicted: np.ndarray
    arch: Any  # kvstudy.costs.arch.ModelArch
    hardware: Any  # kvstudy.latency.tables.HardwareSpec
    latency: Any
    capacity: int  # KV capacity in tokens
    seed: int
    #: ``simulate(cfg) -> (EngineResult, summary)``: run another configuration in this process (reference systems)
    simulate: Callable
    #: ``build_requests(cfg, arch, seed_sequence) -> (Requests, predicted)``: the requests another config draws
    build_requests: Callable
    #: ``compose_policy(name) -> DictConfig``: conf/policy/<name>.yaml as composed (inside a sweep, by its own Hydra)
    compose_policy: Callable
    #: ``instantiate(node, **kwargs)``: build a ``_target_`` node of the config (the swap model, say)
    instantiate: Callable


def engine_inputs(policy, returned) -> dict:
    """A ``before_run`` hook's answer checked: None or a dict of ``ENGINE_INPUTS`` keys."""
    if returned is None:
        return {}
    name = getattr(policy, "name", type(policy).__name__)
    if not isinstance(returned, dict) or set(returned) - set(ENGINE_INPUTS):
        raise PolicyError(f"policy '{name}': before_run returns None or a dict with keys among {ENGINE_INPUTS}, "
                          f"got {returned!r:.80}")
    return dict(returned)
