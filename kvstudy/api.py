"""Python API: compose a config, run it, load a run's tables (what notebooks and tests use).

    from kvstudy import api
    cfg = api.compose(["+policy=mcsf", "+demand=high", "latency=unit"])
    summary = api.run(cfg, "outputs/my_run")
    run = api.load_run("outputs/my_run")        # run.summary, run.requests, run.iterations
"""
from __future__ import annotations

import contextlib
import inspect
import json
import signal
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Tuple

import numpy as np
import pandas as pd
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from kvstudy import provenance
from kvstudy.arch import ModelArch
from kvstudy.atomic import write_text_atomic
from kvstudy.capacity import fit_note, resolve_capacity
from kvstudy.states import EngineResult
from kvstudy.errors import ConfigError, KvStudyError
from kvstudy.step_engine import StepEngine
from kvstudy.latency.tables import HardwareSpec
from kvstudy.outputs import finished_summary, summarize, write_run
from kvstudy.paths import CONF_DIR
from kvstudy.predictors import predict
from kvstudy.run_context import RunContext, engine_inputs
from kvstudy.validate import check_config, check_group_choices, options  # noqa: F401 (api.options stays public)
from kvstudy.workloads.arrivals import arrivals
from kvstudy.workloads.requests import Requests, make_requests


def compose(overrides: Iterable[str] = ()) -> DictConfig:
    """The config ``python -m kvstudy <overrides>`` would run (Hydra Compose API, no output folder)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = list(overrides)
    check_group_choices(overrides)  # an unknown option of a group in one line, not Hydra's
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"cannot compose the config from {' '.join(overrides)}: {first}") from None


def compose_policy(name: str) -> DictConfig:
    """conf/policy/<name>.yaml as ``+policy=<name>`` composes it; inside a Hydra app (a sweep's run) through the
    app's own Hydra (a second initialisation is refused there)."""
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        from hydra import compose as hydra_compose

        return hydra_compose(config_name="config", overrides=[f"+policy={name}"]).policy
    return compose([f"+policy={name}"]).policy


def _plain(node) -> dict:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)


def hardware_spec(cfg: DictConfig) -> HardwareSpec:
    hw = _plain(cfg.hardware)
    return HardwareSpec(name=hw["name"], device=hw["device"], node=hw["node"],
                        tensor_parallel=int(hw["tensor_parallel"]), pipeline_parallel=int(hw.get("pipeline_parallel", 1)),
                        memory_gb_per_gpu=float(hw.get("memory_gb_per_gpu", 80)), pcie_gbps=float(hw.get("pcie_gbps", 31.5)))


_TARGETS: dict = {}
_SIGNATURES: dict = {}  # target -> its call signature (None: not introspectable), for naming unknown keys


def _nested_target(value) -> bool:
    if isinstance(value, dict):
        return "_target_" in value or any(_nested_target(v) for v in value.values())
    if isinstance(value, list):
        return any(_nested_target(v) for v in value)
    return False


def _instantiate(node: DictConfig, **kwargs):
    """Instantiate a ``_target_`` node; objects are passed afterwards (Hydra would turn dataclasses into configs).
    The parameters are plain containers already, so the target is called directly (what ``hydra.utils.instantiate``
    with ``_convert_="all"`` does, at a fraction of its cost per run in a sweep); a node with nested ``_target_``
    nodes still goes through Hydra."""
    params = _plain(node)
    params.pop("name", None)
    if _nested_target({k: v for k, v in params.items() if k != "_target_"}) or "_target_" not in params:
        return instantiate(params, _partial_=True, _convert_="all")(**kwargs)
    target = params.pop("_target_")
    fn = _TARGETS.get(target)
    if fn is None:
        fn = _TARGETS[target] = _load_target(target, _group_of(node))
    if target not in _SIGNATURES:
        try:
            _SIGNATURES[target] = inspect.signature(fn)
        except (TypeError, ValueError):
            _SIGNATURES[target] = None
    signature = _SIGNATURES[target]
    if signature is not None and not any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        unknown = sorted(set(params) - set(signature.parameters))
        if unknown:  # a key this option does not take (++memory.decode_block_check on memory=paper, say)
            group = _group_of(node)
            raise ConfigError(f"{', '.join(f'{group}.{k}' for k in unknown)}: not a setting of {group} "
                              f"'{node.get('name', target)}' ({target}); it takes "
                              f"{', '.join(signature.parameters)}")
    return fn(**{**params, **kwargs})  # as a partial: call-time arguments win over the config's


