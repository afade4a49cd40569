"""Config values checked before anything runs: one clear line naming the key, the value and what is allowed.

The type and bounds of every key are declared once, in ``kvstudy/config/schema.py``; ``check_config`` checks a composed
config against them (then the few rules that tie two keys together: heads, tensor and pipeline parallelism, a
predictor's range), before any object is built, so a bad value is named under the user's own key and never
reaches the code that would misread it. The YAML defaults still answer which keys exist, so an override of a key
no config has (``policy.bogus=1``) is named before Hydra's multi-line error, and a group chosen without ``+``
that needs it (``policy=mcsf``) is told to write ``+policy=``.

The command line (``check_overrides``, before Hydra composes anything) reads its flags with Hydra's own parser
(``split_command_line``, so a flag's value is never taken for an override nor the reverse) and checks every key it
sets against the options the command line chooses (``_Choices``: the command line's, an experiment's, a policy's
choice of memory, the root defaults): ``K=V`` needs a key the option's config has, ``+K=V`` one its ``_target_``
takes that its config lacks (the schema's keys; for a ``_target_`` of one's own, its parameters), ``++K=V`` either.
So ``memory.decode_block_check=vllm`` on ``memory=paper`` and a misspelt ``+policy.chunksize=8`` end in one line
``<key>: not a setting of <group> '<option>'; it takes ...`` instead of Hydra's advice or silence.
"""
from __future__ import annotations

import difflib
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Set, Tuple

from omegaconf import DictConfig, OmegaConf

from kvstudy.errors import ConfigError
from kvstudy.running.paths import CONF_DIR
from kvstudy.cluster.handoff import read_handoff
from kvstudy.cluster.pools import read_pools
from kvstudy.config.schema import SCHEMA, key_spec, show
from kvstudy.config.user_files import _parameters, check_user_files, choice_values, search_dirs  # noqa: F401

#: groups chosen with + (not in the root defaults list)
APPENDED = ("policy", "demand", "algo", "experiment", "deployment")
_SKIP_GROUPS = ("hydra", "experiment", "algo", "regime")


