"""The declared type and bounds of every config key, in one place, checked before anything runs.

Why one schema: the checks used to be spread over the objects a run builds (a model's dataclass, the latency
models, the policies' ``__init__``), so a bad value was caught late, by whichever object read it first, and
sometimes under another key's name (``policy.watermark`` reported as ``policy.alpha``) or not at all (``inf``,
``2.5`` read as 2, ``true`` as 1). Here each key of each group is declared once (:class:`Key`); pydantic 2 decides
whether a value is allowed (strict: no coercion, no ``inf``/``nan``) and :meth:`Key.allowed` says, in one line,
what is. Groups whose options take different keys (``policy``, ``memory``, ``latency``, ``swap``, ``workload``;
``predictor`` by its ``kind``) are keyed by the option's ``_target_``, so a user's own ``_target_`` is checked on
its common keys only and the rest is left to the object (``check_settings`` in validate.py names keys it does not take, as kvstudy/running/targets.py instantiates it).

Conventions: every number has an upper bound (so nothing overflows an int64 or a float sum; the bounds are far
above any deployment modelled here); a whole number is a Python int, never a bool, and a float such as 1e3 only
where kvstudy rounds it itself (``e_notation``); values are checked after interpolation (``${...}``), so a
regime's ``${regime.admission}`` is checked as the string it resolves to.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Annotated, Any, Dict, List, Literal, Mapping, Optional, Tuple, Union

from pydantic import AfterValidator, BeforeValidator, Field, StrictBool, StrictInt, StrictStr, TypeAdapter, ValidationError

#: the largest whole number a count may take unless its key says less: 2^31 (token counts, request counts, ...)
INT_MAX = 2 ** 31
#: the largest seed: numpy's SeedSequence takes any, scikit-learn's random_state below 2^32
SEED_MAX = 2 ** 32 - 1


@dataclass(frozen=True)
class Key:
    """One key's type and bounds. ``kind``: whole | number | flag | choice | text | list (of ``item``) | any (a value
    the object built from it checks itself: a user's connector's settings)."""

    kind: str
    ge: Optional[float] = None
    gt: Optional[float] = None
    le: Optional[float] = None
    lt: Optional[float] = None
    choices: Tuple[Any, ...] = ()
    null: bool = False          # null (None) allowed
    auto: bool = False          # the string "auto" allowed
    e_notation: bool = False    # whole: a float equal to a whole number (1e3) allowed, kvstudy rounds it
    power_of_two: bool = False
    item: Optional["Key"] = None
    unit: str = ""
    below: Optional[str] = None  # what is allowed, said in the key's own words, for a value below the bounds
    what: str = ""               # text keys: what the string names (a path, a model name)

    def __post_init__(self) -> None:
        if self.kind in ("whole", "number") and self.le is None and self.lt is None:
            raise ValueError("every number needs an upper bound (nothing may overflow)")

    # -- validation (pydantic) ----------------------------------------------------------------------------------
    def annotation(self):
        bounds = {k: getattr(self, k) for k in ("ge", "gt", "le", "lt") if getattr(self, k) is not None}
        if self.kind == "whole":
            base = Annotated[StrictInt, Field(**bounds)]
            if self.e_notation:
                # 1e3: a float; an int is the first branch's alone (a float would round 2^62 + 1 into the bounds)
                base = Union[base, Annotated[float, BeforeValidator(_float_only), Field(allow_inf_nan=False, **bounds),
                                             AfterValidator(_integral)]]
            if self.power_of_two:
                base = Annotated[base, AfterValidator(_power_of_two)]
        elif self.kind == "number":
            base = Annotated[float, Field(allow_inf_nan=False, **bounds)]
        elif self.kind == "flag":
            base = StrictBool
        elif self.kind == "choice":
            base = Literal[self.choices]
        elif self.kind == "text":
            base = Annotated[StrictStr, Field(min_length=1)]
        elif self.kind == "list":
            base = Annotated[List[self.item.annotation()], Field(min_length=1)]
        elif self.kind == "any":
            return Any
        else:
            raise ValueError(f"unknown kind {self.kind}")
        if self.auto:
            base = Union[Literal["auto"], base]
        if self.null:
            base = Optional[base]
        return base

    @functools.cached_property
    def adapter(self) -> TypeAdapter:
        return TypeAdapter(self.annotation())

    def valid(self, value) -> bool:
        try:
            self.adapter.validate_python(value, strict=True)
        except ValidationError:
            return False
        return True

    # -- what is allowed, in words --------------------------------------------------------------------------------
    def bounds_text(self) -> str:
        parts = []
        for op, attr in ((">=", "ge"), (">", "gt"), ("<=", "le"), ("<", "lt")):
            v = getattr(self, attr)
            if v is not None:
                parts.append(f"{op} {_num(v)}")
        text = " " + " and ".join(parts) if parts else ""
        return text + (f" ({self.unit})" if self.unit else "")

    def core(self) -> str:
        """What is allowed, without auto and null."""
        if self.kind == "whole":
            return ("a power of two" if self.power_of_two else "a whole number") + self.bounds_text()
        if self.kind == "number":
            return "a number" + self.bounds_text()
        if self.kind == "flag":
            return "true or false"
        if self.kind == "choice":
            return ", ".join(_show(c) for c in self.choices)
        if self.kind == "text":
            return f"{self.what} (text; quote a number: '123')"
        if self.kind == "any":
            return "any value its class takes"
        return f"a list of {self.item.core().replace('a whole number', 'whole numbers')}, e.g. [1]"

    def wrap(self, core: str) -> str:
        return ("auto or " if self.auto else "") + core + (", or null" if self.null else "")

    def describe(self) -> str:
        return self.wrap(self.core())

    def allowed(self, value) -> str:
        """What is allowed, said for the way ``value`` fails (a type, a bound, a fraction)."""
        if self.kind in ("whole", "number"):
            whole = self.kind == "whole"
            if not _is_number(value):
                return "allowed " + self.wrap(("a number (a whole number)" if whole else "a number") + self.bounds_text())
            if not math.isfinite(value):
                return "allowed " + self.wrap("a finite " + self.core()[2:])
            if self.le is not None and value > self.le:
                return f"allowed at most {_num(self.le)}" + (f" {self.unit}" if self.unit else "")
            if self.ge is not None and value < self.ge or self.gt is not None and value <= self.gt:
                return f"allowed {self.below}" if self.below else f"allowed {self.describe()}"
            if whole and isinstance(value, float) and value.is_integer() and not self.e_notation:
                return f"allowed {self.describe()}, written as a whole number ({int(value)}, not {value!r} or 1e3)"
        if self.kind == "list" and isinstance(value, list) and not value:
            return f"allowed {self.describe()} (not empty)"
        return f"allowed {self.describe()}"


def _float_only(value):
    if not isinstance(value, float):
        raise ValueError("not a float")
    return value


def _integral(value: float) -> float:
    if not float(value).is_integer():
        raise ValueError("not a whole number")
    return value


def _power_of_two(value) -> Any:
    if int(value) != value or int(value) & (int(value) - 1):
        raise ValueError("not a power of two")
    return value


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _num(v) -> str:
    if isinstance(v, float) and not v.is_integer() or abs(v) < 1000:
        return f"{v:g}" if isinstance(v, float) else str(v)
    return f"{int(v):,}"


def _show(value) -> str:
    """A choice as the command line writes it (true, false, null; text unquoted)."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def show(value) -> str:
    """A value as the command line writes it: strings quoted (repr), true/false, null."""
    return _show(value) if isinstance(value, bool) or value is None else repr(value)