def _load_target(target: str, group: str):
    """The object a ``_target_`` names (``module.attr``, or ``module.Class.attr``). A module that cannot be imported
    is named as such, with where it failed (a user's own policy module: its file and line), never an internal
    error or Hydra's guess."""
    import importlib
    import os
    import traceback

    parts = str(target).split(".")
    for cut in range(len(parts) - 1, 0, -1):  # the longest importable module path, then attributes
        module = ".".join(parts[:cut])
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
                continue  # this prefix is not a module: try a shorter one
            failure = exc
        except Exception as exc:  # the module itself fails: a syntax error, an import inside it, ...
            failure = exc
        else:
            obj = mod
            for name in parts[cut:]:
                if not hasattr(obj, name):
                    raise ConfigError(f"{group}._target_={target}: '{module}' has no '{name}' (its file: "
                                      f"{getattr(mod, '__file__', '?')})") from None
                obj = getattr(obj, name)
            return obj
        frames = traceback.extract_tb(failure.__traceback__)
        where = next((f"{f.filename}, line {f.lineno}" for f in reversed(frames)
                      if not f.filename.startswith("<frozen")), None)
        if isinstance(failure, SyntaxError) and failure.filename:
            where = f"{failure.filename}, line {failure.lineno}"
        text = failure.msg if isinstance(failure, SyntaxError) else str(failure)
        raise ConfigError(f"{group}._target_={target}: importing module '{module}' failed with "
                          f"{type(failure).__name__}: {text}" + (f" ({where})" if where else "")) from None
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    looked = (f"no {parts[0]}.py or {parts[0]}/ in the PYTHONPATH folder(s) {', '.join(paths)}" if paths else
              "PYTHONPATH is not set: run with your module's folder on it (PYTHONPATH=/path/to/folder python -m "
              "kvstudy ...)")
    raise ConfigError(f"{group}._target_={target}: no module named '{parts[0]}'; {looked}") from None


def _group_of(node: DictConfig) -> str:
    """The config key of ``node`` (memory, policy, ...), for messages."""
    try:
        return node._key() or "config"
    except Exception:
        return "config"


def build_latency(cfg: DictConfig, arch: ModelArch, hw: HardwareSpec, capacity: int):
    profiles = _plain(cfg.hardware).get("profiles") or {}
    extra = {}
    if cfg.latency.get("name") == "vidur":
        extra = {"profiles_root": profiles.get("root"), "compute_dir": profiles.get("compute_dir"),
                 "network_dir": profiles.get("network_dir"), "capacity_tokens": capacity}
    return _instantiate(cfg.latency, arch=arch, hardware=hw, **extra)


def build_policy(cfg: DictConfig):
    if "policy" not in cfg or cfg.policy is None:
        raise ConfigError(f"no policy chosen; add +policy=NAME with NAME one of: {', '.join(options('policy'))}")
    policy = _instantiate(cfg.policy)
    if cfg.policy.get("name"):  # a variant file (cacheopt_wo_pa, ...) names the policy it builds
        policy.name = str(cfg.policy.name)
    return policy


def _takes_rng(target: str) -> bool:
    """Does the workload function ``target`` take the run's random generator (a parameter ``rng``)?"""
    import inspect

    try:
        fn = _load_target(target, "workload")
        return "rng" in inspect.signature(fn).parameters
    except (KvStudyError, TypeError, ValueError):
        return False  # the instantiation names the problem