def _walk(node, prefix: str, out: Set[str]) -> None:
    """Every dotted key under ``node`` (a leaf or an interpolation ends one)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("defaults", "hydra") and not prefix:
                continue
            _walk(value, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out.add(prefix)


@functools.lru_cache(maxsize=1)
def _root_keys() -> frozenset:
    """Keys conf/config.yaml itself sets (seed, engine.*, ...): present in every composed config."""
    found: Set[str] = set()
    _walk(OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"), resolve=False), "", found)
    return frozenset(found)


@functools.lru_cache(maxsize=8)
def config_keys(extra_dirs: tuple = ()) -> frozenset:
    """Every dotted key of the root config and of every option of every group (of kvstudy's ``conf/`` and of
    ``extra_dirs``, the user's ``hydra.searchpath`` folders: their own policies' keys). Values are the schema's
    (kvstudy/config/schema.py); this only says which keys exist."""
    found = set(_root_keys())
    groups = sorted(p for p in CONF_DIR.iterdir() if p.is_dir() and p.name not in _SKIP_GROUPS)
    groups += [Path(d) / p.name for d in extra_dirs for p in groups if (Path(d) / p.name).is_dir()]
    for group in groups:
        for option in sorted(group.glob("*.yaml")):
            node = OmegaConf.to_container(OmegaConf.load(option), resolve=False)
            node = {k: v for k, v in node.items() if k != "defaults"} if isinstance(node, dict) else node
            _walk(node, group.name, found)
    for group in ("experiment", "algo", "regime"):  # global-package files: what they set is allowed too (capacity: auto)
        for option in sorted((CONF_DIR / group).glob("*.yaml")):
            text = option.read_text()
            node = OmegaConf.to_container(OmegaConf.load(option), resolve=False)
            if "@package _global_" in text and isinstance(node, dict):
                _walk(node, "", found)
    return frozenset(found)


def known_key(key: str, extra_dirs: tuple = ()) -> bool:
    """True if some config (kvstudy's, or one in ``extra_dirs``) defines ``key`` or a key under it."""
    keys = config_keys(tuple(extra_dirs))
    return key in keys or any(k.startswith(key + ".") for k in keys)


def _resolved(cfg: DictConfig) -> dict:
    """The config as plain data with interpolations resolved; one that cannot be resolved is named by its key."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "config"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"{key}: cannot be resolved ({first}); allowed: a value, or an interpolation ${{...}} "
                          f"of a key the config has") from None


def _leaves(node, keys: Mapping, prefix: str = "") -> Iterable:
    """(dotted key, value) of a group's node; a key the schema declares is a leaf even if given a mapping."""
    for key, value in node.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and dotted not in keys and f"{prefix}.*" not in keys:
            yield from _leaves(value, keys, dotted)
        else:
            yield dotted, value


def _raw_at(raw, name: str, key: str):
    node = raw.get(name) if name else raw
    for part in key.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _check_values(plain: dict, raw: dict = None) -> None:
    """Each leaf against its Key. A value the config takes from another key (``${regime.arrivals}``) is checked
    after every value given directly, so a bad value is named under the key the user set, not a copy of it."""
    raw = plain if raw is None else raw
    groups = {k: v for k, v in SCHEMA.items() if k}
    root = {k: v for k, v in plain.items() if k not in groups and k != "hydra"}
    derived = []
    for name, node in [("", root)] + [(g, plain.get(g)) for g in groups]:
        if node is not None and not isinstance(node, dict):  # engine=5: a whole section replaced by one value
            raise ConfigError(f"{name}={show(node)}: allowed the {name} settings, set one by one ({name}.KEY=VALUE)")
        if not isinstance(node, dict):
            continue
        keys, _ = SCHEMA[name].keys_for(node)
        for key, value in _leaves(node, keys):
            if key.startswith("_") or key.rsplit(".", 1)[-1].startswith("_"):
                continue  # _target_ and Hydra's own keys: an unknown option is named when the group is chosen
            spec = key_spec(name, keys, key)
            if spec is None:
                if value is not None and any(k.startswith(key + ".") for k in keys):  # policy.slo=5
                    full = f"{name}.{key}" if name else key
                    raise ConfigError(f"{full}={show(value)}: allowed the {full} settings, set one by one "
                                      f"({full}.KEY=VALUE)")
                continue
            source = _raw_at(raw, name, key)
            if isinstance(source, str) and "${" in source:
                derived.append((name, key, value, spec, source))
            else:
                _check_one(name, key, value, spec)
    for name, key, value, spec, source in derived:
        _check_one(name, key, value, spec, source)


def _check_one(name: str, key: str, value, spec, source: str = None) -> None:
    if not spec.valid(value):
        full = f"{name}.{key}" if name else key
        origin = f" (from {source})" if source else ""
        raise ConfigError(f"{full}={show(value)}{origin}: {spec.allowed(value)}")


def _divisors(n: int) -> str:
    found = [d for d in range(1, min(n, 4096) + 1) if n % d == 0]
    return ", ".join(map(str, found[:12])) + (", ..." if len(found) > 12 else "")


def _check_together(plain: dict) -> None:
    """The rules that tie two keys together, each named under the key a user would change."""
    model, hw = plain.get("model") or {}, plain.get("hardware") or {}
    heads, kv, emb = model.get("num_q_heads"), model.get("num_kv_heads"), model.get("embedding_dim")
    name = model.get("name", "?")
    if heads and kv and heads % kv:
        raise ConfigError(f"model.num_kv_heads={kv}: does not divide model.num_q_heads={heads} of model '{name}'; "
                          f"allowed: a divisor of it ({_divisors(heads)}), each KV head serving a whole group of "
                          f"query heads")
    if heads and emb and emb % heads:
        raise ConfigError(f"model.embedding_dim={emb}: not a multiple of model.num_q_heads={heads} of model "
                          f"'{name}'; allowed: a multiple of it (head size = embedding_dim / num_q_heads)")
    tp, pp, layers = hw.get("tensor_parallel"), hw.get("pipeline_parallel"), model.get("num_layers")
    if tp and heads and emb and (heads % tp or emb % tp):
        raise ConfigError(f"hardware.tensor_parallel={tp}: does not divide model '{name}' (num_q_heads={heads}, "
                          f"embedding_dim={emb}); allowed: divisors of both ({_divisors(math.gcd(heads, emb))})")
    if pp and layers and layers % pp:
        raise ConfigError(f"hardware.pipeline_parallel={pp}: does not divide model '{name}' num_layers={layers}; "
                          f"allowed: a divisor of it ({_divisors(layers)}), each stage holding whole layers")
    if tp and kv and tp > kv and tp % kv:  # vLLM's QKVParallelLinear replicates KV heads only by a whole factor
        raise ConfigError(f"hardware.tensor_parallel={tp}: above model '{name}' num_kv_heads={kv} and not a multiple "
                          f"of it (vLLM replicates each KV head on tensor_parallel / num_kv_heads GPUs); allowed: a "
                          f"divisor of {kv} or a multiple of it")
    _check_hardware(plain)
    pred = plain.get("predictor") or {}
    if pred.get("kind") == "gaussian_noise" and pred.get("low") and pred.get("high") and pred["low"] > pred["high"]:
        raise ConfigError(f"predictor.low={pred['low']}: above predictor.high={pred['high']}; allowed: low <= high")
    slo = ((plain.get("policy") or {}).get("slo") or {}) if isinstance(plain.get("policy"), dict) else {}
    if isinstance(slo, dict) and isinstance(slo.get("low"), (int, float)) and isinstance(slo.get("high"), (int, float)) \
            and slo["low"] > slo["high"]:
        raise ConfigError(f"policy.slo.low={slo['low']}: above policy.slo.high={slo['high']}; allowed: low <= high")
    lat = plain.get("latency") or {}
    target = str(lat.get("_target_") or "")
    if target.endswith("LinearLatency") and lat.get("d0", 1) == 0 and lat.get("d1", 1) == 0:
        raise ConfigError("latency.d1=0: with latency.d0=0 an iteration takes no time; allowed: d0 > 0 or d1 > 0")
    if target.endswith("McsfAuthorsLatency") and lat.get("per_job_ms", 1) == 0 and \
            lat.get("intercept_ms", 1) == 0:
        raise ConfigError("latency.intercept_ms=0: with latency.per_job_ms=0 a batch takes no time; allowed: "
                          "intercept_ms > 0 or per_job_ms > 0")


def _own_compute_profiles(hw: Mapping) -> bool:
    """The hardware config points at compute profiles of its own (``hardware.profiles.root``/``compute_dir``), or
    the repository's ``profiles/compute/<device>/`` holds some: a device kvstudy/profiles/devices.py need not know."""
    from kvstudy.running.paths import PROFILES_DIR

    profiles = hw.get("profiles") if isinstance(hw.get("profiles"), dict) else {}
    if profiles.get("compute_dir") or profiles.get("root"):
        return True
    device = hw.get("device")
    return isinstance(device, str) and (PROFILES_DIR / "compute" / device).is_dir()


def _check_device_name(plain: dict) -> None:
    """``hardware.device`` is a GPU kvstudy knows (kvstudy/profiles/devices.py) or one with its own measured profiles;
    checked before the values, whose ``${device:...}`` numbers (conf/hardware/*.yaml) an unknown device leaves null."""
    from kvstudy.profiles.devices import DEVICES

    hw = plain.get("hardware") if isinstance(plain.get("hardware"), dict) else {}
    device = hw.get("device")
    if "device" in hw:
        check_value("hardware", hw, "device", device)  # a name at all (text), before what it names
    if isinstance(device, str) and device not in DEVICES and not _own_compute_profiles(hw):
        near = [d for d in DEVICES if d == device.strip().lower()]
        hint = f" (names are lower case: '{near[0]}')" if near else ""
        raise ConfigError(f"hardware.device={device!r}: no GPU of that name{hint}; allowed: {', '.join(DEVICES)} "
                          f"(kvstudy/profiles/devices.py), or a GPU of one's own with its measured profiles "
                          f"(hardware.profiles.root=<folder> holding compute/{device}/<model>/mlp.csv)")
    if isinstance(device, str) and device not in DEVICES and hw.get("pcie_gbps") is None:
        raise ConfigError(f"hardware.pcie_gbps=null: device {device!r} is not in kvstudy/profiles/devices.py, so its "
                          f"host link is not known; allowed: hardware.pcie_gbps=<GB/s per direction> (PCIe 4.0 x16: "
                          f"31.5, PCIe 5.0 x16: 63)")


def _check_hardware(plain: dict) -> None:
    """The hardware's device against the GPUs kvstudy knows (kvstudy/profiles/devices.py), under any latency model
    (the KV capacity and the summary read its memory and calibration too), and ``hardware.calibrated`` against the
    device's own; then the settings a cluster of replicas cannot take (said here, before any run, not in each)."""
    from kvstudy.profiles.devices import DEVICES

    hw = plain.get("hardware") or {}
    device = hw.get("device")
    _check_device_name(plain)
    node = hw.get("node")
    profiles = hw.get("profiles") if isinstance(hw.get("profiles"), dict) else {}
    from kvstudy.running.paths import PROFILES_DIR

    if isinstance(node, str) and not (profiles.get("root") or profiles.get("network_dir")) and \
            not (PROFILES_DIR / "network" / node).is_dir():
        nodes = sorted(p.name for p in (PROFILES_DIR / "network").iterdir() if p.is_dir())
        raise ConfigError(f"hardware.node={node!r}: no network profiles of that name (profiles/network/{node}/); "
                          f"allowed: {', '.join(nodes)}, or a node of one's own (hardware.profiles.network_dir=<folder "
                          f"with all_reduce.csv and send_recv.csv>)")
    gpu = DEVICES.get(device) if isinstance(device, str) else None
    calibrated = hw.get("calibrated")
    if gpu is not None and isinstance(calibrated, bool) and calibrated != gpu.calibrated and \
            not _own_compute_profiles(hw):
        fact = (f"borrows {gpu.calibration}'s fitted efficiencies (no measurement of {device})" if not gpu.calibrated
                else "is fitted to its own measurements")
        raise ConfigError(f"hardware.calibrated={str(calibrated).lower()}: device '{device}' {fact}; allowed: "
                          f"{str(gpu.calibrated).lower()} (kvstudy/profiles/devices.py), or true with compute "
                          f"profiles of one's own (hardware.profiles.root)")
    cluster = plain.get("cluster") or {}
    pools = read_pools(cluster)  # cluster.pools' shape (the options they name: at the run's assembly)
    read_handoff(cluster.get("handoff"))  # cluster.handoff's values (whether pools read it: at the run's assembly)
    replicas = sum(p.replicas for p in pools) if pools else cluster.get("replicas", 1)
    if isinstance(replicas, int) and replicas > 1:
        load = (plain.get("demand") or {}).get("load") if isinstance(plain.get("demand"), dict) else None
        what = f"cluster.pools ({replicas} replicas)" if pools else f"cluster.replicas={replicas}"
        if load is not None:
            raise ConfigError(f"demand.load={load} is relative to one replica's capacity; with {what} give demand.rate "
                              f"instead (allowed: one replica)")
        if (plain.get("engine") or {}).get("arrivals") == "authors_code":
            raise ConfigError(f"{what}: engine.arrivals=authors_code (regime=authors) is the MC-SF authors' "
                              f"single-worker event order; allowed: one replica, or regime=none")


def check_value(group: str, node: Mapping, key: str, value) -> None:
    """One key of a group's ``node`` against its declared type and bounds, for a value read from a config that may
    not have been through ``check_config`` (``build_requests`` on a config a policy's set-up composed)."""
    keys, _ = SCHEMA[group].keys_for(node)
    spec = key_spec(group, keys, key)
    if spec is not None:
        _check_one(group, key, value, spec)


def check_settings(group: str, node: Mapping, target: str, given: Iterable[str], takes: Iterable[str]) -> None:
    """The keys ``given`` to the option ``node`` of ``group`` against the parameters its ``_target_`` ``takes`` (one
    without ``**kwargs``): a key it does not take (``++memory.decode_block_check`` on ``memory=paper``) is named with
    the settings it takes. The schema declares the values of the options it knows; this covers any ``_target_``, a
    user's own too (called by kvstudy/running/targets.py as it instantiates the node)."""
    unknown = sorted(set(given) - set(takes))
    if unknown:
        raise ConfigError(f"{', '.join(f'{group}.{k}' for k in unknown)}: not a setting of {group} "
                          f"'{node.get('name', target)}' ({target}); it takes {', '.join(takes)}")


def check_group(group: str, values: Mapping) -> None:
    """One group's values (a model YAML the profile builder reads outside a composed config) against the schema."""
    plain = {group: dict(values)}
    _check_values(plain)
    _check_together(plain)


def check_config(cfg: DictConfig) -> None:
    """Every value of a composed config against its declared type and bounds (kvstudy/config/schema.py), then the rules
    that tie keys together. Raises ConfigError with one line ``<key>=<value>: allowed ...``."""
    plain = _resolved(cfg)
    _check_device_name(plain)
    _check_values(plain, OmegaConf.to_container(cfg, resolve=False))
    _check_together(plain)


def options(group: str, overrides: Iterable[str] = ()) -> list:
    """The options of a config group: kvstudy's ``conf/<group>/`` and the same folder of each search path."""
    folders = [CONF_DIR / group] + [d / group for d in search_dirs(overrides)]
    return sorted({p.stem for folder in folders for p in folder.glob("*.yaml")})


def check_group_choices(overrides: Iterable[str]) -> None:
    """An unknown option of a config group (``+policy=nope``, ``model=gpt5``), named with the options there are,
    before Hydra's multi-line composition error. Sweep values (``a,b``) are checked one by one; sweep functions
    such as ``choice(...)`` are left to Hydra."""
    overrides = list(overrides)
    for arg in overrides:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or key.startswith("hydra") or not (CONF_DIR / key).is_dir() or "(" in value or \
                value in ("", "null"):
            continue
        allowed = options(key, overrides)
        for choice in choice_values(arg) or value.split(","):  # as Hydra reads them: 'my hw' is my hw
            if choice not in allowed:
                dirs = search_dirs(overrides)
                where = (f"; looked in conf/{key}/ and {', '.join(str(d / key) + '/' for d in dirs)}" if dirs else
                         f"; an option of your own: put {choice}.yaml in <folder>/{key}/ and add "
                         f"hydra.searchpath=[file:///absolute/path/to/<folder>]")
                near = difflib.get_close_matches(choice, allowed, n=1)  # a typo: the option it most resembles
                hint = f"; did you mean '{near[0]}'?" if near else ""
                raise ConfigError(f"unknown {key} '{choice}'; allowed: {', '.join(allowed)}{where}{hint}")


@functools.lru_cache(maxsize=1)
def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def check_syntax(overrides: Iterable[str]) -> None:
    """An override Hydra's grammar cannot read (``seed=[1,``, ``policy.margin`` without a value), in one line
    instead of Hydra's three. ``overrides``: what Hydra's own parser takes for overrides (``split_command_line``: a
    flag's value, ``--cfg job``, is no override), so this check and Hydra's agree."""
    from hydra.errors import HydraException

    for arg in overrides:
        try:
            _parser().parse_overrides([arg])
        except HydraException as exc:
            lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()] or ["unreadable"]
            first = "; ".join(ln for ln in lines[:2] if not ln.startswith("See https"))
            raise ConfigError(f"{arg}: cannot be read ({first}); allowed: key=value in Hydra's override grammar "
                              f"(quote text with spaces or brackets: key='a b')") from None


