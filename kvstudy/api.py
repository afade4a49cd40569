"""Python API: compose a config, run it, load a run's tables (what notebooks and tests use).

    from kvstudy import api
    cfg = api.compose(["+policy=mcsf", "+demand=high", "latency=unit"])
    summary = api.run(cfg, "outputs/my_run")
    run = api.load_run("outputs/my_run")        # run.summary, run.requests, run.iterations

This module only re-exports; each job lives in its own module of kvstudy/running/:

* ``compose.py``: composing a config (``compose``, ``compose_policy``) and reading its nodes (``plain``);
* ``targets.py``: importing and instantiating a config's ``_target_`` nodes (``instantiate``), with one-line errors;
* ``assemble.py``: building a run's pieces (``model_setup``, ``hardware_spec``, ``build_latency``, ``build_policy``,
  ``build_requests``, ``build_memory``, ``build_engine``, ``build_router``, ``run_context``) and ``simulate`` (one
  config in memory, several replicas through kvstudy/cluster/driver.py);
* ``no_effect.py``: settings that change nothing in a run, said as warnings (``no_effect``);
* ``execute.py``: ``run`` (the run folder, resume by config and code ``fingerprint``, SIGTERM as Ctrl-C);
* ``results.py``: loading a finished run (``Run``, ``load_run``).

Config values are checked by kvstudy/config/ (``schema.py`` declares every key, ``validate.py`` checks them).
"""
from __future__ import annotations

from kvstudy.config.validate import check_config, options
from kvstudy.costs.arch import ModelArch
from kvstudy.errors import ConfigError, KvStudyError
from kvstudy.running.assemble import (build_engine, build_latency, build_memory, build_policy, build_requests,
                                      build_router, hardware_spec, model_setup, run_context, simulate)
from kvstudy.running.assemble import profile_paths as _profile_paths
from kvstudy.running.compose import compose, compose_policy
from kvstudy.running.compose import plain as _plain
from kvstudy.running.execute import ADDED_KEYS, fingerprint, run
from kvstudy.running.no_effect import no_effect
from kvstudy.running.paths import CONF_DIR
from kvstudy.running.results import Run, load_run
from kvstudy.running.targets import instantiate as _instantiate

__all__ = [
    # composing (running/compose.py)
    "compose", "compose_policy",
    # building and simulating (running/assemble.py)
    "hardware_spec", "model_setup", "build_latency", "build_policy", "build_requests", "build_memory", "build_engine",
    "build_router", "run_context", "simulate",
    # warnings (running/no_effect.py)
    "no_effect",
    # a run folder (running/execute.py)
    "run", "fingerprint", "ADDED_KEYS",
    # a finished run (running/results.py)
    "Run", "load_run",
    # read through api by notebooks, tests and scripts
    "options", "check_config", "CONF_DIR", "ConfigError", "KvStudyError", "ModelArch",
    "_instantiate", "_plain", "_profile_paths",
]