# --- helpers declaring keys ------------------------------------------------------------------------------------------
def whole(ge=0, le=INT_MAX, **kw) -> Key:
    return Key("whole", ge=ge, le=le, **kw)


def number(**kw) -> Key:
    return Key("number", **kw)


def fraction(**kw) -> Key:
    """0 <= x < 1 unless told otherwise."""
    return Key("number", **{"ge": 0.0, "lt": 1.0, **kw})


def flag() -> Key:
    return Key("flag")


def choice(*values, **kw) -> Key:
    return Key("choice", choices=tuple(values), **kw)


def text(what: str = "a name", **kw) -> Key:
    return Key("text", what=what, **kw)


def path() -> Key:
    return text("a file or folder path", null=True)


NAME = text()
COUNT = whole(ge=1)                                       # a positive count
TOKENS = whole(ge=1, le=1 << 24, unit="tokens")           # a token count (2^24: far beyond any context here)
SECONDS = number(ge=0.0, le=1e6, unit="seconds")
MS = number(ge=0.0, le=1e6, unit="ms")
ADMISSION = choice("paper", "authors_code")
PREEMPTION_MODE = choice("recompute", "swap")
MAX_NUM_SEQS = whole(ge=1, le=1 << 20)
BATCHED_TOKENS = whole(ge=1, le=1 << 24, null=True, unit="tokens")


