"""Assembling a run from a composed config and running it in memory: the model, hardware, KV capacity and latency
model (``model_setup``), the policy, the requests and their predictions, the memory and swap models, the engine (one
per replica; kvstudy/cluster/driver.py drives several behind a router), the context a policy's ``before_run`` hook
gets (``run_context``), and ``simulate``: one config's engine result and summary, with its provenance (the policy
module and the profile files the run reads). Writing a run folder is kvstudy/running/execute.py's job."""
from __future__ import annotations

import functools
import time
import warnings
from pathlib import Path
from typing import Tuple

import numpy as np
from hydra.errors import InstantiationException
from omegaconf import DictConfig, OmegaConf

from kvstudy.cluster.driver import drive, merge
from kvstudy.config.validate import check_config, check_value, options
from kvstudy.costs.arch import ModelArch
from kvstudy.costs.capacity import describe as capacity_describe, fit_note, resolve_capacity
from kvstudy.costs.capacity import settings_of as capacity_settings
from kvstudy.costs.predictors import predict
from kvstudy.engine.assembly import build_engine as assemble_engine
from kvstudy.engine.loop import StepEngine
from kvstudy.engine.states import EngineResult
from kvstudy.errors import ConfigError, KvStudyError
from kvstudy.latency.models import profile_files
from kvstudy.latency.tables import HardwareSpec
from kvstudy.costs.transfer import network_reader
from kvstudy.memory.connector import KV_CONNECTOR_MEMBERS, KVConnector
from kvstudy.running import offered_load, provenance
from kvstudy.running.compose import compose_group, compose_policy, plain
from kvstudy.running.no_effect import no_effect
from kvstudy.running.outputs import summarize
from kvstudy.running.pool_setup import Setup, cluster_pools, replica_setups
from kvstudy.running.run_context import RunContext, engine_inputs
from kvstudy.running.split_run import run_split, split_engines, uses_split
from kvstudy.running.targets import instantiate, takes_rng
from kvstudy.workloads.arrivals import arrivals, check_span
from kvstudy.workloads.requests import Requests, make_requests


def hardware_spec(cfg: DictConfig) -> HardwareSpec:
    """The config's hardware. ``memory_gb_per_gpu`` is the vendor's figure of the device (kvstudy/profiles/devices.py;
    it keys the latency cache only); the KV capacity reads the device's visible memory (kvstudy/costs/capacity.py)."""
    from kvstudy.profiles.devices import DEVICES

    hw = plain(cfg.hardware)
    gpu = DEVICES.get(hw["device"])
    return HardwareSpec(name=hw["name"], device=hw["device"], node=hw["node"],
                        tensor_parallel=int(hw["tensor_parallel"]), pipeline_parallel=int(hw.get("pipeline_parallel", 1)),
                        memory_gb_per_gpu=float(gpu.memory_gb if gpu is not None else 80),
                        pcie_gbps=float(hw.get("pcie_gbps", 31.5)))


def build_latency(cfg: DictConfig, arch: ModelArch, hw: HardwareSpec, capacity: int):
    profiles = plain(cfg.hardware).get("profiles") or {}
    extra = {}
    if cfg.latency.get("name") == "vidur":
        extra = {"profiles_root": profiles.get("root"), "compute_dir": profiles.get("compute_dir"),
                 "network_dir": profiles.get("network_dir"), "capacity_tokens": capacity}
    return instantiate(cfg.latency, arch=arch, hardware=hw, **extra)


