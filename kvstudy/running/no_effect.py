"""Settings of a config that change nothing in its run (a swap model when nothing can swap, a waiting order without a
prefix cache, a router with one replica, a noise model with zero noise): ``simulate`` says each once as a warning."""
from __future__ import annotations

import math

from omegaconf import DictConfig, OmegaConf

from kvstudy.running.compose import plain


def no_effect(cfg: DictConfig, policy) -> list:
    """Settings of ``cfg`` that change nothing in this run (said once as a warning by ``simulate``): a swap model
    when nothing can swap, a noise model with zero noise."""
    notes = []
    swap = OmegaConf.select(cfg, "swap.name", default="pcie")
    mode = getattr(policy, "preemption_mode", None)
    if swap != "pcie":
        name = getattr(policy, "name", "the policy")
        if cfg.memory.get("name") == "paper":
            notes.append(f"swap={swap} has no effect: memory=paper never swaps (memory=paged and a policy with "
                         f"policy.preemption_mode=swap do)")
        elif not getattr(policy, "preemptive", False) or mode == "recompute":
            why = "recomputes (policy.preemption_mode=recompute)" if mode == "recompute" else \
                "is admission-only (its overflow victims are recomputed)"
            notes.append(f"swap={swap} has no effect: policy '{name}' {why}; "
                         f"{'set policy.preemption_mode=swap' if mode else 'choose a policy that swaps'}")
    order = OmegaConf.select(cfg, "policy.waiting_order", default="fcfs")
    if order != "fcfs" and not OmegaConf.select(cfg, "memory.prefix_caching", default=False):
        notes.append(f"policy.waiting_order={order} has no effect without a prefix cache: the queue is taken FCFS "
                     f"(set memory.prefix_caching=true, or memory=paged_prefix)")
    router = OmegaConf.select(cfg, "router.name", default="round_robin")
    if OmegaConf.select(cfg, "cluster.replicas", default=1) == 1 and router != "round_robin" and \
            OmegaConf.select(cfg, "cluster.pools", default=None) is None:
        notes.append(f"router={router} has no effect with one replica: set cluster.replicas to 2 or more")
    pred = plain(cfg.predictor)
    for kind, key in (("gaussian_noise", "sigma"), ("uniform_noise", "epsilon"), ("lognormal_noise", "sigma")):
        if pred.get("kind") == kind and pred.get(key) == 0:
            notes.append(f"predictor={kind} with predictor.{key}=0 predicts every length exactly (the oracle); "
                         f"set predictor.{key} above 0 for noise")
    capacity = OmegaConf.select(cfg, "memory.capacity_tokens", default=None)
    if capacity != "auto":  # the settings that size capacity_tokens=auto, each said when set away from its default
        from kvstudy.costs.capacity import GPU_MEMORY_UTILIZATION

        for key, default in (("gpu_memory_utilization", GPU_MEMORY_UTILIZATION), ("non_torch_gib", None)):
            value = OmegaConf.select(cfg, f"memory.{key}", default=None)
            if value is not None and value != default:
                notes.append(f"memory.{key}={value} has no effect with memory.capacity_tokens={capacity}: it sizes "
                             f"the cache only with memory.capacity_tokens=auto (kvstudy/costs/capacity.py)")
    return notes + offload_notes(cfg) + parallel_notes(cfg)


def _disk_defaults() -> dict:
    """conf/memory/paged_offload.yaml's disk speeds: a disk tier's, said to have no effect when changed without one."""
    from kvstudy.running.paths import CONF_DIR

    offload = OmegaConf.load(CONF_DIR / "memory" / "paged_offload.yaml").get("offload") or {}
    return {k: offload.get(k) for k in ("disk_read_gbps", "disk_write_gbps")}