# --- the groups --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Group:
    """A config group's keys: ``common`` to every option, and per option (``by`` names the key that tells the
    option apart: ``_target_``, or ``kind`` for the predictor) the keys that option takes."""

    common: Mapping[str, Key]
    by: Optional[str] = None
    options: Mapping[str, Mapping[str, Key]] = None

    def keys_for(self, node: Mapping) -> Tuple[Dict[str, Key], bool]:
        """The keys of the option ``node`` is, and whether that option is one the schema knows."""
        if not self.by:
            return dict(self.common), True
        option = node.get(self.by) if isinstance(node, Mapping) else None
        specific = (self.options or {}).get(option) if isinstance(option, str) else None
        return {**self.common, **(specific or {})}, specific is not None


_VLLM = {"preemption_mode": PREEMPTION_MODE, "max_num_seqs": MAX_NUM_SEQS, "max_num_batched_tokens": BATCHED_TOKENS,
         "running_order": choice("admission", "arrival"), "waiting_order": choice("fcfs", "lpm", "dfs_weight")}
_QUEUED = {"preemption_mode": PREEMPTION_MODE, "max_num_seqs": MAX_NUM_SEQS, "max_num_batched_tokens": BATCHED_TOKENS,
           "steps_before_preemption": whole(ge=1, le=1 << 20), "quantum_unit": choice("steps", "tokens")}
_PREFIX = {"margin": fraction(), "admission": ADMISSION,
           "avg_batch_time": number(ge=1e-4, le=3600.0, unit="seconds"), "prefix_aware": flag()}
_CACHEOPT = {
    "token_budget": TOKENS, "max_num_seqs": MAX_NUM_SEQS,
    "padding": choice("confidence", "fixed", "rlp"), "confidence": fraction(), "adaptive": flag(),
    "alpha": number(gt=0.0, le=1.0), "beta": number(gt=0.0, le=1e6), "rate_window": number(gt=0.0, le=1e7, unit="seconds"),
    "subtract_over": flag(), "fixed_fraction": number(ge=0.0, le=1e3), "rlp_padding": whole(ge=0, le=1 << 24, unit="tokens"),
    "direction_accuracy": fraction(lt=None, le=1.0), "calibration_requests": whole(ge=0, le=1 << 24),
    "selection": choice("slo", "fcfs"), "embedding": flag(), "buffer": whole(ge=0, le=1 << 24, unit="tokens"),
    "allocation": choice("rationale", "literal"), "proactive": flag(), "m": whole(ge=0, le=1 << 24, unit="tokens"),
    "reserve_blocks": whole(ge=0, le=1 << 24, unit="blocks"), "epsilon": number(ge=0.0, le=1e6, unit="seconds"),
    "critical_waiting": choice("first_token", "any"), "link": flag(), "preempt_for_waiting": flag(),
    "preemption": choice("bucketed", "fcfs"), "strategy": choice("select", "recompute", "swap"),
    "slo.reference": Key("list", item=text("a policy name")),
    "slo.ttft_ref": number(gt=0.0, le=1e6, null=True, unit="seconds"),
    "slo.tbt_ref": number(gt=0.0, le=1e6, null=True, unit="seconds"),
    "slo.calibration": choice("literal", "sec34"),
    "slo.low": number(gt=0.0, le=1e6), "slo.high": number(gt=0.0, le=1e6), "slo.scale": number(gt=0.0, le=1e6, null=True),
}