def check_env_variables(overrides: Iterable[str]) -> None:
    """``${oc.env:NAME}`` without a default, NAME unset: one line before Hydra resolves it (in ``hydra.run.dir`` it
    would stop Hydra with a traceback; in a run's key, the run)."""
    import os
    import re

    for arg in overrides:
        key, _, value = arg.partition("=")
        for name, default in re.findall(r"\$\{oc\.env:\s*([^,}\s]+)\s*(,[^}]*)?\}", value):
            if not default and name not in os.environ:
                raise ConfigError(f"{arg}: the environment variable {name} is not set; allowed: set it (export "
                                  f"{name}=...), or give ${{oc.env:{name}}} a default: ${{oc.env:{name},VALUE}}")


def check_chosen_once(argv: Iterable[str], groups: Set[str]) -> None:
    """A group chosen twice with ``+`` (``+policy=a +policy=b``): one line, not Hydra's ``Multiple values``."""
    seen: Dict[str, str] = {}
    for arg in argv:
        key, sep, _ = arg.partition("=")
        if not sep or not key.startswith("+") or key.startswith("++"):
            continue
        bare = key.lstrip("+")
        if bare not in groups:
            continue
        if bare in seen:
            raise ConfigError(f"{arg}: {bare} is chosen twice (first {seen[bare]}); allowed: one +{bare}= per "
                              f"command line (to run several, sweep them: -m +{bare}=a,b)")
        seen[bare] = arg