def _arch_and_block_bytes(cfg: DictConfig):
    """The model and one KV block's bytes on one GPU (kvstudy/memory/paged.py ``bind``); None if the config has no
    model or block size to tell."""
    from types import SimpleNamespace

    from kvstudy.costs.arch import ModelArch
    from kvstudy.costs.swap_models import kv_bytes_per_gpu

    try:
        arch = ModelArch.from_mapping(plain(cfg.model))
        hw = SimpleNamespace(tensor_parallel=int(cfg.hardware.tensor_parallel),
                             pipeline_parallel=int(cfg.hardware.get("pipeline_parallel", 1)))
        block = int(OmegaConf.select(cfg, "memory.block_size", default=16))
        return arch, block * kv_bytes_per_gpu(arch, hw)
    except Exception:
        return None, None


def offload_notes(cfg: DictConfig) -> list:
    """An offload tier's settings that change nothing (kvstudy/memory/offload.py): a disk or host speed without that
    tier, a pool shared by one replica, a tier too small for one block (it holds none: every eviction is lost)."""
    node = OmegaConf.select(cfg, "memory.offload", default=None)
    if not isinstance(node, DictConfig):
        return []
    raw = OmegaConf.to_container(node, resolve=False)
    values = plain(node)
    notes = []
    if values.get("disk_gb") is None:
        changed = [f"memory.offload.{k}={values[k]}" for k, v in _disk_defaults().items()
                   if k in values and values[k] != v]
        if changed:
            notes.append(f"{' and '.join(changed)} {'has' if len(changed) == 1 else 'have'} no effect without a disk "
                         f"tier (memory.offload.disk_gb is null): give memory.offload.disk_gb=<GB> for one")
    if values.get("host_gb") is None:
        changed = [f"memory.offload.{k}={values[k]}" for k in ("host_read_gbps", "host_write_gbps")
                   if k in raw and raw[k] != "${hardware.pcie_gbps}"]
        if changed:
            notes.append(f"{' and '.join(changed)} {'has' if len(changed) == 1 else 'have'} no effect without a host "
                         f"tier (memory.offload.host_gb is null): give memory.offload.host_gb=<GB> for one")
    replicas = OmegaConf.select(cfg, "cluster.replicas", default=1)
    if values.get("shared") is True and replicas == 1 and OmegaConf.select(cfg, "cluster.pools", default=None) is None:
        notes.append("memory.offload.shared=true has no effect with one replica (cluster.replicas=1): a pool is "
                     "shared by the replicas of a cluster; set cluster.replicas to 2 or more")
    arch, block_bytes = _arch_and_block_bytes(cfg)
    for tier in ("host", "disk"):
        gb = values.get(f"{tier}_gb")
        if block_bytes and isinstance(gb, (int, float)) and math.floor(gb * 1e9 / block_bytes + 1e-6) == 0:
            block = OmegaConf.select(cfg, "memory.block_size", default=16)
            notes.append(f"memory.offload.{tier}_gb={gb} holds no block: one block of {block} tokens of model "
                         f"'{arch.name}' is {block_bytes:,} B per GPU, so the {tier} tier keeps nothing; give at least "
                         f"memory.offload.{tier}_gb={block_bytes / 1e9:.3g}")
    return notes


def parallel_notes(cfg: DictConfig) -> list:
    """Tensor parallelism above the model's KV heads: vLLM replicates each KV head (kvstudy/costs/capacity.py counts
    ceil(num_kv_heads / tensor_parallel) heads per GPU), so the KV cache per GPU stops shrinking at TP =
    num_kv_heads."""
    tp = OmegaConf.select(cfg, "hardware.tensor_parallel", default=None)
    kv = OmegaConf.select(cfg, "model.num_kv_heads", default=None)
    if isinstance(tp, int) and isinstance(kv, int) and tp > kv:
        return [f"hardware.tensor_parallel={tp} is above model '{cfg.model.name}' num_kv_heads={kv}: vLLM keeps a "
                f"copy of each KV head on {tp // kv} GPUs, so a token's KV takes as much memory per GPU as at "
                f"tensor_parallel={kv} (a larger TP adds no KV capacity per GPU)"]
    return []