def build_policy(cfg: DictConfig):
    if "policy" not in cfg or cfg.policy is None:
        raise ConfigError(f"no policy chosen; add +policy=NAME with NAME one of: {', '.join(options('policy'))}")
    target = cfg.policy.get("_target_")
    label = f"policy '{cfg.policy.get('name') or target}' ({target})"
    try:
        policy = instantiate(cfg.policy)
    except (ValueError, TypeError) as exc:  # a policy checks its own parameters in its __init__ (README)
        raise ConfigError(f"{label}: {exc}") from None
    except InstantiationException as exc:  # the same through Hydra (a policy node with nested _target_ nodes)
        cause = exc.__cause__
        if isinstance(cause, (ValueError, TypeError)):
            raise ConfigError(f"{label}: {cause}") from None
        raise
    if not (callable(getattr(policy, "step", None)) or callable(getattr(policy, "schedule", None))):
        shown = f" {policy!r:.40}" if isinstance(policy, (int, float, str, bool, type(None))) else ""
        raise ConfigError(f"{label} built {type(policy).__name__}{shown}, not a policy: a step policy has "
                          f"step(view) (kvstudy/policies/step.py), an admission policy order + admit "
                          f"(kvstudy/policies/base.py)")
    if cfg.policy.get("name"):  # a variant file (cacheopt_wo_pa, ...) names the policy it builds
        policy.name = str(cfg.policy.name)
    return policy


def build_requests(cfg: DictConfig, arch: ModelArch, seed_seq: np.random.SeedSequence,
                   capacity_of=None) -> Tuple[Requests, np.ndarray]:
    """The run's requests and predictions. ``capacity_of(df) -> requests/s`` is the hardware's capacity on these
    lengths, for ``demand.load`` (kvstudy/running/offered_load.py; ``_context`` supplies it)."""
    lengths_ss, arrival_ss, predictor_ss = seed_seq.spawn(3)
    wl = plain(cfg.workload)
    name = wl.get("name", "workload")
    length_seed = wl.pop("length_seed", None)
    if length_seed is not None:
        # The lengths the run with seed=length_seed draws; arrivals and predictions still follow ``seed``.
        check_value("workload", wl, "length_seed", length_seed)  # the schema's bounds (a config no one checked)
        lengths_ss = np.random.SeedSequence(length_seed).spawn(3)[0]
    if takes_rng(wl.get("_target_", "")):  # a workload that draws takes the run's generator (``rng``)
        df = instantiate(wl, rng=np.random.default_rng(lengths_ss), max_model_len=arch.max_model_len)
    else:
        df = instantiate(wl, max_model_len=arch.max_model_len)
    demand = plain(cfg.demand) if "demand" in cfg and cfg.demand is not None else None
    if demand is not None and "turn" in df:
        raise ConfigError(f"workload '{name}' times its own arrivals (each session's turns follow the one before); "
                          f"+demand={demand.get('name')} would replace them: leave +demand out")
    if demand is not None:
        rate = demand.get("rate")
        if rate is None and demand.get("kind", "poisson") == "poisson" and demand.get("load") is None:
            raise ConfigError(f"+demand={demand.get('name')} has no rate for workload '{name}' (demand.rate, or "
                              f"demand.load for a fraction of the hardware's capacity); table1_rate needs "
                              f"workload=alpaca, sharegpt or bookcorpus, or set demand.rate")
        if demand.get("scale") is not None and rate is not None:  # +demand=table1_rate: a multiple of the trace's rate
            rate = float(rate) * float(demand["scale"])
        if demand.get("load") is not None:  # +demand=relative: a fraction of this hardware's capacity
            rate = _relative_rate(demand, df, capacity_of)
        times = arrivals(demand.get("kind", "poisson"), len(df), np.random.default_rng(arrival_ss), rate)
        if rate is not None:  # the key that set the rate is named, not a row of arrival_time
            check_span(times, rate, *_rate_key(demand, cfg))
    elif "arrival_time" in df:
        times = df["arrival_time"].to_numpy()
    else:
        raise ConfigError(f"workload '{name}' has no arrival times; add +demand=NAME with NAME one of: "
                          f"{', '.join(options('demand'))}")
    requests = make_requests(times, df["prompt_tokens"].to_numpy(), df["output_tokens"].to_numpy(),
                             source=str(wl.get("path") or name),
                             predicted=df["predicted_output_tokens"].to_numpy() if "predicted_output_tokens" in df else None,
                             request_id=df["request_id"].to_numpy() if "request_id" in df else None,
                             segments=df["segments"].tolist() if "segments" in df else None)
    pred_cfg = plain(cfg.predictor)
    kind = pred_cfg.pop("kind", "oracle")
    pred_cfg.pop("name", None)
    predicted = predict(kind, requests, np.random.default_rng(predictor_ss), **pred_cfg)
    return requests, predicted


