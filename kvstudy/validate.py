"""Config values checked before anything runs: one clear line naming the key, the value and what is allowed.

Types come from the configs themselves: a key whose default in any option of its group (or in the root
``config.yaml``) is a number must be given a number, a true/false key true or false. Whole-number keys and
ranges are listed here (``WHOLE``, ``AT_LEAST``). The same tables answer which keys exist, so an override of a
key no config has (``policy.bogus=1``) is named before Hydra's multi-line error, and a group chosen without
``+`` that needs it (``policy=mcsf``) is told to write ``+policy=``.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Dict, Iterable, Set

from omegaconf import DictConfig, OmegaConf

from kvstudy.errors import ConfigError
from kvstudy.paths import CONF_DIR

#: keys that count something: a whole number (floats such as 1.5 are refused, 1e3 is 1000)
WHOLE = {"seed", "workload.num_requests", "workload.max_total_tokens", "workload.length_seed", "engine.stall_limit",
         "engine.max_iterations", "memory.block_size", "latency.max_batch_size", "engine.max_batch"}
#: lower bounds (inclusive)
AT_LEAST = {"seed": 0, "workload.num_requests": 1, "workload.max_total_tokens": 2, "workload.length_seed": 0,
            "engine.stall_limit": 1, "engine.max_iterations": 1, "engine.max_batch": 1}
#: groups chosen with + (not in the root defaults list)
APPENDED = ("policy", "demand", "algo", "experiment")
_SKIP_GROUPS = ("hydra", "experiment", "algo", "regime")


def _walk(node, prefix: str, out: Dict[str, Set[type]]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("defaults", "hydra") and not prefix:
                continue
            _walk(value, f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(node, str) and node.startswith("${"):  # an interpolation: a key that exists, of no fixed type
        out.setdefault(prefix, set())
    else:
        out.setdefault(prefix, set()).add(type(node))


@functools.lru_cache(maxsize=1)
def default_types() -> Dict[str, frozenset]:
    """Dotted key -> the Python types of its defaults over the root config and every option of every group."""
    found: Dict[str, Set[type]] = {}
    root = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"), resolve=False)
    _walk(root, "", found)
    for group in sorted(p for p in CONF_DIR.iterdir() if p.is_dir() and p.name not in _SKIP_GROUPS):
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
    return {k: frozenset(v) for k, v in found.items()}


def known_key(key: str) -> bool:
    """True if some config defines ``key`` or a key under it."""
    types = default_types()
    return key in types or any(k.startswith(key + ".") for k in types)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_value(key: str, value) -> None:
    """Raise ConfigError if ``value`` is not what ``key`` takes."""
    seen = default_types().get(key)
    if value is None or not seen:
        return
    kinds = set(seen) - {type(None)}
    if kinds == {bool}:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}={value!r}: allowed true or false")
        return
    if kinds and kinds <= {int, float}:
        if not _number(value):
            raise ConfigError(f"{key}={value!r}: allowed a number" + (" (a whole number)" if key in WHOLE else ""))
    if key in WHOLE and _number(value) and float(value) != int(value):
        raise ConfigError(f"{key}={value!r}: allowed a whole number")
    if key in AT_LEAST and _number(value) and value < AT_LEAST[key]:
        raise ConfigError(f"{key}={value!r}: allowed a whole number >= {AT_LEAST[key]}")


def check_config(cfg: DictConfig) -> None:
    """Every value of a composed config against ``check_value``."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    leaves: Dict[str, object] = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            leaves[prefix] = node

    walk(plain, "")
    for key, value in leaves.items():
        check_value(key, value)


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
                raise ConfigError(f"unknown {key} '{choice}'; allowed: {', '.join(allowed)}")


def check_overrides(argv: Iterable[str]) -> None:
    """Command-line overrides, before Hydra composes them: an unknown option of a group, a key no config has, a
    group that needs +."""
    argv = list(argv)
    check_group_choices(argv)
    groups = {p.name for p in CONF_DIR.iterdir() if p.is_dir()}
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
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
        if plus or key.startswith("~"):
            continue  # + adds a key on purpose; ~ deletes one (Hydra checks it exists)
        if not known_key(bare):
            head = bare.split(".")[0]
            near = sorted(k[len(head) + 1:] for k in default_types() if k.startswith(head + ".") and "." not in
                          k[len(head) + 1:])
            hint = f"; keys of {head}: {', '.join(near)}" if near else ""
            raise ConfigError(f"unknown key {bare}{hint} (to add a key on purpose write +{bare}=...)")
