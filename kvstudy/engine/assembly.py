"""Putting an engine together: the checks that tie a policy, a memory model and the engine's settings together, and
the admission adapter, applied before :class:`~kvstudy.engine.loop.StepEngine` is built (so the engine itself takes
a step policy and settings already known to fit).

Every value is checked once, against its declaration in kvstudy/config/schema.py (``check_group("engine", ...)``);
here are only the rules between keys: the MC-SF paper's loop settings (``max_batch``, ``arrivals=authors_code``,
``overflow_cost=authors_code``, ``raise_prediction_on_eviction``) belong to ``memory=paper``, a preemptive policy needs
``memory=paged``, and CacheOPT's embedding is not modelled with prefix caching.
"""
from __future__ import annotations

from kvstudy.config.validate import check_group
from kvstudy.engine.loop import StepEngine
from kvstudy.engine.states import PolicyError
from kvstudy.errors import ConfigError
from kvstudy.policies.admission import Admission


def build_engine(requests, predicted, policy, latency, memory, swap, arch, hardware, *, max_batch=None,
                 raise_prediction_on_eviction: bool = False, overflow_cost: str = "batch", arrivals: str = "paper",
                 **settings) -> StepEngine:
    """A :class:`StepEngine` for ``policy`` on ``memory``: the settings checked, an admission-only policy (order +
    admit, kvstudy/policies/base.py) wrapped in the adapter (kvstudy/policies/admission.py) with its two settings
    ``max_batch`` and ``raise_prediction_on_eviction``. ``settings``: the engine's others (``stall_limit``,
    ``max_iterations``, ``progress``, ``direction``, ``record_events``). The policy is reset by the caller."""
    check_group("engine", {"overflow_cost": overflow_cost, "arrivals": arrivals, "max_batch": max_batch,
                           "raise_prediction_on_eviction": raise_prediction_on_eviction})
    check_pairing(policy, memory, max_batch, raise_prediction_on_eviction, overflow_cost, arrivals)
    check_stages(policy, latency, memory, hardware)
    if not getattr(policy, "preemptive", False):
        policy = Admission(policy, max_batch=max_batch, raise_on_eviction=raise_prediction_on_eviction)
    return StepEngine(requests, predicted, policy, latency, memory, swap, arch, hardware,
                      overflow_cost=overflow_cost, arrivals=arrivals, **settings)


def check_pairing(policy, memory, max_batch, raise_prediction_on_eviction: bool, overflow_cost: str,
                  arrivals: str) -> None:
    """The rules between the policy, the memory model and the engine's settings (module docstring); raises
    ConfigError (a setting) or PolicyError (an object that is no policy) in one line."""
    paper = memory.convention == "paper"
    name = getattr(policy, "name", type(policy).__name__)
    preemptive = getattr(policy, "preemptive", False)
    if paper and preemptive:
        raise ConfigError(f"policy '{name}' preempts and needs memory=paged (memory=paper is the MC-SF paper's "
                          f"admission-only model)")
    if not paper:  # the MC-SF authors' loop settings: the paper's memory only, refused in one line elsewhere
        if max_batch is not None:
            raise ConfigError(f"engine.max_batch={max_batch} applies to memory=paper (the MC-SF authors' batch "
                              f"cap); on memory={memory.name} a policy caps its own batch (policy.max_num_seqs)")
        for key, value in (("arrivals", arrivals), ("overflow_cost", overflow_cost)):
            if value == "authors_code":
                raise ConfigError(f"engine.{key}=authors_code (set by regime=authors) reproduces the MC-SF "
                                  f"authors' scripts on memory=paper; on memory={memory.name} choose "
                                  f"latency=mcsf_authors alone for their batch-time formula")
        if raise_prediction_on_eviction:
            raise ConfigError(f"engine.raise_prediction_on_eviction=true is the paper loop's Fig. 5 remedy "
                              f"(memory=paper); memory={memory.name} keeps a recomputed request's tokens, so it "
                              f"has no such cycle")
    if preemptive:
        if not callable(getattr(policy, "step", None)):
            raise PolicyError(f"policy '{name}' is preemptive but has no step(view) method (kvstudy/policies/step.py)")
        if max_batch is not None or raise_prediction_on_eviction:
            raise ConfigError(f"engine.max_batch and engine.raise_prediction_on_eviction apply to admission-only "
                              f"policies; policy '{name}' decides its own batch")
    elif not callable(getattr(policy, "schedule", None)):
        raise PolicyError(f"policy '{name}' ({type(policy).__name__}) is neither a step policy (preemptive = True "
                          f"and step(view): kvstudy/policies/step.py) nor an admission policy (order + admit: "
                          f"kvstudy/policies/base.py)")
    if getattr(policy, "embedding", False) and not memory.supports_loans:  # loans: an optional capability (base.py)
        which = "memory.prefix_caching=true" if memory.prefix_caching else f"memory={memory.name}"
        raise ConfigError(f"policy '{name}' embeds requests in others' blocks (policy.embedding=true), which "
                          f"{which} does not model; set policy.embedding=false")


def check_stages(policy, latency, memory, hardware) -> None:
    """Pipeline parallelism (``hardware.pipeline_parallel`` > 1) keeps batches in flight (kvstudy/engine/pipeline.py):
    the latency model must time those stages (``latency=vidur``, whose tables are trained for them, or
    ``latency=linear``, whose d0 + d1 x tokens splits evenly over them), the memory must count KV blocks
    (``memory=paged``: the paper's constraint (3) has no batches in flight), and the policy must be a step policy
    (the admission adapter counts a running request's tokens from the decode count, every running request decoding
    in every counted iteration, and checks eq. (5) over the running set: neither holds with batches in flight)."""
    pp = int(getattr(hardware, "pipeline_parallel", 1) or 1)
    stages = int(getattr(latency, "stages", 1) or 1)
    name = getattr(latency, "name", type(latency).__name__)
    if pp > 1 and stages != pp:
        raise ConfigError(f"hardware.pipeline_parallel={pp}: latency={name} times {stages} pipeline stage(s); "
                          f"allowed with pipeline parallelism: latency=vidur or latency=linear")
    if stages > 1 and pp == 1 and hardware is not None:
        raise ConfigError(f"latency={name} times {stages} pipeline stages but hardware.pipeline_parallel=1")
    if stages > 1 and not memory.tracks_blocks:
        raise ConfigError(f"hardware.pipeline_parallel={pp} keeps batches in flight, which memory={memory.name} "
                          f"does not model; allowed: memory=paged")
    if stages > 1 and not getattr(policy, "preemptive", False):
        raise ConfigError(f"policy '{getattr(policy, 'name', type(policy).__name__)}' is admission-only (order + "
                          f"admit, through kvstudy/policies/admission.py), which pipeline stages "
                          f"(hardware.pipeline_parallel > 1) do not model; allowed there: step policies (vllm, "
                          f"sarathi, the rr_sjf family, cacheopt, rlp, s3, lpm, dfs_weight)")
