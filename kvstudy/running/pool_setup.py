"""Each replica's configuration and run context for ``cluster.pools`` (kvstudy/cluster/pools.py): the run's own
where the pool changes nothing, else the run's config with the pool's hardware option (conf/hardware/), policy
option and memory settings in place, and a context with that hardware's KV capacity and latency model. The model and
the requests are the run's: every replica serves the same request stream.

Everything is built and checked before any engine runs, so a pool whose hardware cannot hold the model (or whose
memory setting is refused) is one line naming the pool before any work."""
from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional, Tuple

from omegaconf import DictConfig, OmegaConf, open_dict

from kvstudy.cluster.pools import Pool, read_pools, runnable
from kvstudy.config.validate import check_config, options
from kvstudy.errors import ConfigError, KvStudyError
from kvstudy.running.compose import compose_group, compose_policy
from kvstudy.running.run_context import RunContext

Setup = Tuple[DictConfig, RunContext]


def cluster_pools(cfg: DictConfig) -> Optional[List[Pool]]:
    """``cluster.pools`` read, checked and limited to what runs today (``runnable``); None without pools."""
    cluster = OmegaConf.to_container(cfg.cluster, resolve=True) if "cluster" in cfg else {}
    pools = read_pools(cluster, options("hardware"), options("policy"), options("router"))
    if pools is not None:
        runnable(pools)
    return pools


def replica_setups(cfg: DictConfig, ctx: RunContext, pools: List[Pool],
                   build_setup: Callable[[DictConfig], tuple]) -> List[Setup]:
    """(config, context) of every replica of ``pools``, in pool order then replica order. Replicas of one pool with
    the same hardware share one (their latency model too, as ``cluster.replicas`` replicas do). ``build_setup(cfg)``
    -> (arch, hardware spec, capacity, latency model): kvstudy/running/assemble.py's ``model_setup``."""
    out: List[Setup] = []
    for pool in pools:
        made = {}
        for hw in pool.hardware:
            if hw not in made:
                made[hw] = _setup(cfg, ctx, pool, hw, build_setup)
            out.append(made[hw])
    return out


def _setup(cfg: DictConfig, ctx: RunContext, pool: Pool, hw: Optional[str], build_setup) -> Setup:
    if hw is None and pool.policy is None and not pool.memory:
        return cfg, ctx  # the run's own: nothing to rebuild (a pool written as cluster.replicas is that run)
    where = f"cluster.pools.{pool.name}"
    own = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    with open_dict(own):
        if hw is not None:
            own.hardware = compose_group("hardware", hw)
        if pool.policy is not None:
            own.policy = compose_policy(pool.policy)
        if pool.memory:
            own.memory = OmegaConf.merge(own.memory, pool.memory)
        own.cluster.pools = None  # checked as one replica's config: its pools are the run's business
    try:
        check_config(own)
        arch, spec, capacity, latency = build_setup(own)
    except KvStudyError as exc:
        raise ConfigError(f"{where} (hardware {hw or 'as the run'}): {exc}") from None
    return own, dataclasses.replace(ctx, cfg=own, arch=arch, hardware=spec, capacity=capacity, latency=latency)