def _chosen_by_experiment(overrides: List[str], group: str, dirs: tuple) -> Optional[Tuple[str, str]]:
    """("experiment 'NAME'", option) if an experiment on the command line chooses ``group`` in its defaults list
    (``- /demand: relative``): a plain ``group=X`` then replaces its choice and ``+group=X`` would choose it twice."""
    for arg in overrides:
        key, _, value = arg.partition("=")
        if key.lstrip("+") == "experiment" and "," not in value:
            opt = _load_option("experiment", value, dirs)
            for g, option in (opt.chooses if opt else ()):
                if g == group:
                    return f"experiment '{value}'", option
    return None


def check_overrides(argv: Iterable[str]) -> None:
    """Command-line overrides, before Hydra composes them, each mistake in one line instead of Hydra's several: a
    flag Hydra would refuse (``-m --cfg job``), an override the grammar cannot read, an unknown option of a group, a
    group chosen twice, a sweep without ``-m``, a launcher that cannot run here, a group that needs +, and every key
    (``K=V``, ``+K=V``, ``++K=V``, ``~K``) against the keys the options chosen on this command line have or take
    (``_check_key``: ``memory.decode_block_check`` on ``memory=paper``, ``+policy.chunksize`` on ``+policy=sarathi``).
    Values are checked after composition (``check_config``), so that a sweep's bad value fails its own run only."""
    overrides, _, args = split_command_line(argv)
    check_flags(args)
    check_syntax(overrides)
    check_env_variables(overrides)
    check_group_choices(overrides)
    check_user_files(overrides)  # the user's own option files, read as Hydra reads them (config/user_files.py)
    groups = {p.name for p in CONF_DIR.iterdir() if p.is_dir()}
    dirs = tuple(str(d) for d in search_dirs(overrides))
    check_chosen_once(overrides, groups)
    check_launcher(overrides)
    multirun = _is_multirun(overrides, args, dirs)
    if not multirun and args.cfg is None and args.info is None:
        check_single_values(overrides)
    choices = None
    for arg in overrides:
        if "=" not in arg and not arg.startswith("~"):
            continue
        key, _, _ = arg.partition("=")
        bare = key.lstrip("+~")
        if bare.startswith("hydra") or "/" in bare:
            continue
        if bare in groups:
            chosen = _chosen_by_experiment(overrides, bare, dirs)
            if bare in APPENDED and not key.startswith(("+", "~")) and not chosen:
                raise ConfigError(f"{bare} is chosen with a +: write +{bare}={arg.partition('=')[2]}")
            if chosen and key.startswith("+") and not key.startswith("++"):
                value = arg.partition("=")[2]
                raise ConfigError(f"{arg}: {chosen[0]} chooses {bare} already ({bare}={chosen[1]}); allowed: "
                                  f"{bare}={value} (without +: replaces the experiment's choice)")
            continue
        if key.startswith("~"):
            if not known_key(bare, dirs):
                raise ConfigError(f"{arg}: no config has the key {bare} to delete; allowed: ~KEY for a key the config "
                                  f"has")
            continue
        choices = choices or _Choices(overrides, dirs, multirun)
        _check_key(arg, choices, dirs)


