"""Settings of a config that change nothing in its run (a swap model when nothing can swap, a waiting order without a
prefix cache, a router with one replica, a noise model with zero noise): ``simulate`` says each once as a warning."""
from __future__ import annotations

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
    if OmegaConf.select(cfg, "cluster.replicas", default=1) == 1 and router != "round_robin":
        notes.append(f"router={router} has no effect with one replica: set cluster.replicas to 2 or more")
    pred = plain(cfg.predictor)
    for kind, key in (("gaussian_noise", "sigma"), ("uniform_noise", "epsilon"), ("lognormal_noise", "sigma")):
        if pred.get("kind") == kind and pred.get(key) == 0:
            notes.append(f"predictor={kind} with predictor.{key}=0 predicts every length exactly (the oracle); "
                         f"set predictor.{key} above 0 for noise")
    return notes

