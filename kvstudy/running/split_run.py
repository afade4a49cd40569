"""A disaggregated cluster's run (issue 57): the prefill pool's and the decode pool's engines built from their
replicas' setups (kvstudy/running/pool_setup.py), the handoffs wired to the links, the cluster driven
(kvstudy/cluster/disaggregated.py) and its records merged into one run's tables (the decode replica's row of each
handed-off request, with the handoff's columns, and the summary's ``disaggregation``).

A prefill replica's engine serves the prefill parts: the run's requests with one output token each (its prediction 1
as well), so its policy sees what a prefill instance sees; a decode replica's engine serves the whole requests (each
handed-off one joins it with its first token made)."""
from __future__ import annotations

import dataclasses
from typing import Callable, List, Tuple

import numpy as np
from omegaconf import DictConfig

from kvstudy.cluster.disaggregated import drive_split, handoff_columns, split_events, split_summary
from kvstudy.cluster.driver import merge
from kvstudy.cluster.handoff import Handoff, SenderLinks, link_seconds, read_handoff
from kvstudy.costs.swap_models import kv_bytes_per_gpu
from kvstudy.engine.states import EngineResult
from kvstudy.errors import ConfigError
from kvstudy.latency.models import profile_files
from kvstudy.running.compose import plain


def prefill_parts(ctx):
    """The run context a prefill replica's engine serves: every request with one output token (predicted 1)."""
    r = ctx.requests
    ones = np.ones(len(r), dtype=r.output_tokens.dtype)
    return dataclasses.replace(ctx, requests=dataclasses.replace(r, output_tokens=ones, predicted_output_tokens=None),
                               predicted=np.ones(len(r), dtype=np.int64))


def split_engines(cfg: DictConfig, setups: list, pools: list, build_policy: Callable, prepared_engine: Callable,
                  located: Callable) -> Tuple[list, list]:
    """Every replica's policy and engine, the prefill pool's first (``pools`` prefill first, ``setups`` in their
    order), each decode engine with its ``Handoff`` over the prefill replicas' links. ``build_policy(cfg)``,
    ``prepared_engine(cfg, ctx, policy, seed)`` and ``located(setup, build)`` are kvstudy/running/assemble.py's."""
    settings = read_handoff(plain(cfg.cluster).get("handoff"))
    n_p = pools[0].replicas
    ctx = setups[0].ctx
    deep = [s.ctx.hardware.name for s in setups if s.ctx.hardware.pipeline_parallel > 1]
    if deep:  # the driver's horizon (kvstudy/cluster/disaggregated.py) bounds one batch in flight per replica
        raise ConfigError(f"cluster.pools: hardware {deep[0]} with pipeline_parallel > 1 in a prefill/decode split "
                          f"is not modelled (its driver assumes one batch in flight per replica); allowed: "
                          f"hardware.pipeline_parallel=1 in every pool, or co-located replicas with pipeline stages")
    engines = []
    policies = []
    for k, setup in enumerate(setups):
        own, own_ctx = setup.cfg, setup.ctx if k >= n_p else prefill_parts(setup.ctx)
        policies.append(build_policy(own))
        engines.append(located(setup, lambda: prepared_engine(own, own_ctx, policies[-1], ctx.seed + k)))
        engines[-1].progress = False
    arch = ctx.arch
    links = SenderLinks(n_p)
    p_hw = [s.ctx.hardware for s in setups[:n_p]]
    prof = plain(cfg.hardware).get("profiles") or {}

    def node_seconds(hw):
        send_recv = profile_files(arch, hw, prof.get("root"), prof.get("compute_dir"),
                                  prof.get("network_dir")).send_recv if settings.link != "free" else None
        return link_seconds(settings, send_recv)

    # the link's measured profile: the send/recv profile of the prefill pool's node (its first replica's hardware) and,
    # when the decode pool's node differs (a mixed-GPU split, Splitwise-HA), the slower of the two ends
    d_hw = setups[n_p].ctx.hardware
    seconds = node_seconds(p_hw[0])
    if settings.gbps is None and settings.link != "free" and d_hw.name != p_hw[0].name:
        sender, receiver = seconds, node_seconds(d_hw)
        seconds = lambda nbytes: max(sender(nbytes), receiver(nbytes))  # noqa: E731
    shard = [kv_bytes_per_gpu(arch, hw) for hw in p_hw]
    for setup, engine in zip(setups[n_p:], engines[n_p:]):
        engine.handoff = Handoff(links, shard.__getitem__, seconds,
                                 settings.load, arch.num_layers // max(1, setup.ctx.hardware.pipeline_parallel),
                                 lambda tokens: arch.kv_bytes_per_token(1) * tokens)
    return policies, engines


def run_split(cfg: DictConfig, setups: list, pools: list, policies: list, engines: list,
              build_router: Callable) -> EngineResult:
    """Drive the engines ``split_engines`` built and merge their records into the run's (module docstring).
    ``build_router(cfg, option)`` is kvstudy/running/assemble.py's."""
    settings = read_handoff(plain(cfg.cluster).get("handoff"))
    n_p = pools[0].replicas
    r = setups[0].ctx.requests
    routers = (build_router(cfg, pools[0].router), build_router(cfg, pools[1].router))
    results, split = drive_split(engines[:n_p], engines[n_p:], routers, r.arrival_time.tolist(),
                                 r.output_tokens.tolist(), r.prompt_tokens.tolist(), settings)
    for policy, res, setup in zip(policies, results, setups):
        after = getattr(policy, "after_run", None)
        if callable(after):
            after(res, setup.ctx)
    hardware = [s.ctx.hardware.name for s in setups]
    router_names = "/".join(getattr(x, "name", type(x).__name__) for x in routers)
    # each request's row from its final replica: the decode replica's for a handed-off one (its first token as the
    # prefill replica stamped it)
    merged = merge(engines, results, split.final, router_names, hardware)
    order = np.argsort(r.request_id, kind="stable")
    merged.requests = handoff_columns(merged.requests, order, split, engines, n_p, results[:n_p])
    roles = [pools[0].name] * n_p + [pools[1].name] * (len(setups) - n_p)
    for part, role in zip(merged.extra["cluster"]["per_replica"], roles):
        part["pool"] = role
    for part in merged.extra["cluster"]["per_replica"][:n_p]:
        part["prefills"] = int((split.prefill == part["replica"]).sum())
    pool_members: List = [(pools[0].name, list(range(n_p))), (pools[1].name, list(range(n_p, len(setups))))]
    merged.extra["disaggregation"] = split_summary(merged.requests, merged.iterations, settings, pool_members)
    # blocks requests still hold on any replica once the run is over (0: every hold released, every pull done)
    merged.extra["disaggregation"]["blocks_held_at_end"] = int(sum(sum(e.memory.gpu.values()) for e in engines))
    if merged.events is not None:
        merged.events = split_events(r.request_id, results, split, n_p)
    return merged


def uses_split(pools) -> bool:
    """Whether ``pools`` (read by kvstudy/running/pool_setup.py, prefill first) are a prefill and a decode pool."""
    return bool(pools) and pools[0].role == "prefill"