# --- the command line's flags: Hydra's own parser, so kvstudy's check and Hydra's agree ------------------------------
#: Hydra's flags that take a value, by their argparse name (``--cfg job``), and its switches
_FLAG_VALUES = (("cfg", "--cfg"), ("package", "--package"), ("info", "--info"), ("config_path", "--config-path"),
                ("config_name", "--config-name"), ("config_dir", "--config-dir"),
                ("experimental_rerun", "--experimental-rerun"))
_FLAG_SWITCHES = (("help", "--help"), ("hydra_help", "--hydra-help"), ("resolve", "--resolve"), ("run", "--run"),
                  ("multirun", "--multirun"), ("shell_completion", "--shell-completion"))


def _flags_parser():
    """Hydra's own command-line parser (``hydra._internal.utils.get_args_parser``), its usage errors one line."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()

    def error(message):
        raise ConfigError(f"{_argparse_message(message)} (see python -m kvstudy --help)")

    parser.error = error
    return parser


def split_command_line(argv: Iterable[str]):
    """``argv`` as Hydra's parser reads it, flags anywhere (``--cfg job +policy=mcsf`` as ``+policy=mcsf --cfg
    job``): (the overrides in order, the flags as ``--flag=value`` / ``--switch``, argparse's namespace). A flag's
    value is what Hydra takes it to be, so no override is mistaken for a flag's value or the reverse; ``--info``
    followed by an override is ``--info`` alone (Hydra would read the override as its value and refuse it)."""
    argv = list(argv)
    for i, arg in enumerate(argv[:-1]):
        following = argv[i + 1]
        if arg in ("--info", "-i") and ("=" in following or following.startswith(("+", "~"))):
            argv[i] = "--info=all"
    args = _flags_parser().parse_intermixed_args(argv)
    flags = [flag for attr, flag in _FLAG_SWITCHES if getattr(args, attr, False)]
    flags += [f"{flag}={getattr(args, attr)}" for attr, flag in _FLAG_VALUES if getattr(args, attr, None) is not None]
    return list(args.overrides or []), flags, args


def check_flags(args) -> None:
    """Hydra's rules between its flags, checked where Hydra would raise them as a traceback (``-m --cfg job``,
    ``--resolve`` alone) or ignore a flag silently (``--package`` without ``--cfg``)."""
    commands = [flag for attr, flag in (("run", "--run"), ("multirun", "-m"), ("cfg", "--cfg"), ("info", "--info"),
                                        ("shell_completion", "--shell-completion"))
                if getattr(args, attr, None) not in (None, False)]
    if len(commands) > 1:
        raise ConfigError(f"{' and '.join(commands)} together: allowed one of --run, -m (--multirun), --cfg, --info, "
                          f"--shell-completion at a time (--cfg job prints the config a run would use)")
    if getattr(args, "resolve", False) and args.cfg is None and not args.help:
        raise ConfigError("--resolve: allowed only with --cfg (it resolves the interpolations of the config --cfg "
                          "prints)")
    if getattr(args, "package", None) is not None and args.cfg is None:
        raise ConfigError(f"--package {args.package}: allowed only with --cfg (the part of the config --cfg prints)")
    if getattr(args, "config_dir", None) is not None and not Path(args.config_dir).is_dir():
        raise ConfigError(f"--config-dir {args.config_dir}: not a folder; allowed: a folder of config files")
    if getattr(args, "experimental_rerun", None) is not None and not Path(args.experimental_rerun).is_file():
        raise ConfigError(f"--experimental-rerun {args.experimental_rerun}: no such file; allowed: a run's "
                          f".hydra/config.pickle")
    name = getattr(args, "config_name", None)
    if name is not None and getattr(args, "config_path", None) is None:
        folders = [CONF_DIR] + ([Path(args.config_dir)] if args.config_dir else [])
        if not any((f / name).is_file() or (f / f"{name}.yaml").is_file() for f in folders):
            raise ConfigError(f"--config-name {name}: no {name}.yaml in {', '.join(str(f) for f in folders)}; "
                              f"allowed: a config there (kvstudy's own: config)")


# --- the keys the chosen options have and take (issue 46) -------------------------------------------------------------
_ABSENT = object()


@dataclass(frozen=True)
class _Option:
    """One option file of a group, as the command line's check needs it: the dotted keys it sets (absolute:
    ``policy.margin``; a ``@package _global_`` file's own), its ``_target_`` and ``kind``, the options its defaults
    list chooses in other groups (``override /memory@_global_.memory: paged``) and, for an experiment, those its sweep
    chooses (``hydra.sweeper.params``; None for a sweep function such as ``choice(...)``)."""

    sets: Tuple[str, ...]
    target: Optional[str]
    kind: Optional[str]
    chooses: Tuple[Tuple[str, str], ...]
    sweeps: Tuple[Tuple[str, Optional[Tuple[str, ...]]], ...]
    multirun: bool


def _walk_ordered(node, prefix: str, out: list) -> None:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            if key in ("defaults", "hydra") and not prefix:
                continue
            _walk_ordered(value, f"{prefix}.{key}" if prefix else str(key), out)
    elif prefix and prefix not in out:
        out.append(prefix)


def _group_names(dirs: tuple) -> frozenset:
    return frozenset(p.name for folder in (str(CONF_DIR),) + tuple(dirs) if Path(folder).is_dir()
                     for p in Path(folder).iterdir() if p.is_dir() and p.name != "hydra")


@functools.lru_cache(maxsize=2048)
def _load_option(group: str, name: str, dirs: tuple = ()) -> Optional[_Option]:
    path = next((p for p in (Path(d) / group / f"{name}.yaml" for d in (str(CONF_DIR),) + tuple(dirs)) if p.is_file()),
                None)
    if path is None:
        return None
    text = path.read_text()
    node = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    node = node if isinstance(node, dict) else {}
    is_global = "@package _global_" in text
    sets: list = []
    chooses: list = []
    target, kind = node.get("_target_"), node.get("kind")
    for entry in node.get("defaults") or []:
        if isinstance(entry, str) and entry != "_self_":  # another option of the same group, inherited
            ref = entry.lstrip("/")
            parent_group, _, parent = ref.rpartition("/")
            inner = _load_option(parent_group or group, parent, dirs)
            if inner is not None:
                sets += [k for k in inner.sets if k not in sets]
                chooses += inner.chooses
                target, kind = target or inner.target, kind or inner.kind
        elif isinstance(entry, dict):
            for key, value in entry.items():
                key = str(key).strip()
                key = key[len("override "):].strip() if key.startswith("override ") else key
                chosen_group = key.lstrip("/").split("@")[0]
                if isinstance(value, str) and value and chosen_group != group:
                    chooses.append((chosen_group, value))
    body = {k: v for k, v in node.items() if k != "defaults"}
    _walk_ordered(body, "" if is_global else group, sets)
    hyd = node.get("hydra") if is_global and isinstance(node.get("hydra"), dict) else {}
    params = ((hyd.get("sweeper") or {}).get("params") or {}) if isinstance(hyd.get("sweeper"), dict) else {}
    sweeps = []
    for key, value in params.items():
        value = str(value)
        sweeps.append((str(key).lstrip("+"), None if "(" in value or "*" in value else
                       tuple(v.strip() for v in value.split(","))))
    return _Option(tuple(sets), target if isinstance(target, str) else None, kind if isinstance(kind, str) else None,
                   tuple(chooses), tuple(sweeps), str(hyd.get("mode", "")).upper() == "MULTIRUN")


@functools.lru_cache(maxsize=1)
def _root_defaults() -> Dict[str, str]:
    """Each group's option in conf/config.yaml's defaults list (model: llama2_70b, ...)."""
    out = {}
    for entry in OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml")).get("defaults") or []:
        if isinstance(entry, dict):
            for key, value in entry.items():
                if not str(key).startswith(("override", "hydra")) and isinstance(value, str):
                    out[str(key)] = value
    return out


class _Choices:
    """The options each group has on a command line: in Hydra's first composition (``primary``: a sweep's values
    left out, as Hydra composes a multirun's primary config) and over the runs (``runs``: every value of a sweep).
    A group maps to a set of options, empty if none is chosen, or None if any may be (``choice(...)``)."""

    def __init__(self, overrides: List[str], dirs: tuple, multirun: bool):
        self.dirs, self.multirun = dirs, multirun
        self.groups = _group_names(dirs)
        self.cmd: Dict[str, Tuple[Optional[tuple], bool]] = {}
        for arg in overrides:
            key, sep, value = arg.partition("=")
            bare = key.lstrip("+~")
            if bare not in self.groups:
                continue
            if key.startswith("~") or value in ("", "null"):
                self.cmd[bare] = ((), False)
            elif any(c in value for c in "([*"):
                self.cmd[bare] = (None, True)
            else:
                values = tuple(choice_values(arg) or (v.strip() for v in value.split(",")))
                self.cmd[bare] = (values, len(values) > 1)
        self.runs = self._view(primary=False)
        self.primary = self._view(primary=True) if multirun else self.runs
        self.policy_swept = self.cmd.get("policy", self.cmd.get("algo", ((), False)))[1] or (
            "policy" not in self.cmd and "algo" not in self.cmd and any(
                g in ("policy", "algo") for o in self._options("experiment", self.runs) for g, _ in o.sweeps))
        globals_ = [o for g in ("experiment", "algo", "regime") for o in self._options(g, self.runs)]
        self.global_sets = [k for o in globals_ for k in o.sets]

    def _options(self, group: str, view: dict) -> List[_Option]:
        names = view.get(group) or ()
        return [o for o in (_load_option(group, n, self.dirs) for n in sorted(names)) if o is not None]

    def _view(self, primary: bool) -> Dict[str, Optional[frozenset]]:
        view: Dict[str, Optional[frozenset]] = {}

        def from_cmd(group):
            if group in self.cmd:
                values, sweep = self.cmd[group]
                if not (primary and sweep):
                    return None if values is None else frozenset(values)
            return _ABSENT

        def from_experiments(group):
            found: set = set()
            for exp in self._options("experiment", view):
                found |= {o for g, o in exp.chooses if g == group}
                for g, values in ([] if primary else exp.sweeps):
                    if g == group:
                        if values is None:
                            return None
                        found |= set(values)
            return frozenset(found) if found else _ABSENT

        for group in ("experiment", "algo", "policy", "regime"):
            got = from_cmd(group)
            if got is _ABSENT and group != "experiment":
                got = from_experiments(group)
            if got is _ABSENT and group == "policy":
                got = frozenset(o for a in self._options("algo", view) for g, o in a.chooses if g == "policy") \
                    if view.get("algo") is not None else None
            if got is _ABSENT:
                got = frozenset([_root_defaults()[group]]) if group in _root_defaults() else frozenset()
            view[group] = got
        for group in sorted(self.groups - set(view)):
            got = from_cmd(group)
            if got is _ABSENT:
                got = from_experiments(group)
            if got is _ABSENT:
                fallback = {o for r in self._options("regime", view) for g, o in r.chooses if g == group} or (
                    {_root_defaults()[group]} if group in _root_defaults() else set())
                if view["policy"] is None:
                    got = None
                else:
                    found: set = set()
                    for policy in self._options("policy", view) or [None]:
                        own = {o for g, o in policy.chooses if g == group} if policy else set()
                        found |= own or fallback
                    got = frozenset(found)
            view[group] = got
        return view

    # -- keys ----------------------------------------------------------------------------------------------------
    def has(self, group: str, option: str) -> List[str]:
        """The keys the composed config has under ``group`` with ``option`` (relative: ``margin``)."""
        opt = _load_option(group, option, self.dirs)
        own = list(opt.sets) if opt else []
        keys = own + [k for k in self.global_sets if k not in own]
        return [k[len(group) + 1:] for k in keys if k.startswith(group + ".")]

    def takes(self, group: str, option: str) -> Optional[List[str]]:
        """The keys ``option`` of ``group`` takes (what it has, and what the schema declares for its ``_target_``;
        for a ``_target_`` the schema does not know, its parameters), or None if that cannot be known (a
        ``**kwargs``, a module that does not import here)."""
        keys = self.has(group, option)
        spec = SCHEMA.get(group)
        if spec is None:
            return keys
        opt = _load_option(group, option, self.dirs)
        by_value = (opt.kind if spec.by == "kind" else opt.target) if opt and spec.by else None
        declared, known = spec.keys_for({spec.by: by_value} if spec.by else {})
        keys += [k for k in declared if k not in keys]
        if known or not spec.by:
            return keys
        params = _parameters(by_value) if spec.by == "_target_" and by_value else None
        return None if params is None else keys + [p for p in params if p not in keys]


def _matches(key: str, keys: Iterable[str]) -> bool:
    """``key`` (relative, dotted) is one of ``keys``, a section of them, or under a ``prefix.*`` entry."""
    for k in keys:
        if k == key or k.startswith(key + ".") or (k.endswith(".*") and key.startswith(k[:-1]) and key != k[:-2]):
            return True
    return False


def _listed(keys: Iterable[str]) -> str:
    shown = [k for k in keys if not k.startswith("_") and k != "name" and ".__" not in k]
    return ", ".join(shown) if shown else "no settings"


def _options_text(group: str, names) -> str:
    shown = [f"'{n}'" for n in sorted(names)]
    return f"{group} " + (", ".join(shown[:-1]) + " or " + shown[-1] if len(shown) > 1 else "".join(shown))


@functools.lru_cache(maxsize=1)
def _root_keys_ordered() -> Tuple[str, ...]:
    """``_root_keys`` in conf/config.yaml's order (the order a message lists them in)."""
    found: list = []
    _walk_ordered(OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"), resolve=False), "", found)
    return tuple(found)


def _root_has(choices: _Choices) -> List[str]:
    """The keys of the root config that are no group's: conf/config.yaml's, and what a chosen experiment adds."""
    return list(_root_keys_ordered()) + [k for k in choices.global_sets if k.split(".")[0] not in choices.groups]


def _root_takes(choices: _Choices) -> List[str]:
    keys = _root_has(choices) + list(SCHEMA[""].common)
    for section in ("engine", "cluster"):
        keys += [f"{section}.{k}" for k in SCHEMA[section].common]
    return list(dict.fromkeys(keys))


def _check_key(arg: str, choices: _Choices, dirs: tuple) -> None:
    """One override of a key (``policy.margin=0.1``, ``+policy.foo=1``, ``++memory.block_size=32``) against the keys
    the options chosen on this command line have (a plain override) or take (``+``, ``++``)."""
    key, _, value = arg.partition("=")
    form = "++" if key.startswith("++") else "+" if key.startswith("+") else ""
    bare = key.lstrip("+")
    head, _, rel = bare.partition(".")
    try:
        sweep = _parser().parse_overrides([arg])[0].is_sweep_override()
    except Exception:  # check_syntax has named what cannot be read
        sweep = False
    if head not in choices.groups:  # the root config's own keys: seed, resume, engine.*, cluster.*, record.*
        has = _root_has(choices)
        takes = _root_takes(choices)
        if not _matches(bare, takes) and not _matches(bare, has):
            sections = sorted({k.split(".")[0] for k in takes if k.split(".")[0] == head})
            if sections:
                inner = [k[len(head) + 1:] for k in takes if k.startswith(head + ".")]
                if not form:
                    raise ConfigError(f"unknown key {bare}; keys of {head}: {_listed(inner)}")
                raise ConfigError(f"{bare}: not a setting of {head}; it takes {_listed(inner)}")
            tops = sorted({k.split(".")[0] for k in takes})
            raise ConfigError(f"{bare}: no such setting; the top-level settings are "
                              f"{', '.join(t + ('.*' if any(k.startswith(t + '.') for k in takes) else '') for t in tops)}"
                              f", and each config group's (GROUP=OPTION chooses one, GROUP.KEY=VALUE sets its keys: "
                              f"{', '.join(sorted(choices.groups))})")
        if form == "+" and _matches(bare, has):
            raise ConfigError(f"{arg}: {bare} exists already; allowed: {bare}={value} (to set it), or ++{bare}={value}")
        if not form and not _matches(bare, has):
            raise ConfigError(f"{arg}: {bare} is no key of this config yet; allowed: +{bare}={value} (to add it)")
        return
    group = head
    policy_key = group == "policy" and choices.policy_swept
    view = choices.runs if (form or sweep or policy_key) else choices.primary
    names = view.get(group)
    if not rel:
        return
    if names is None:  # a sweep function chooses the option: any may run
        if not known_key(bare, dirs):
            raise ConfigError(f"unknown key {bare}; no {group} option has it")
        return
    if not names:
        if choices.multirun and choices.runs.get(group):
            raise ConfigError(f"{arg}: {group} is chosen by the sweep, so Hydra's first composition has no {group} to "
                              f"set {bare} in; allowed: ++{bare}={value} (set in each run)")
        raise ConfigError(f"{arg}: no {group} is chosen; add +{group}=NAME with NAME one of: "
                          f"{', '.join(_all_options(group, dirs))}")
    has = {n: choices.has(group, n) for n in names}
    takes = {n: choices.takes(group, n) for n in names}
    if not form:
        if any(_matches(rel, h) for h in has.values()):
            return
        if not known_key(bare, dirs) and not any(t is None or _matches(rel, t) for t in takes.values()):
            near = list(dict.fromkeys(k for n in sorted(names) for k in has[n]))
            raise ConfigError(f"unknown key {bare}; keys of {group}: {_listed(near)} "
                              f"({_options_text(group, names)})")
        adds = [n for n in sorted(names) if takes[n] is None or _matches(rel, takes[n])]
        if adds:
            # another option whose config has the key is named first (memory=paged_offload for memory.offload.*):
            # adding the key to this option leaves the keys that option sets with it unset (issue 54)
            others = [o for o in _all_options(group, choices.dirs)
                      if o not in names and _matches(rel, choices.has(group, o))]
            # and only it: added alone to this option the key misses the keys that option sets beside it
            # (+memory.offload.host_gb on memory=paged fails on the tier's other settings; the new-user trial)
            if others:
                raise ConfigError(f"{arg}: {_options_text(group, adds)} has no {rel} in its config; allowed: "
                                  f"{group}={others[0]} {bare}={value} ({_options_text(group, others)} has {rel})")
            raise ConfigError(f"{arg}: {_options_text(group, adds)} has no {rel} in its config; allowed: "
                              f"+{bare}={value} (to add it: its _target_ takes it)")
        if view is choices.primary and choices.primary is not choices.runs:
            later = sorted(n for n in (choices.runs.get(group) or ()) if _matches(rel, choices.has(group, n)))
            if later:
                raise ConfigError(f"{arg}: not a setting of {_options_text(group, names)}, the {group} of the sweep's "
                                  f"first composition ({_options_text(group, later)} has it, chosen per run); "
                                  f"allowed: ++{bare}={value} (set in each run that takes it), or {group}="
                                  f"{later[0]} on the command line")
        _not_a_setting(bare, group, names, takes, choices)
    if form == "+" and all(_matches(rel, h) for h in has.values()):
        raise ConfigError(f"{arg}: {bare} exists already; allowed: {bare}={value} (to set it), or ++{bare}={value}")
    if any(t is None or _matches(rel, t) for t in takes.values()):
        return
    _not_a_setting(bare, group, names, takes, choices)


def _not_a_setting(bare: str, group: str, names, takes: dict, choices: _Choices) -> None:
    rel = bare[len(group) + 1:]
    listed = list(dict.fromkeys(k for n in sorted(names) for k in (takes[n] or [])))
    others = [o for o in _all_options(group, choices.dirs) if o not in names and _matches(rel, choices.has(group, o))]
    where = f" ({_options_text(group, others[:6])}{' ...' if len(others) > 6 else ''} has it)" if others else ""
    if len(names) > 1 or (group == "policy" and choices.policy_swept):
        raise ConfigError(f"{bare}: not a setting of any {group} of this sweep ({', '.join(sorted(names))}); they take "
                          f"{_listed(listed)}{where}")
    raise ConfigError(f"{bare}: not a setting of {_options_text(group, names)}; it takes {_listed(listed)}{where}")


def _all_options(group: str, dirs: tuple) -> List[str]:
    return sorted({p.stem for d in (str(CONF_DIR),) + tuple(dirs) for p in (Path(d) / group).glob("*.yaml")})


def _is_multirun(overrides: List[str], args, dirs: tuple) -> bool:
    if getattr(args, "multirun", False):
        return True
    for arg in overrides:
        key, _, value = arg.partition("=")
        if key.lstrip("+") == "hydra.mode":
            return value.upper() == "MULTIRUN"
    for arg in overrides:
        key, _, value = arg.partition("=")
        if key.lstrip("+") == "experiment":
            opt = _load_option("experiment", value, dirs)
            if opt is not None and opt.multirun:
                return True
    return False


def check_single_values(overrides: List[str]) -> None:
    """A sweep's values (``seed=0,1``) without ``-m``: one line instead of Hydra's four of "Ambiguous value"."""
    for arg in overrides:
        try:
            parsed = _parser().parse_overrides([arg])[0]
        except Exception:
            continue
        if parsed.is_sweep_override():
            key = arg.partition("=")[0]
            raise ConfigError(f"{arg}: several values without -m; allowed: -m to run one job per value, "
                              f"{key.lstrip('+')}=[a,b] for a list, or {key.lstrip('+')}='a,b' for text")


def check_launcher(overrides: List[str]) -> None:
    """``hydra/launcher=slurm`` or ``local_submitit``: the submitit plugin installed, and for SLURM ``sbatch`` on the
    PATH, said before anything is composed."""
    import importlib.util
    import shutil

    for arg in overrides:
        key, _, value = arg.lstrip("+").partition("=")
        if key != "hydra/launcher" or value not in ("slurm", "local_submitit"):
            continue
        if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None:
            raise ConfigError(f"hydra/launcher={value}: needs hydra-submitit-launcher (not installed): "
                              f"pip install -e \".[cluster]\"; or use hydra/launcher=kvstudy (the default)")
        if value == "slurm" and shutil.which("sbatch") is None:
            raise ConfigError(SLURM_NOT_FOUND)


#: hydra/launcher=slurm where there is no SLURM (kvstudy/config/validate.py and the launcher itself say it)
SLURM_NOT_FOUND = ("hydra/launcher=slurm: SLURM was not found (no sbatch on the PATH); on a machine without SLURM use "
                   "hydra/launcher=kvstudy (the default: worker processes here) or hydra/launcher=local_submitit")


def _argparse_message(message: str) -> str:
    """argparse's wording as kvstudy's: ``--trials 'abc': allowed a whole number``."""
    import re

    m = re.match(r"argument (\S+?)(?:/\S+)?: invalid (int|float|choice|Path) value: (.*?)(?: \(choose from (.*)\))?$",
                 message)
    if m:
        flag, kind, value, options = m.groups()
        allowed = {"int": "a whole number", "float": "a number", "Path": "a path"}.get(kind) or \
            (options or "").replace("'", "")
        return f"{flag} {value}: allowed {allowed}"
    m = re.match(r"argument (\S+?)(?:/\S+)?: invalid choice: (.*?) \(choose from (.*)\)$", message)
    if m:
        return f"{m.group(1)} {m.group(2)}: allowed {m.group(3).replace(chr(39), '')}"
    return message


def one_line_parser():
    """An ``argparse.ArgumentParser`` class whose usage errors raise ConfigError (one ``error:`` line from
    ``cli_entry``, status 2) instead of printing the usage block; its subparsers are of the same class."""
    import argparse

    class OneLineParser(argparse.ArgumentParser):
        def error(self, message):
            raise ConfigError(f"{_argparse_message(message)} (see {self.prog} --help)")

    return OneLineParser


def finite_args(**values) -> None:
    """Numeric command-line flags (``time_limit=inf``): nan and inf refused by name, as config values are."""
    for flag, value in values.items():
        if value is not None and not math.isfinite(value):
            raise ConfigError(f"--{flag.replace('_', '-')} {value}: allowed a finite number")