def _relative_rate(demand: dict, df, capacity_of) -> float:
    """demand.load x the hardware's capacity on these requests (kvstudy/running/offered_load.py)."""
    if demand.get("rate") is not None:
        raise ConfigError(f"+demand={demand.get('name')} gives both demand.rate={demand['rate']} (given, or the "
                          f"workload's own rate) and demand.load={demand['load']}; allowed: one of them (load: a "
                          f"fraction of the hardware's capacity, +demand=relative)")
    if demand.get("scale") is not None:
        raise ConfigError(f"demand.scale={demand['scale']} scales demand.rate, which demand.load={demand['load']} "
                          f"replaces; allowed: demand.load alone (scale the load instead)")
    if demand.get("kind", "poisson") != "poisson":
        raise ConfigError(f"demand.load={demand['load']} sets a Poisson rate; demand.kind={demand.get('kind')} has "
                          f"none: allowed kind poisson")
    if capacity_of is None:
        raise ConfigError("demand.load (a fraction of the hardware's capacity) needs the run's latency model to "
                          "measure that capacity; this caller builds requests without one: give demand.rate")
    return float(demand["load"]) * capacity_of(df)


def model_setup(cfg: DictConfig, latency: bool = True):
    """The config's model, hardware, KV capacity in tokens and (if ``latency``) latency model."""
    arch = ModelArch.from_mapping(plain(cfg.model))
    hw = hardware_spec(cfg)
    arch.check_tensor_parallel(hw.tensor_parallel)
    capacity = resolve_capacity(cfg.memory.capacity_tokens, arch, hw, **capacity_settings(cfg))
    return arch, hw, capacity, (build_latency(cfg, arch, hw, capacity) if latency else None)


def build_memory(cfg: DictConfig, capacity: int):
    """The ``memory`` group's model (``paper`` or ``paged``) with the resolved capacity in tokens, and its KV connector
    (``memory.connector``: a class implementing kvstudy/memory/connector.py's ``KVConnector`` with its settings; none
    given: the offload tiers of ``memory.offload``, or no connector). A connector that cannot be built (its class not
    found, a setting it refuses or does not take) is one line naming ``memory.connector``."""
    node = cfg.memory.get("connector")
    if node is None:
        return instantiate(cfg.memory, capacity_tokens=capacity)
    if not isinstance(node, DictConfig) or not isinstance(node.get("_target_"), str):
        raise ConfigError(f"memory.connector={plain(node) if isinstance(node, DictConfig) else node!r}: allowed a "
                          f"mapping with _target_ (module.Class implementing kvstudy/memory/connector.py's "
                          f"KVConnector) and the settings its class takes, or null")
    target = node._target_
    try:
        connector = instantiate(node)
    except (ValueError, TypeError) as exc:  # a connector checks its own settings in its __init__, as a policy does
        raise ConfigError(f"memory.connector ({target}): {exc}") from None
    if not isinstance(connector, KVConnector):
        missing = [m for m in KV_CONNECTOR_MEMBERS if not hasattr(connector, m)]
        raise ConfigError(f"memory.connector._target_={target} built {type(connector).__name__}, not a KV connector: "
                          f"it lacks {', '.join(missing)} (kvstudy/memory/connector.py's KVConnector)")
    return instantiate(cfg.memory, capacity_tokens=capacity, connector=connector)


