"""Config values checked before anything runs: one clear line naming the key, the value and what is allowed.

The type and bounds of every key are declared once, in ``kvstudy/schema.py``; ``check_config`` checks a composed
config against them (then the few rules that tie two keys together: heads, tensor and pipeline parallelism, a
predictor's range), before any object is built, so a bad value is named under the user's own key and never
reaches the code that would misread it. The YAML defaults still answer which keys exist, so an override of a key
no config has (``policy.bogus=1``) is named before Hydra's multi-line error, and a group chosen without ``+``
that needs it (``policy=mcsf``) is told to write ``+policy=``.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Dict, Iterable, Mapping, Set

from omegaconf import DictConfig, OmegaConf

from kvstudy.errors import ConfigError
from kvstudy.paths import CONF_DIR
from kvstudy.schema import SCHEMA, key_spec, show

#: groups chosen with + (not in the root defaults list)
APPENDED = ("policy", "demand", "algo", "experiment")
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
    (kvstudy/schema.py); this only says which keys exist."""
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


def check_group(group: str, values: Mapping) -> None:
    """One group's values (a model YAML the profile builder reads outside a composed config) against the schema."""
    plain = {group: dict(values)}
    _check_values(plain)
    _check_together(plain)


def check_config(cfg: DictConfig) -> None:
    """Every value of a composed config against its declared type and bounds (kvstudy/schema.py), then the rules
    that tie keys together. Raises ConfigError with one line ``<key>=<value>: allowed ...``."""
    plain = _resolved(cfg)
    _check_values(plain, OmegaConf.to_container(cfg, resolve=False))
    _check_together(plain)


def search_dirs(overrides: Iterable[str] = ()) -> list:
    """Config folders a user adds with Hydra's ``hydra.searchpath=[file:///my/conf]`` (their own models, hardware,
    policies in ``<folder>/<group>/<name>.yaml``), after kvstudy's own ``conf/``."""
    dirs = []
    for arg in overrides:
        key, _, value = arg.lstrip("+").partition("=")
        if key == "hydra.searchpath":
            for item in value.strip("[]").split(","):
                item = item.strip().strip("'\"")
                if item.startswith("file://"):
                    dirs.append(Path(item[len("file://"):]))
    return dirs


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
        for choice in value.split(","):
            if choice not in allowed:
                dirs = search_dirs(overrides)
                where = (f"; looked in conf/{key}/ and {', '.join(str(d / key) + '/' for d in dirs)}" if dirs else
                         f"; an option of your own: put {choice}.yaml in <folder>/{key}/ and add "
                         f"hydra.searchpath=[file:///absolute/path/to/<folder>]")
                raise ConfigError(f"unknown {key} '{choice}'; allowed: {', '.join(allowed)}{where}")


@functools.lru_cache(maxsize=1)
def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


#: Hydra's command-line flags that take a value (``--cfg job``): the value is not an override
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                     "--config-dir", "-cd", "--info", "-i", "--experimental-rerun"}


def check_syntax(argv: Iterable[str]) -> None:
    """An override Hydra's grammar cannot read (``seed=[1,``, ``policy.margin`` without a value), in one line
    instead of Hydra's three."""
    from hydra.errors import HydraException

    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg.startswith("-") or (i and argv[i - 1] in _FLAGS_WITH_VALUE and "=" not in arg):
            continue
        try:
            _parser().parse_overrides([arg])
        except HydraException as exc:
            lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()] or ["unreadable"]
            first = "; ".join(ln for ln in lines[:2] if not ln.startswith("See https"))
            raise ConfigError(f"{arg}: cannot be read ({first}); allowed: key=value in Hydra's override grammar "
                              f"(quote text with spaces or brackets: key='a b')") from None


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


def check_overrides(argv: Iterable[str]) -> None:
    """Command-line overrides, before Hydra composes them, each mistake in one line instead of Hydra's several: an
    override the grammar cannot read, an unknown option of a group, a group chosen twice, a key no config has
    (to set or to delete), a group that needs +, a + on a key every config has. Values are checked after
    composition (``check_config``), so that a sweep's bad value fails its own run only."""
    argv = list(argv)
    check_syntax(argv)
    check_group_choices(argv)
    groups = {p.name for p in CONF_DIR.iterdir() if p.is_dir()}
    dirs = tuple(search_dirs(argv))
    check_chosen_once(argv, groups)
    for arg in argv:
        if arg.startswith("-") or ("=" not in arg and not arg.startswith("~")):
            continue
        key, _, _ = arg.partition("=")
        plus = key.startswith("+")
        bare = key.lstrip("+~")
        if bare.startswith("hydra") or "/" in bare:
            continue
        if bare in groups:
            if bare in APPENDED and not key.startswith(("+", "~")):
                raise ConfigError(f"{bare} is chosen with a +: write +{bare}={arg.partition('=')[2]}")
            continue
        if key.startswith("~") and not known_key(bare, dirs):
            raise ConfigError(f"{arg}: no config has the key {bare} to delete; allowed: ~KEY for a key the config "
                              f"has")
        if plus and not key.startswith("++") and bare in _root_keys():
            value = arg.partition("=")[2]
            raise ConfigError(f"{arg}: {bare} exists already; allowed: {bare}={value} (to set it), or ++{bare}={value}")
        if plus or key.startswith("~"):
            continue  # + adds a key on purpose; ~ deletes one (Hydra checks it exists)
        if not known_key(bare, dirs):
            head = bare.split(".")[0]
            near = sorted(k[len(head) + 1:] for k in config_keys(dirs) if k.startswith(head + ".") and "." not in
                          k[len(head) + 1:])
            hint = f"; keys of {head}: {', '.join(near)}" if near else ""
            raise ConfigError(f"unknown key {bare}{hint} (to add a key on purpose write +{bare}=...)")


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
    m = re.match(r"argument (\S+): invalid choice: (.*?) \(choose from (.*)\)$", message)
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