def build_requests(cfg: DictConfig, arch: ModelArch, seed_seq: np.random.SeedSequence) -> Tuple[Requests, np.ndarray]:
    lengths_ss, arrival_ss, predictor_ss = seed_seq.spawn(3)
    wl = _plain(cfg.workload)
    name = wl.get("name", "workload")
    length_seed = wl.pop("length_seed", None)
    if length_seed is not None:
        # The lengths the run with seed=length_seed draws; arrivals and predictions still follow ``seed``.
        if isinstance(length_seed, bool) or not isinstance(length_seed, int) or length_seed < 0:
            raise ConfigError(f"workload.length_seed={length_seed!r}: a whole number >= 0, or null (= seed)")
        lengths_ss = np.random.SeedSequence(length_seed).spawn(3)[0]
    if _takes_rng(wl.get("_target_", "")):  # a workload that draws takes the run's generator (``rng``)
        df = _instantiate(wl, rng=np.random.default_rng(lengths_ss), max_model_len=arch.max_model_len)
    else:
        df = _instantiate(wl, max_model_len=arch.max_model_len)
    demand = _plain(cfg.demand) if "demand" in cfg and cfg.demand is not None else None
    if demand is not None and "turn" in df:
        raise ConfigError(f"workload '{name}' times its own arrivals (each session's turns follow the one before); "
                          f"+demand={demand.get('name')} would replace them: leave +demand out")
    if demand is not None:
        rate = demand.get("rate")
        if rate is None and demand.get("kind", "poisson") == "poisson":
            raise ConfigError(f"+demand={demand.get('name')} has no rate for workload '{name}' (demand.rate); "
                              f"table1_rate needs workload=alpaca, sharegpt or bookcorpus, or set demand.rate")
        if demand.get("scale") is not None and rate is not None:  # +demand=table1_rate: a multiple of the trace's rate
            rate = float(rate) * float(demand["scale"])
        times = arrivals(demand.get("kind", "poisson"), len(df), np.random.default_rng(arrival_ss), rate)
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
    pred_cfg = _plain(cfg.predictor)
    kind = pred_cfg.pop("kind", "oracle")
    pred_cfg.pop("name", None)
    predicted = predict(kind, requests, np.random.default_rng(predictor_ss), **pred_cfg)
    return requests, predicted


def model_setup(cfg: DictConfig, latency: bool = True):
    """The config's model, hardware, KV capacity in tokens and (if ``latency``) latency model."""
    arch = ModelArch.from_mapping(_plain(cfg.model))
    hw = hardware_spec(cfg)
    arch.check_tensor_parallel(hw.tensor_parallel)
    capacity = resolve_capacity(cfg.memory.capacity_tokens, arch, hw)
    return arch, hw, capacity, (build_latency(cfg, arch, hw, capacity) if latency else None)


def build_memory(cfg: DictConfig, capacity: int):
    """The ``memory`` group's model (``paper`` or ``paged``) with the resolved capacity in tokens."""
    return _instantiate(cfg.memory, capacity_tokens=capacity)


