"""Each replica's configuration and run context for ``cluster.pools`` (kvstudy/cluster/pools.py): the run's own
where the pool changes nothing, else the run's config with the pool's hardware option (conf/hardware/), policy
option and memory settings in place, and a context with that hardware's KV capacity and latency model. The model and
the requests are the run's: every replica serves the same request stream.

* A pool naming the run's own hardware option (``hardware.name``) gets the run's hardware node, with the run's
  overrides of it (``hardware.memory_gb_per_gpu=90``); another option is taken as its file says.
* A pool's ``policy`` must run on the run's memory model: a policy option that selects another one (``lpm`` takes
  ``paged_prefix``) is refused in one line saying which ``memory`` settings would make them agree.
* A pool's ``memory`` settings must be settings of the run's memory model (``capacity_tokens``, ``prefix_caching``).

Everything is built and checked before any engine runs, so a pool whose hardware cannot hold the model (or whose
memory setting is refused) is one line naming the pool before any work."""
from __future__ import annotations

import dataclasses
from typing import Callable, List, NamedTuple, Optional

from omegaconf import DictConfig, OmegaConf, open_dict

from kvstudy.cluster.pools import Pool, read_pools, runnable
from kvstudy.config.validate import check_config, options
from kvstudy.errors import ConfigError, KvStudyError
from kvstudy.running.compose import compose_group, compose_policy, policy_memory
from kvstudy.running.run_context import RunContext


class Setup(NamedTuple):
    """One replica's config and context, and the pool it belongs to (``cluster.pools.<name>``; None: the run's
    ``cluster.replicas``), for messages."""

    cfg: DictConfig
    ctx: RunContext
    where: Optional[str] = None


def cluster_pools(cfg: DictConfig) -> Optional[List[Pool]]:
    """``cluster.pools`` read, checked and limited to what runs today (``runnable``); None without pools."""
    cluster = OmegaConf.to_container(cfg.cluster, resolve=True) if "cluster" in cfg else {}
    pools = read_pools(cluster, options("hardware"), options("policy"), options("router"))
    if pools is not None:
        split = runnable(pools, cluster.get("handoff"))
        if split:  # (cluster.handoff's values are checked with the config: kvstudy/config/validate.py)
            if OmegaConf.select(cfg, "memory.name") == "paper":
                raise ConfigError("cluster.pools with a prefill and a decode pool: memory=paper's convention (the "
                                  "MC-SF paper's rounds: no first token from the prefill) has no handoff; allowed: "
                                  "memory=paged (or paged_prefix), where every policy runs on the decode pool")
            order = sorted(range(len(pools)), key=lambda k: pools[k].role != "prefill")
            pools = [pools[k] for k in order]  # the prefill pool first: its replicas are 0 .. P-1
    elif (cluster or {}).get("handoff") is not None:
        raise ConfigError("cluster.handoff is read by a prefill pool and a decode pool (cluster.pools); allowed: "
                          "cluster.handoff=null without pools")
    return pools


def replica_setups(cfg: DictConfig, ctx: RunContext, pools: List[Pool],
                   build_setup: Callable[[DictConfig], tuple]) -> List[Setup]:
    """The ``Setup`` of every replica of ``pools``, in pool order then replica order. Replicas of one pool with the
    same hardware share one (their latency model too, as ``cluster.replicas`` replicas do). ``build_setup(cfg)`` ->
    (arch, hardware spec, capacity, latency model): kvstudy/running/assemble.py's ``model_setup``."""
    out: List[Setup] = []
    for pool in pools:
        made = {}
        for hw in pool.hardware:
            if hw not in made:
                made[hw] = _setup(cfg, ctx, pool, hw, build_setup)
            out.append(made[hw])
    names = {s.ctx.hardware.name for s in out}
    offload = OmegaConf.select(cfg, "memory.offload", default=None)
    if len(names) > 1 and offload is not None and offload.get("shared"):
        raise ConfigError(f"memory.offload.shared=true with replicas of different hardware ({', '.join(sorted(names))}): "
                          f"the shared pool is sized and timed for one hardware; allowed: shared=false, or one "
                          f"hardware in every pool")
    return out


def _setup(cfg: DictConfig, ctx: RunContext, pool: Pool, hw: Optional[str], build_setup) -> Setup:
    where = f"cluster.pools.{pool.name}"
    run_hw = OmegaConf.select(cfg, "hardware.name", default=None)
    own_hw = hw is not None and hw != run_hw
    if not own_hw and pool.policy is None and not pool.memory:
        return Setup(cfg, ctx, where)  # the run's own: nothing to rebuild (a pool written as cluster.replicas)
    own = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    with open_dict(own):
        if own_hw:
            own.hardware = compose_group("hardware", hw)
        if pool.policy is not None:
            _same_memory(cfg, pool, where)
            own.policy = compose_policy(pool.policy)
        if pool.memory:
            unknown = [k for k in pool.memory if k not in cfg.memory]
            if unknown:
                raise ConfigError(f"{where}.memory.{unknown[0]}: not a setting of the run's memory "
                                  f"({cfg.memory.get('name', '?')}); allowed: {', '.join(str(k) for k in cfg.memory)}")
            own.memory = OmegaConf.merge(own.memory, pool.memory)
        own.cluster.pools = None  # checked as one replica's config: its pools are the run's business
    try:
        check_config(own)
        arch, spec, capacity, latency = build_setup(own)
    except KvStudyError as exc:
        raise ConfigError(f"{where} (hardware {hw or run_hw}): {exc}") from None
    return Setup(own, dataclasses.replace(ctx, cfg=own, arch=arch, hardware=spec, capacity=capacity,
                                          latency=latency), where)


def _same_memory(cfg: DictConfig, pool: Pool, where: str) -> None:
    """A pool's policy option must run on the run's memory model (its option may select another: module docstring)."""
    wants = policy_memory(pool.policy)
    run = cfg.memory
    if wants.get("_target_") != run.get("_target_"):
        raise ConfigError(f"{where}.policy={pool.policy}: runs on memory={wants.get('name')}, the run's memory is "
                          f"{run.get('name')}; allowed: a policy of the run's memory model (or run it as the "
                          f"run's +policy)")
    caching = bool(wants.get("prefix_caching", False))
    if caching != bool(run.get("prefix_caching", False)) and \
            caching != bool(pool.memory.get("prefix_caching", run.get("prefix_caching", False))):
        raise ConfigError(f"{where}.policy={pool.policy}: runs with memory.prefix_caching={str(caching).lower()}, "
                          f"the run's is {str(not caching).lower()}; allowed: give the pool "
                          f"memory: {{prefix_caching: {str(caching).lower()}}}, or a policy of the run's memory")
