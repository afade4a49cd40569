"""Every run a command line would make, composed and checked before any runs (``python -m kvstudy.reproduce``'s
pre-check, ``--dry-run`` too).

The command line's own check (kvstudy/config/validate.py ``check_overrides``) reads keys, not values: a value is
checked when its run composes it, so ``reproduce offload -- memory.offload.host_gb=-1`` used to pass the pre-check and
then fail in every run, hours in. ``check_runs`` does what Hydra and kvstudy's sweeper would do, without running
anything: it composes the command line's primary config (an experiment's defaults, ``+demand=high`` chosen twice:
Hydra's own error, in one line), expands the sweep (the experiment's ``hydra.sweeper.params`` and the command line's
sweeps, as Hydra's basic sweeper does: a command-line key replaces the same key of the sweep), composes once per
distinct choice of config groups and applies each run's plain overrides as kvstudy's launcher does
(kvstudy/running/sweep_launcher.py ``job_config``), then checks every run's values and their combinations
(``check_config``). A run is checked if its choice of groups or one of its values is new (Table 1's 400 runs, eight
algorithms by 50 seeds: 57 checks): the overrides a user adds are in every run, so each of them meets every choice of
groups and every value of the sweep; combinations of the sweep's own values are the experiment's, checked by kvstudy's
tests.
"""
from __future__ import annotations

from typing import Sequence

from kvstudy.errors import ConfigError


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def check_runs(argv: Sequence[str], sweep: bool = True) -> int:
    """Compose and check every run ``python -m kvstudy <argv>`` would make (``sweep=False``: a sweep's first
    composition only, the config ``--cfg job`` prints); the number of runs. Raises ConfigError with the first bad
    run's one line (and, for a sweep, which run it is)."""
    from hydra import initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from kvstudy.config.cli_overrides import command_line
    from kvstudy.config.validate import check_config, split_command_line
    from kvstudy.running import sweep_launcher
    from kvstudy.running.paths import CONF_DIR

    overrides, _, args = split_command_line(command_line(list(argv)))
    is_hydra = [o.lstrip("+~").startswith(("hydra.", "hydra/")) for o in overrides]
    task = [o for o, h in zip(overrides, is_hydra) if not h]
    parser = OverridesParser.create()
    saved = dict(sweep_launcher._BASES)  # the launcher's compositions, borrowed: this process launches nothing
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            loader = GlobalHydra.instance().config_loader()
            primary = loader.load_configuration("config", list(overrides), run_mode=RunMode.MULTIRUN)
            multirun = sweep and (getattr(args, "multirun", False) or str(OmegaConf.select(primary, "hydra.mode")) in (
                "MULTIRUN", "RunMode.MULTIRUN"))
            if not multirun:
                cfg = loader.load_configuration("config", list(overrides), run_mode=RunMode.RUN)
                check_config(sweep_launcher.task_config(cfg))
                return 1
            params = OmegaConf.to_container(primary.hydra.sweeper.params, resolve=False) or {}
            given = {o.partition("=")[0].lstrip("+~") for o in task}
            listed = [f"{k}={v}" for k, v in params.items() if str(k).lstrip("+~") not in given] + task
            jobs = BasicSweeper.split_arguments(parser.parse_overrides(listed), None)[0]
            seen = set()
            for idx, job in enumerate(jobs):
                sig = sweep_launcher.signature(job)
                fresh = ({sig} | set(job)) - seen
                if not fresh:  # its group choices and each of its values are checked in other runs (docstring)
                    continue
                seen |= fresh
                if sig not in sweep_launcher._BASES:
                    sweep_launcher.remember(loader.load_sweep_config(primary, list(sig)), sig)
                try:
                    run, _ = sweep_launcher.job_config(sig, job, idx)
                    check_config(run)
                except ConfigError as exc:
                    which = f" (in run {idx + 1} of {len(jobs)}: {' '.join(job)})" if len(jobs) > 1 else ""
                    raise ConfigError(f"{exc}{which}") from None
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"cannot compose python -m kvstudy {' '.join(argv)}: {_first_line(exc)}") from None
    finally:
        sweep_launcher._BASES.clear()
        sweep_launcher._BASES.update(saved)
    return len(jobs) if multirun else 1


def cfg_notes(argv: Sequence[str]) -> list:
    """``python -m kvstudy ... --cfg job`` prints the config a run would use and runs nothing: what that run would
    refuse or ignore is said too (warnings on stderr, after Hydra's print), so the printed config is not taken for a
    good one. Empty without ``--cfg`` or for a sweep (``--cfg`` shows its first composition only)."""
    from kvstudy.config.validate import split_command_line

    overrides, _, args = split_command_line(list(argv))
    if getattr(args, "cfg", None) not in ("job", "all"):
        return []
    try:
        check_runs(list(overrides), sweep=False)
    except ConfigError as exc:
        return [f"a run of this config would stop: {exc}"]
    from kvstudy.running.compose import compose
    from kvstudy.running.no_effect import offload_notes, parallel_notes

    try:
        cfg = compose(overrides)
    except ConfigError:
        return []
    return offload_notes(cfg) + parallel_notes(cfg)