def _whole(value):
    """A whole number given as 1e3 (Hydra reads a float) as the int it is; anything else unchanged (checked later)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def build_engine(cfg: DictConfig, requests: Requests, predicted: np.ndarray, policy, latency, arch: ModelArch,
                 hw: HardwareSpec, capacity: int, direction=None) -> StepEngine:
    """The one loop (kvstudy/engine/loop.py) on the config's memory model: ``paper`` (constraint (3), tokens,
    admission-only policies) or ``paged`` (blocks, preemption, chunked prefill; an admission-only policy runs through
    the adapter, kvstudy/policies/admission.py, wrapped by kvstudy/engine/assembly.py, which also refuses in one line
    the settings a memory model cannot take: the MC-SF authors' loop settings apply to ``paper`` only)."""
    memory = build_memory(cfg, capacity)
    engine = cfg.engine
    return assemble_engine(requests, predicted, policy, latency, memory, instantiate(cfg.swap), arch, hw,
                           direction=direction, stall_limit=int(engine.stall_limit),
                           max_iterations=int(engine.max_iterations), progress=bool(engine.progress),
                           overflow_cost=str(engine.get("overflow_cost", "batch")),
                           arrivals=engine.get("arrivals", "paper"), max_batch=_whole(engine.get("max_batch")),
                           raise_prediction_on_eviction=engine.get("raise_prediction_on_eviction", False),
                           record_events=bool(OmegaConf.select(cfg, "record.events", default=False)))


def _rate_key(demand: dict, cfg: DictConfig) -> tuple:
    """(key, value, how) of the setting that made a demand's rate, as the user wrote it (for
    kvstudy/workloads/arrivals.py ``check_span``)."""
    if demand.get("load") is not None:
        return "demand.load", float(demand["load"]), " (x this hardware's capacity)"
    scale = demand.get("scale")
    how = f" (x demand.scale={scale:g})" if scale is not None else ""
    if OmegaConf.select(cfg, "workload.rate", default=None) is not None and \
            demand.get("rate") == OmegaConf.select(cfg, "workload.rate"):
        return "workload.rate", float(demand["rate"]), how
    return "demand.rate", float(demand["rate"]), how


def run_context(cfg: DictConfig, latency: bool = True) -> RunContext:
    """What a run of ``cfg`` builds before its first iteration (requests, predictions, model, hardware, KV capacity,
    latency model) with the means to run other configs: the argument of a policy's ``before_run`` hook."""
    check_config(cfg)
    return _context(cfg, latency)


def _context(cfg: DictConfig, latency: bool) -> RunContext:
    """``run_context`` of a config already checked."""
    arch, hw, capacity, _ = model_setup(cfg, latency=False)
    seed = int(cfg.seed)
    lat, requests_of = None, build_requests
    if OmegaConf.select(cfg, "demand.load") is not None:  # the rate follows the hardware's capacity: timed first
        replicas = OmegaConf.select(cfg, "cluster.replicas", default=1)
        if replicas != 1:  # one replica's capacity is measured; a cluster's depends on its router: not defined here
            raise ConfigError(f"demand.load={cfg.demand.load} is relative to one replica's capacity; with "
                              f"cluster.replicas={replicas} give demand.rate instead (allowed: cluster.replicas=1)")
        lat = build_latency(cfg, arch, hw, capacity)
        requests_of = functools.partial(build_requests,
                                        capacity_of=offered_load.rate_function(cfg, arch, hw, capacity, lat))
    requests, predicted = requests_of(cfg, arch, np.random.SeedSequence(seed))
    too_long = np.flatnonzero(requests.prompt_tokens > arch.max_model_len)
    if len(too_long):
        i = too_long[0]
        hint = ("; workload.over_context=drop drops such requests (counted in a warning)"
                if "over_context" in cfg.workload else "")
        raise ConfigError(f"request {int(requests.request_id[i])} has a prompt of {int(requests.prompt_tokens[i])} tokens, "
                          f"longer than model '{arch.name}' context max_model_len={arch.max_model_len}{hint}")
    note = fit_note(arch, hw, capacity, **capacity_settings(cfg))
    if note:
        warnings.warn(note, stacklevel=3)
    paper_m = _paper_capacity_elsewhere(cfg, arch, hw)
    if paper_m:
        warnings.warn(paper_m, stacklevel=3)
    return RunContext(cfg=cfg, requests=requests, predicted=predicted, arch=arch, hardware=hw,
                      latency=(lat or build_latency(cfg, arch, hw, capacity)) if latency else None,
                      capacity=capacity, seed=seed, simulate=simulate, build_requests=requests_of,
                      compose_policy=compose_policy,
                      instantiate=instantiate)


#: the MC-SF paper's measured KV capacity M (App. C) and the model/hardware it was measured on (a100_vidur_default:
#: the same two A100s timed as one, kvstudy's reading of the paper's Vidur setting)
PAPER_M, PAPER_SETTING = 16492, {("llama2_70b", "a100_tp2"), ("llama2_70b", "a100_vidur_default")}


def _paper_capacity_elsewhere(cfg: DictConfig, arch: ModelArch, hw: HardwareSpec) -> str:
    """A note when the memory keeps the default capacity, the MC-SF paper's M for Llama2-70B on two A100s, for
    another model or hardware (issue 46: Llama-3.1-8B on one A100 at M rejected a quarter of Mooncake's requests)."""
    if OmegaConf.select(cfg, "memory.capacity_tokens") != PAPER_M or (arch.name, hw.name) in PAPER_SETTING:
        return ""
    return (f"memory.capacity_tokens={PAPER_M} is the MC-SF paper's M for Llama2-70B on two A100s, not a capacity of "
            f"model '{arch.name}' on hardware '{hw.name}'; memory.capacity_tokens=auto sizes the KV cache from this "
            f"GPU's memory (or give a number)")


def simulate(cfg: DictConfig) -> Tuple[EngineResult, dict]:
    """Run one configuration in memory; returns the engine result and its summary. With ``cluster.pools`` the
    summary's ``hardware`` and latency are replica 0's when every replica has the same hardware, else ``hardware``
    joins the replicas' hardware names (``a100_tp2+h100_tp2``: each replica's is in ``cluster.per_replica``)."""
    started = time.perf_counter()
    check_config(cfg)
    pools = cluster_pools(cfg)  # cluster.pools read and checked (one line each), None without
    policy = build_policy(cfg)
    for note in no_effect(cfg, policy):
        warnings.warn(note, stacklevel=2)
    ctx = _context(cfg, latency=True)
    if pools is None:
        setups = [Setup(cfg, ctx)] * int(OmegaConf.select(cfg, "cluster.replicas", default=1))
    else:  # every replica's hardware, capacity and latency model built (and refused) before any engine runs
        setups = replica_setups(cfg, ctx, pools, lambda own: model_setup(own, latency=True))
        if setups[0].cfg is not cfg:  # replica 0 of a pool of its own: its policy
            policy = build_policy(setups[0].cfg)
    top_cfg, top_ctx = setups[0].cfg, setups[0].ctx  # one replica's (a cluster's: replica 0's)
    arch, hw, latency, seed = top_ctx.arch, top_ctx.hardware, top_ctx.latency, ctx.seed
    after = getattr(policy, "after_run", None)
    if uses_split(pools):  # a prefill pool and a decode pool: every engine built for its pool (split_run.py)
        policies, engines = split_engines(cfg, setups, pools, build_policy, _prepared_engine, _located)
        sim_started = time.perf_counter()
        result = run_split(cfg, setups, pools, policies, engines, build_router)
    else:
        engine = _located(setups[0], lambda: _prepared_engine(top_cfg, top_ctx, policy, seed))
        sim_started = time.perf_counter()
        result = engine.run() if len(setups) == 1 else _run_cluster(cfg, setups, policy, engine, pools)
    name = OmegaConf.select(top_cfg, "policy.name", default=None) or getattr(policy, "name", type(policy).__name__)
    described = latency.describe()
    if pools is None:
        hardware, paths = hw.name, profile_paths(cfg)
    else:  # every replica's hardware named, every distinct replica config's profiles hashed (each config once)
        hardware = "+".join(dict.fromkeys(s.ctx.hardware.name for s in setups))
        distinct = {id(s.cfg): s.cfg for s in setups}.values()
        paths = sorted({path for own in distinct for path in profile_paths(own)})
    result.extra = {**result.extra, "policy": name, "model": arch.name, "hardware": hardware, "seed": seed,
                    **_hardware_record(top_cfg, arch, hw, top_ctx), "latency": described,
                    "simulate_seconds": round(time.perf_counter() - sim_started, 3),
                    "wall_seconds": round(time.perf_counter() - started, 3),
                    "provenance": provenance.record(policy_target(top_cfg), paths, described)}
    if callable(after) and len(setups) == 1:
        after(result, top_ctx)
    _settle_rejections(cfg, result)
    return result, summarize(result)


def _located(setup: Setup, build):
    """``build()`` for one replica; a ConfigError names the replica's pool (cluster.pools) first."""
    try:
        return build()
    except ConfigError as exc:
        if setup.where is None:
            raise
        raise ConfigError(f"{setup.where}: {exc}") from None


def _hardware_record(cfg: DictConfig, arch: ModelArch, hw: HardwareSpec, ctx: RunContext) -> dict:
    """What the summary says of the hardware: the KV capacity and how it came about, whether the GPU's profiles are
    calibrated on its own measurements (kvstudy/profiles/devices.py), and the offered load's capacity and rate."""
    from kvstudy.profiles.devices import DEVICES

    out = {"kv_capacity": capacity_describe(cfg.memory.capacity_tokens, arch, hw, ctx.capacity,
                                            **capacity_settings(cfg))}
    gpu = DEVICES.get(hw.device)
    profiles = plain(cfg.hardware).get("profiles") or {}
    own = profiles.get("root") or profiles.get("compute_dir")  # compute profiles of one's own (network alone: not)
    if gpu is not None and not gpu.calibrated and not own:
        out["hardware_note"] = (f"{hw.device} uncalibrated: no measurement of it; {gpu.calibration}'s fitted "
                                f"efficiencies with {hw.device}'s datasheet peaks (kvstudy/profiles/devices.py)")
    demand = plain(cfg.demand) if OmegaConf.select(cfg, "demand") is not None else {}
    if demand.get("load") is not None:
        cap = offered_load.capacity_rate(cfg, arch, hw, ctx.capacity, ctx.latency, ctx.requests.prompt_tokens,
                                         ctx.requests.output_tokens)  # the rate's own (memoised)
        out["offered_load"] = {"load": float(demand["load"]), "capacity_rps": cap, "rate": float(demand["load"]) * cap}
    return out


#: a run that served every request it could but rejected some up front (``reject_reason``), not accepted by the
#: setting ``engine.accept_rejections``: the run's status says so, and the command line exits non-zero (issue 46)
REJECTED_STATUS = "some_rejected"


def _settle_rejections(cfg: DictConfig, result: EngineResult) -> None:
    """A completed run with rejected requests ends ``some_rejected`` unless ``engine.accept_rejections`` is true (a
    study that expects rejections: a trace with prompts beyond the cache, vLLM's watermark rule)."""
    if result.status != "completed" or OmegaConf.select(cfg, "engine.accept_rejections", default=False):
        return
    requests = result.requests
    gone = requests["state"] == "rejected"
    rejected = int(gone.sum())
    if rejected:
        # paged memory names each request's reason; the paper's memory has one (prompt + output above capacity)
        why = (f"each with its reject_reason (the first: {requests.loc[gone, 'reject_reason'].iloc[0]})"
               if "reject_reason" in requests else f"({result.message})")
        result.status = REJECTED_STATUS
        result.message = (f"{rejected} of {len(requests)} request(s) rejected, {why}; give the KV cache room for them "
                          f"(memory.capacity_tokens=auto sizes it from the GPU's memory), or set "
                          f"engine.accept_rejections=true to accept them")


def _prepared_engine(cfg: DictConfig, ctx: RunContext, policy, seed: int) -> StepEngine:
    """The engine of ``policy`` over the run's requests: the policy's ``before_run`` hook first (its answer checked,
    kvstudy/running/run_context.py), then ``reset(seed)``."""
    before = getattr(policy, "before_run", None)
    inputs = engine_inputs(policy, before(ctx)) if callable(before) else {}
    policy.reset(seed)
    return build_engine(cfg, ctx.requests, ctx.predicted, policy, ctx.latency, ctx.arch, ctx.hardware, ctx.capacity,
                        **inputs)


def build_router(cfg: DictConfig, option: str = None):
    """The ``router`` group's router (kvstudy/cluster/routers.py), reset with the run's seed; ``option``: another
    option of the group (a pool's, conf/router/<option>.yaml) instead of the run's."""
    router = instantiate(cfg.router if option is None else compose_group("router", option))
    router.reset(int(cfg.seed))
    return router


def _run_cluster(cfg: DictConfig, setups: list, policy, first: StepEngine, pools=None) -> EngineResult:
    """``cluster.replicas`` > 1 or ``cluster.pools`` (kvstudy/cluster/driver.py): ``setups`` holds each replica's
    (config, run context) (kvstudy/running/pool_setup.py; the run's own for ``cluster.replicas``); ``first`` is
    replica 0's engine (``policy``'s); replica k gets its own policy instance (the policy's ``before_run`` hook run
    for it, reset with seed + k), memory and swap model; replicas of one hardware share its latency model. Each
    policy's ``after_run`` annotates its replica's records before they are merged. The router: the pool's
    (``cluster.pools.<name>.router``), else the run's."""
    ctx = setups[0].ctx
    if first.arrivals == "authors_code":
        raise ConfigError("engine.arrivals=authors_code (regime=authors) is the MC-SF authors' single-worker event "
                          "order; with cluster.replicas > 1 use regime=none")
    router = build_router(cfg, pools[0].router if pools else None)
    policies, engines = [policy], [first]
    for k in range(1, len(setups)):
        own, own_ctx = setups[k].cfg, setups[k].ctx
        policies.append(build_policy(own))
        engines.append(_located(setups[k], lambda: _prepared_engine(own, own_ctx, policies[-1], ctx.seed + k)))
    def link():  # bytes -> seconds between two nodes (the node's send/recv profile), read when a connector asks
        prof = plain(cfg.hardware).get("profiles") or {}
        files = profile_files(ctx.arch, ctx.hardware, prof.get("root"), prof.get("compute_dir"), prof.get("network_dir"))
        return network_reader(files.send_recv)

    # a connector shared by the replicas (the offload tiers' shared pool: Mooncake's store) joins them here; replicas
    # that see each other's writes are stepped in time order, an iteration at a time (lockstep)
    lockstep = first.memory.connector.connect_replicas([e.memory.connector for e in engines], link)
    for engine in engines:
        engine.progress = False  # one bar per replica would interleave
    results, routed = drive(engines, router, ctx.requests.arrival_time.tolist(), lockstep=lockstep)
    for policy, res, setup in zip(policies, results, setups):
        after = getattr(policy, "after_run", None)
        if callable(after):
            after(res, setup.ctx)
    hardware = [setup.ctx.hardware.name for setup in setups] if pools else None
    return merge(engines, results, routed, getattr(router, "name", type(router).__name__), hardware)


def profile_paths(cfg: DictConfig) -> list:
    """The profile files the config's latency model reads (Vidur's), for the fingerprint; none for other models."""
    if cfg.latency.get("name") != "vidur":
        return []
    try:
        prof = plain(cfg.hardware).get("profiles") or {}
        files = profile_files(ModelArch.from_mapping(plain(cfg.model)), hardware_spec(cfg), prof.get("root"),
                              prof.get("compute_dir"), prof.get("network_dir"))
    except (KvStudyError, TypeError, ValueError, KeyError):
        return []  # the run itself names what is wrong
    return [p for p in (files.mlp, files.attention, files.all_reduce, files.send_recv) if Path(p).is_file()]


def policy_target(cfg: DictConfig):
    """The policy's ``_target_`` (a user's own module is hashed into the provenance), or None."""
    return OmegaConf.select(cfg, "policy._target_", default=None)

