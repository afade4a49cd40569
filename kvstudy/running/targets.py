"""Importing and instantiating a config's ``_target_`` nodes (the memory, swap, latency, policy, workload, router
objects a run builds). A target that cannot be imported is named in one line (a user's own module: its file and
line), never an internal error or Hydra's guess; a key the target does not take is named by
kvstudy/config/validate.py (``check_settings``), the one place config values and keys are checked."""
from __future__ import annotations

import importlib
import inspect
import os
import traceback

from hydra.utils import instantiate as hydra_instantiate
from omegaconf import DictConfig

from kvstudy.config.validate import check_settings
from kvstudy.errors import ConfigError, KvStudyError
from kvstudy.running.compose import group_of, plain

_TARGETS: dict = {}
#: keys of a group's node that the run reads itself, not passed to its ``_target_``: memory.gpu_memory_utilization
#: and memory.non_torch_gib size ``capacity_tokens=auto`` (kvstudy/costs/capacity.py) before the memory model is built
RUN_SETTINGS = {"memory": ("gpu_memory_utilization", "non_torch_gib")}
_SIGNATURES: dict = {}  # target -> its call signature (None: not introspectable), for naming unknown keys


def nested_target(value) -> bool:
    """Does a plain value hold a ``_target_`` node anywhere inside it?"""
    if isinstance(value, dict):
        return "_target_" in value or any(nested_target(v) for v in value.values())
    if isinstance(value, list):
        return any(nested_target(v) for v in value)
    return False


def instantiate(node: DictConfig, **kwargs):
    """Instantiate a ``_target_`` node; objects are passed afterwards (Hydra would turn dataclasses into configs).
    The parameters are plain containers already, so the target is called directly (what ``hydra.utils.instantiate``
    with ``_convert_="all"`` does, at a fraction of its cost per run in a sweep); a node with nested ``_target_``
    nodes still goes through Hydra."""
    params = plain(node)
    params.pop("name", None)
    for key in RUN_SETTINGS.get(group_of(node), ()):  # read by the run, not arguments of the target
        params.pop(key, None)
    for key in kwargs:  # given at call time (an object built first: memory.connector): the config's is not built
        params.pop(key, None)
    if nested_target({k: v for k, v in params.items() if k != "_target_"}) or "_target_" not in params:
        return hydra_instantiate(params, _partial_=True, _convert_="all")(**kwargs)
    target = params.pop("_target_")
    fn = _TARGETS.get(target)
    if fn is None:
        fn = _TARGETS[target] = load_target(target, group_of(node))
    if target not in _SIGNATURES:
        try:
            _SIGNATURES[target] = inspect.signature(fn)
        except (TypeError, ValueError):
            _SIGNATURES[target] = None
    signature = _SIGNATURES[target]
    if signature is not None and not any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        # a key this option does not take (++memory.decode_block_check on memory=paper, say)
        check_settings(group_of(node), node, target, params, signature.parameters)
    return fn(**{**params, **kwargs})  # as a partial: call-time arguments win over the config's


def load_target(target: str, group: str):
    """The object a ``_target_`` names (``module.attr``, or ``module.Class.attr``). A module that cannot be imported
    is named as such, with where it failed (a user's own policy module: its file and line), never an internal
    error or Hydra's guess."""
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


def takes_rng(target: str) -> bool:
    """Does the workload function ``target`` take the run's random generator (a parameter ``rng``)?"""
    try:
        fn = load_target(target, "workload")
        return "rng" in inspect.signature(fn).parameters
    except (KvStudyError, TypeError, ValueError):
        return False  # the instantiation names the problem