def _whole(value):
    """A whole number given as 1e3 (Hydra reads a float) as the int it is; anything else unchanged (checked later)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def build_engine(cfg: DictConfig, requests: Requests, predicted: np.ndarray, policy, latency, arch: ModelArch,
                 hw: HardwareSpec, capacity: int, direction=None) -> StepEngine:
    """The one loop (kvstudy/step_engine.py) on the config's memory model: ``paper`` (constraint (3), tokens,
    admission-only policies) or ``paged`` (blocks, preemption, chunked prefill; an admission-only policy runs through
    the engine's adapter, kvstudy/policies/admission.py). The MC-SF authors' loop settings apply to ``paper`` only."""
    memory = build_memory(cfg, capacity)
    engine = cfg.engine  # the engine refuses, in one line, settings its memory model cannot take
    return StepEngine(requests, predicted, policy, latency, memory, _instantiate(cfg.swap), arch, hw,
                      direction=direction, stall_limit=int(engine.stall_limit),
                      max_iterations=int(engine.max_iterations), progress=bool(engine.progress),
                      overflow_cost=str(engine.get("overflow_cost", "batch")), arrivals=engine.get("arrivals", "paper"),
                      max_batch=_whole(engine.get("max_batch")),
                      raise_prediction_on_eviction=engine.get("raise_prediction_on_eviction", False),
                      record_events=bool(OmegaConf.select(cfg, "record.events", default=False)))


def run_context(cfg: DictConfig, latency: bool = True) -> RunContext:
    """What a run of ``cfg`` builds before its first iteration (requests, predictions, model, hardware, KV capacity,
    latency model) with the means to run other configs: the argument of a policy's ``before_run`` hook."""
    check_config(cfg)
    return _context(cfg, latency)


def _context(cfg: DictConfig, latency: bool) -> RunContext:
    """``run_context`` of a config already checked."""
    arch, hw, capacity, _ = model_setup(cfg, latency=False)
    seed = int(cfg.seed)
    requests, predicted = build_requests(cfg, arch, np.random.SeedSequence(seed))
    too_long = np.flatnonzero(requests.prompt_tokens > arch.max_model_len)
    if len(too_long):
        i = too_long[0]
        hint = ("; workload.over_context=drop drops such requests (counted in a warning)"
                if "over_context" in cfg.workload else "")
        raise ConfigError(f"request {int(requests.request_id[i])} has a prompt of {int(requests.prompt_tokens[i])} tokens, "
                          f"longer than model '{arch.name}' context max_model_len={arch.max_model_len}{hint}")
    note = fit_note(arch, hw, capacity)
    if note:
        warnings.warn(note, stacklevel=3)
    return RunContext(cfg=cfg, requests=requests, predicted=predicted, arch=arch, hardware=hw,
                      latency=build_latency(cfg, arch, hw, capacity) if latency else None, capacity=capacity,
                      seed=seed, simulate=simulate, build_requests=build_requests, compose_policy=compose_policy,
                      instantiate=_instantiate)


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
    pred = _plain(cfg.predictor)
    for kind, key in (("gaussian_noise", "sigma"), ("uniform_noise", "epsilon"), ("lognormal_noise", "sigma")):
        if pred.get("kind") == kind and pred.get(key) == 0:
            notes.append(f"predictor={kind} with predictor.{key}=0 predicts every length exactly (the oracle); "
                         f"set predictor.{key} above 0 for noise")
    return notes


def simulate(cfg: DictConfig) -> Tuple[EngineResult, dict]:
    """Run one configuration in memory; returns the engine result and its summary."""
    started = time.perf_counter()
    check_config(cfg)
    policy = build_policy(cfg)
    for note in no_effect(cfg, policy):
        warnings.warn(note, stacklevel=2)
    ctx = _context(cfg, latency=True)
    arch, hw, latency, seed = ctx.arch, ctx.hardware, ctx.latency, ctx.seed
    after = getattr(policy, "after_run", None)
    engine = _prepared_engine(cfg, ctx, policy, seed)
    replicas = int(OmegaConf.select(cfg, "cluster.replicas", default=1))
    sim_started = time.perf_counter()
    if replicas == 1:
        result = engine.run()
    else:
        result = _run_cluster(cfg, ctx, policy, engine, replicas)
    name = OmegaConf.select(cfg, "policy.name", default=None) or getattr(policy, "name", type(policy).__name__)
    described = latency.describe()
    result.extra = {**result.extra, "policy": name, "model": arch.name, "hardware": hw.name, "seed": seed,
                    "latency": described, "simulate_seconds": round(time.perf_counter() - sim_started, 3),
                    "wall_seconds": round(time.perf_counter() - started, 3),
                    "provenance": provenance.record(_policy_target(cfg), _profile_paths(cfg), described)}
    if callable(after) and replicas == 1:
        after(result, ctx)
    return result, summarize(result)


def _prepared_engine(cfg: DictConfig, ctx: RunContext, policy, seed: int) -> StepEngine:
    """The engine of ``policy`` over the run's requests: the policy's ``before_run`` hook first (its answer checked,
    kvstudy/run_context.py), then ``reset(seed)``."""
    before = getattr(policy, "before_run", None)
    inputs = engine_inputs(policy, before(ctx)) if callable(before) else {}
    policy.reset(seed)
    return build_engine(cfg, ctx.requests, ctx.predicted, policy, ctx.latency, ctx.arch, ctx.hardware, ctx.capacity,
                        **inputs)


def build_router(cfg: DictConfig):
    """The ``router`` group's router (kvstudy/cluster/routers.py), reset with the run's seed."""
    router = _instantiate(cfg.router)
    router.reset(int(cfg.seed))
    return router


def _run_cluster(cfg: DictConfig, ctx: RunContext, policy, first: StepEngine, replicas: int) -> EngineResult:
    """``cluster.replicas`` > 1 (kvstudy/cluster/driver.py): ``first`` is replica 0's engine (``policy``'s); replica k
    gets its own policy instance (the policy's ``before_run`` hook run for it, reset with seed + k), memory and swap
    model; they share the latency model. Each policy's ``after_run`` annotates its replica's records before they are
    merged."""
    from kvstudy.cluster.driver import drive, merge

    if first.arrivals == "authors_code":
        raise ConfigError("engine.arrivals=authors_code (regime=authors) is the MC-SF authors' single-worker event "
                          "order; with cluster.replicas > 1 use regime=none")
    router = build_router(cfg)
    policies, engines = [policy], [first]
    for k in range(1, replicas):
        policies.append(build_policy(cfg))
        engines.append(_prepared_engine(cfg, ctx, policies[-1], ctx.seed + k))
    for engine in engines:
        engine.progress = False  # one bar per replica would interleave
    results, routed = drive(engines, router, ctx.requests.arrival_time.tolist())
    for policy, res in zip(policies, results):
        after = getattr(policy, "after_run", None)
        if callable(after):
            after(res, ctx)
    return merge(engines, results, routed, getattr(router, "name", type(router).__name__))


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM (``kill``, a cluster scheduler's stop) as Ctrl-C for the duration of one run, so the engine stops
    with status ``interrupted`` and what is done is written. Only in the main thread (signals are delivered
    there); the previous handler comes back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


#: keys that do not change a run's results: left out when a finished run's config is compared with a new one
_NOT_RESULTS = ("resume", "record", "engine.progress")


def _result_config(plain: dict) -> dict:
    plain = dict(plain)
    for key in _NOT_RESULTS:
        head, _, rest = key.partition(".")
        if rest and isinstance(plain.get(head), dict):
            plain[head] = {k: v for k, v in plain[head].items() if k != rest}
        elif not rest:
            plain.pop(head, None)
    return plain


#: keys added to conf/ after runs began recording their config, each with the value that means what a config
#: without it meant (a finished run's folder from before the key is the same config when this one has that value)
ADDED_KEYS = {"memory.prefix_caching": False, "policy.waiting_order": "fcfs", "workload.hash_block_size": 512,
              "policy.prefix_aware": False, "cluster": {"replicas": 1},
              "router": {"_target_": "kvstudy.cluster.routers.RoundRobin", "name": "round_robin"}}


def _first_difference(a, b, prefix: str = ""):
    """The first dotted key at which two plain configs differ, with both values (None: equal). A key of
    ``ADDED_KEYS`` absent from ``a`` (the earlier run) equals its value there."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            key = f"{prefix}.{k}" if prefix else str(k)
            there = a.get(k, ADDED_KEYS.get(key, "<absent>"))
            found = _first_difference(there, b.get(k, "<absent>"), key)
            if found:
                return found
        return None
    return None if a == b else (prefix, a, b)


def _profile_paths(cfg: DictConfig) -> list:
    """The profile files the config's latency model reads (Vidur's), for the fingerprint; none for other models."""
    from kvstudy.errors import KvStudyError
    from kvstudy.latency.models import profile_files

    if cfg.latency.get("name") != "vidur":
        return []
    try:
        prof = _plain(cfg.hardware).get("profiles") or {}
        files = profile_files(ModelArch.from_mapping(_plain(cfg.model)), hardware_spec(cfg), prof.get("root"),
                              prof.get("compute_dir"), prof.get("network_dir"))
    except (KvStudyError, TypeError, ValueError, KeyError):
        return []  # the run itself names what is wrong
    return [p for p in (files.mlp, files.attention, files.all_reduce, files.send_recv) if Path(p).is_file()]


def _policy_target(cfg: DictConfig):
    return OmegaConf.select(cfg, "policy._target_", default=None)


def fingerprint(cfg: DictConfig) -> str:
    """What a finished run's results depend on beyond its config (kvstudy/provenance.py)."""
    return provenance.fingerprint(_policy_target(cfg), _profile_paths(cfg))


def _resume_mode(cfg: DictConfig, resume) -> str:
    if resume is False:
        return "never"
    mode = OmegaConf.select(cfg, "resume", default="code") if resume is True else resume
    if mode not in provenance.RESUME_MODES:
        raise ConfigError(f"resume={mode!r}: allowed {', '.join(provenance.RESUME_MODES)} (code: skip a finished run "
                          f"of the same config and code; config: of the same config; never: run again)")
    return mode


def run(cfg: DictConfig, out_dir, resume=True) -> dict:
    """Simulate ``cfg`` and write resolved_config.yaml, requests.parquet, iterations.parquet (events.parquet and
    batches.parquet with ``record.events=true``), summary.json.

    A folder that already holds a finished run of the same config (keys that do not change results, ``resume``,
    ``record``, ``engine.progress``, aside) is handled by the ``resume`` mode, the config's ``resume`` key unless
    ``resume`` here is ``False`` (``never``) or a mode: ``code`` (the default) leaves it as it is and returns its
    summary (``"skipped": true``) if its code fingerprint (kvstudy/provenance.py) is this code's too, else runs it
    again; ``config`` leaves it whatever the code; ``never`` runs it again. A folder holding a finished run of a
    different config is an error in every mode, never overwritten.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: is a file, not a folder; choose another run folder (hydra.run.dir)")
    mode = _resume_mode(cfg, resume)
    check_config(cfg)  # before the config is resolved here: an interpolation that fails is named in one line
    resolved = OmegaConf.to_yaml(cfg, resolve=True)
    config_file = out / "resolved_config.yaml"
    summary = finished_summary(out)
    if summary is not None:
        if not config_file.exists():
            raise ConfigError(f"{out} holds a finished run without its resolved_config.yaml; choose another folder")
        try:
            old = OmegaConf.to_container(OmegaConf.load(config_file), resolve=False)
        except Exception as exc:  # a file another program wrote or a crash truncated
            raise ConfigError(f"{config_file}: not a readable config ({type(exc).__name__}); choose another folder "
                              f"or delete it") from None
        diff = _first_difference(_result_config(old), _result_config(OmegaConf.to_container(cfg, resolve=True)))
        if diff:
            key, there, here = diff
            raise ConfigError(f"{out} already holds a finished run of a different config ({key}: {there!r} there, "
                              f"{here!r} here); choose another folder (hydra.run.dir), or delete that one")
        stale = mode == "never"
        if mode == "code":
            stored = (summary.get("provenance") or {}).get("fingerprint")
            stale = stored != fingerprint(cfg)
            if stale:
                warnings.warn("a finished run of this config was made by other code (kvstudy's source, the policy's "
                              "module or the profiles differ, or it predates fingerprints): running it again "
                              "(resume=config keeps finished runs of the same config)", stacklevel=2)
        if OmegaConf.select(cfg, "record.events", default=False) and not (out / "events.parquet").exists():
            stale = True  # asked for what the finished run did not record
        if not stale:
            return {**summary, "skipped": True}
    with _sigterm_as_interrupt():
        result, summary = simulate(cfg)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("events.parquet", "batches.parquet"):  # a re-run without record.events leaves no stale tables
        if (out / name).exists() and result.events is None:
            (out / name).unlink()
    write_text_atomic(config_file, resolved)
    write_run(out, result, summary)
    return summary


@dataclass
class Run:
    folder: Path
    summary: dict

    @property
    def requests(self) -> pd.DataFrame:
        return pd.read_parquet(self.folder / "requests.parquet")

    @property
    def iterations(self) -> pd.DataFrame:
        return pd.read_parquet(self.folder / "iterations.parquet")

    @property
    def events(self) -> pd.DataFrame:
        """events.parquet (a run with ``record.events=true``; kvstudy/events.py)."""
        return self._optional("events")

    @property
    def batches(self) -> pd.DataFrame:
        """batches.parquet: each iteration's requests (a run with ``record.events=true``)."""
        return self._optional("batches")

    def _optional(self, name: str) -> pd.DataFrame:
        path = self.folder / f"{name}.parquet"
        if not path.exists():
            raise ConfigError(f"{self.folder}: no {name}.parquet; run with record.events=true to record it")
        return pd.read_parquet(path)

    @property
    def config(self) -> Optional[DictConfig]:
        path = self.folder / "resolved_config.yaml"
        return OmegaConf.load(path) if path.exists() else None


def load_run(folder) -> Run:
    folder = Path(folder)
    path = folder / "summary.json"
    if not path.exists():
        raise ConfigError(f"{folder}: no summary.json (the run did not finish or this is not a run folder)")
    try:
        summary = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc}); kvstudy writes it atomically, so another program changed "
                          f"it: delete the folder and run again") from None
    if not isinstance(summary, dict):
        raise ConfigError(f"{path}: not a run summary (a JSON object); delete the folder and run again")
    return Run(folder, summary)