SCHEMA: Dict[str, Group] = {
    "": Group({"seed": whole(ge=0, le=SEED_MAX, e_notation=True),
               "resume": choice("code", "config", "never"), "record.events": flag(),
               "systems.block_size.*": whole(ge=1, le=1 << 16, power_of_two=True, unit="tokens")}),
    "engine": Group({
        "stall_limit": whole(ge=1, le=INT_MAX, e_notation=True),
        "overflow_cost": choice("batch", "free", "authors_code"),
        "arrivals": choice("paper", "authors_code"),
        "max_batch": whole(ge=1, le=1 << 24, null=True, e_notation=True),
        "raise_prediction_on_eviction": flag(),
        "accept_rejections": flag(),
        "max_iterations": whole(ge=1, le=2 ** 62, e_notation=True),
        "progress": flag(),
    }),
    # pools: checked by kvstudy/cluster/pools.py (a mapping of pools, each naming options of other groups)
    # handoff: checked by kvstudy/cluster/handoff.py (read_handoff)
    "cluster": Group({"replicas": whole(ge=1, le=1024, unit="replicas"), "pools": Key("any", null=True),
                      "handoff": Key("any", null=True)}),
    "router": Group({"name": NAME}, by="_target_", options={
        "kvstudy.cluster.routers.RoundRobin": {}, "kvstudy.cluster.routers.Random": {},
        "kvstudy.cluster.routers.LeastOutstanding": {}, "kvstudy.cluster.routers.LeastKV": {},
        "kvstudy.cluster.routers.PowerOfTwo": {},
        "kvstudy.cluster.routers.PrefixAffinity": {"max_imbalance": whole(ge=0, le=INT_MAX, unit="requests")},
    }),
    "regime": Group({"name": NAME, "folder": text("a folder name"), "admission": ADMISSION,
                     "arrivals": choice("paper", "authors_code"), "overflow_cost": choice("batch", "free", "authors_code")}),
    "hardware": Group({
        "name": NAME, "device": text("a device name (profiles/compute/<device>/)"),
        "node": text("a node name (profiles/network/<node>/)"),
        "tensor_parallel": whole(ge=1, le=1024, unit="GPUs"), "pipeline_parallel": whole(ge=1, le=1024, unit="stages"),
        # the device's memory as CUDA reports it, GiB (null: kvstudy/profiles/devices.py's, kvstudy/costs/capacity.py)
        "memory_gb_per_gpu": number(gt=0.0, le=1e5, null=True, unit="GiB"),
        "pcie_gbps": number(gt=0.0, le=1e5, unit="GB/s"),
        "calibrated": Key("flag", null=True),  # null: kvstudy/profiles/devices.py says
        "profiles.root": path(), "profiles.compute_dir": path(), "profiles.network_dir": path(),
    }),
    "model": Group({
        "name": NAME, "num_layers": whole(ge=1, le=1 << 16), "num_q_heads": whole(ge=1, le=1 << 16),
        "num_kv_heads": whole(ge=1, le=1 << 16), "embedding_dim": whole(ge=1, le=1 << 20),
        "mlp_hidden_dim": whole(ge=1, le=1 << 22), "max_model_len": whole(ge=2, le=1 << 24, unit="tokens"),
        "vocab_size": whole(ge=1, le=1 << 24), "use_gated_mlp": flag(), "use_bias": flag(), "use_qkv_bias": flag(),
        "post_attn_norm": flag(), "activation": choice("silu", "relu", "gelu"), "norm": choice("rms_norm", "layer_norm"),
        "uses_rope": flag(), "num_params": number(gt=0.0, le=1e15, unit="parameters"),
        "dtype_bytes": whole(ge=1, le=8, unit="bytes"),
    }),
    "memory": Group({"name": NAME,
                     "capacity_tokens": whole(ge=1, le=1 << 26, auto=True, e_notation=True, unit="tokens",
                                              below="a positive whole number (tokens) or auto"),
                     # vLLM's --gpu-memory-utilization, for capacity_tokens=auto (kvstudy/costs/capacity.py)
                     "gpu_memory_utilization": number(gt=0.0, le=1.0),
                     # memory outside PyTorch per GPU for capacity_tokens=auto; null: kvstudy/costs/capacity.py's default
                     "non_torch_gib": number(ge=0.0, le=1e3, unit="GiB", null=True)},
                    by="_target_", options={
        "kvstudy.memory.PaperMemory": {},
        "kvstudy.memory.PagedMemory": {"block_size": whole(ge=1, le=1 << 16, power_of_two=True, unit="tokens"),
                                       "watermark": fraction(), "swap_space_gb": number(ge=0.0, le=1e9, unit="GiB"),
                                       "decode_block_check": choice("vllm", "boundary"), "prefix_caching": flag(),
                                       # KV offload tiers (kvstudy/memory/offload.py): a tier is present when its size is
                                       # given; 1e9 GB is unlimited for any run
                                       **{f"offload.{tier}_{what}": spec for tier in ("host", "disk") for what, spec in (
                                           ("gb", number(gt=0.0, le=1e12, null=True, unit="GB per GPU")),
                                           ("read_gbps", number(gt=0.0, le=1e5, unit="GB/s per GPU")),
                                           ("write_gbps", number(gt=0.0, le=1e5, unit="GB/s per GPU")))},
                                       "offload.load": choice("blocking", "overlapped"),
                                       "offload.choice": choice("auto", "load", "recompute"),
                                       "offload.shared": flag(),
                                       # a KV connector of the user's (kvstudy/memory/connector.py): its class
                                       # (``_target_``) and the settings its constructor takes and checks
                                       # (kvstudy/running/assemble.py's build_memory names a failure in one line)
                                       "connector.*": Key("any")},
    }),
    "swap": Group({"name": NAME, "overlap": flag()}, by="_target_", options={
        "kvstudy.costs.swap_models.PcieSwap": {"efficiency": number(gt=0.0, le=1.0),
                                         "per_layer_overhead_s": number(ge=0.0, le=1.0, unit="seconds")},
        "kvstudy.costs.swap_models.VllmBlocksSwap": {"kernel": choice("per_block", "batched")},
    }),
    "latency": Group({"name": NAME}, by="_target_", options={
        "kvstudy.latency.models.UnitLatency": {},
        "kvstudy.latency.models.LinearLatency": {"d0": SECONDS, "d1": number(ge=0.0, le=1e3, unit="seconds per token"),
                                                 "hop": SECONDS},
        "kvstudy.latency.models.McsfAuthorsLatency": {"per_context_ms": MS, "per_job_ms": MS, "intercept_ms": MS,
                                                      "per_prompt_token_ms": MS},
        "kvstudy.latency.models.vidur": {
            "estimator": choice("random_forest", "linear_regression"),
            "num_estimators": Key("list", item=whole(ge=1, le=10_000)),
            "max_depth": Key("list", item=whole(ge=1, le=1000)),
            "min_samples_split": Key("list", item=whole(ge=2, le=1 << 20)),
            "polynomial_degree": Key("list", item=whole(ge=1, le=10)),
            "k_fold_cv_splits": whole(ge=2, le=100), "training_threads": whole(ge=1, le=1024),
            "kv_granularity": whole(ge=1, le=1 << 20, unit="tokens"), "max_batch_size": whole(ge=1, le=1 << 20),
            "max_prefill_chunk": TOKENS, "block_size": whole(ge=1, le=1 << 16, unit="tokens"),
            "max_tokens": whole(ge=1, le=1 << 24, auto=True, unit="tokens"), "seed": whole(ge=0, le=SEED_MAX),
        },
    }),
    "predictor": Group({"name": NAME, "kind": choice("oracle", "uniform_noise", "trace", "gaussian_noise",
                                                     "lognormal_noise")}, by="kind", options={
        "oracle": {}, "trace": {},
        "uniform_noise": {"epsilon": fraction()},
        "gaussian_noise": {"sigma": number(ge=0.0, le=1e6, unit="tokens"), "low": whole(ge=1, le=1 << 24),
                           "high": whole(ge=1, le=1 << 24)},
        "lognormal_noise": {"sigma": number(ge=0.0, le=100.0, auto=True), "target": choice("bucket50", "within100"),
                            "accuracy": number(gt=0.0, lt=1.0)},
    }),
    "workload": Group({"name": NAME, "path": path(), "length_seed": whole(ge=0, le=SEED_MAX, null=True)},
                      by="_target_", options={
        "kvstudy.workloads.lmsys.lmsys": {"num_requests": whole(ge=1, le=1 << 27),
                                          "max_total_tokens": whole(ge=2, le=1 << 24, null=True, unit="tokens")},
        "kvstudy.cacheopt.workloads.cacheopt_trace": {"trace": choice("alpaca", "sharegpt", "bookcorpus"),
                                                      "num_requests": whole(ge=1, le=1 << 27),
                                                      "rate": number(gt=0.0, le=1e9, null=True, unit="requests/s")},
        "kvstudy.workloads.arena.arena": {"num_requests": whole(ge=1, le=1000),
                                          "chars_per_token": number(gt=0.0, le=1e3)},
        "kvstudy.workloads.sessions.sessions": {  # issue 36: multi-turn chat sessions (kvstudy/workloads/sessions.py)
            "num_sessions": whole(ge=1, le=1 << 22), "mean_turns": number(ge=1.0, le=1e4),
            "max_turns": whole(ge=1, le=1 << 16), "session_rate": number(gt=0.0, le=1e9, unit="sessions/s"),
            "think_time": SECONDS, "answer_seconds_per_token": number(ge=0.0, le=1e3, unit="seconds per token"),
            "system_prompt_tokens": whole(ge=0, le=1 << 24, unit="tokens"),
            "num_system_prompts": whole(ge=1, le=1 << 20),
            "source": choice("conversations", "composed"), "chars_per_token": number(gt=0.0, le=1e3),
        },
        "kvstudy.workloads.sessions.shared_prompt": {  # issue 36: requests behind shared prefixes
            "num_requests": whole(ge=1, le=1 << 27), "num_prefixes": whole(ge=1, le=1 << 20),
            "prefix_tokens": whole(ge=0, le=1 << 24, unit="tokens"), "zipf_s": number(ge=0.0, le=100.0),
        },
        "kvstudy.workloads.trace.trace": {
            "num_requests": whole(ge=1, le=1 << 27, null=True), "sample": choice("with_replacement",
                                                                               "without_replacement", null=True),
            "rate_scale": number(gt=0.0, le=1e9), "drop_over_context": flag(),
            "over_context": choice("keep", "drop", "truncate"), "time_unit": choice("s", "ms"),
            "hash_block_size": whole(ge=1, le=1 << 20, unit="tokens"),
            "columns.prompt_tokens": text("a column name", null=True),
            "columns.output_tokens": text("a column name", null=True),
            "columns.arrival_time": text("a column name", null=True),
            "columns.predicted_output_tokens": text("a column name", null=True),
            "columns.request_id": text("a column name", null=True),
        },
    }),
    "demand": Group({"name": NAME, "kind": choice("poisson", "offline"),
                     "rate": number(gt=0.0, le=1e9, null=True, unit="requests/s"),
                     "scale": number(gt=0.0, le=1e6, null=True),
                     "load": number(gt=0.0, le=1e3, null=True, unit="x the hardware's capacity")}),
    "policy": Group({"name": NAME}, by="_target_", options={
        "kvstudy.policies.protection.AlphaProtection": {"alpha": fraction(), "beta": number(gt=0.0, le=1.0, null=True),
                                                        "admission": ADMISSION},
        "kvstudy.policies.protection.FCFSWatermark": {"watermark": fraction()},
        "kvstudy.policies.mcsf.MCSF": _PREFIX,
        "kvstudy.policies.mcsf.MCBenchmark": _PREFIX,
        "kvstudy.cacheopt.policy.CacheOPT": _CACHEOPT,
        "kvstudy.policies.reserving.RLP": {"padding": whole(ge=0, le=1 << 24, unit="tokens"),
                                           "max_num_seqs": MAX_NUM_SEQS, "max_num_batched_tokens": BATCHED_TOKENS},
        "kvstudy.policies.reserving.S3": {"bucket": whole(ge=1, le=1 << 24, unit="tokens"),
                                          "max_num_seqs": MAX_NUM_SEQS, "max_num_batched_tokens": BATCHED_TOKENS},
        "kvstudy.policies.rr_sjf.QueuedVLLM": _QUEUED,
        "kvstudy.policies.rr_sjf.RoundRobin": _QUEUED,
        "kvstudy.policies.rr_sjf.RRSJF": _QUEUED,
        "kvstudy.policies.rr_sjf.SJF": _QUEUED,
        "kvstudy.policies.vllm.VLLM": _VLLM,
        "kvstudy.policies.vllm.Sarathi": {**{k: v for k, v in _VLLM.items() if k != "max_num_batched_tokens"},
                                          "chunk_size": TOKENS},
    }),
}


def key_spec(group: str, keys: Mapping[str, Key], key: str) -> Optional[Key]:
    """The Key of ``key`` (dotted, inside its group), a ``prefix.*`` entry matching any key under the prefix."""
    if key in keys:
        return keys[key]
    head = key.rsplit(".", 1)[0]
    return keys.get(head + ".*")
