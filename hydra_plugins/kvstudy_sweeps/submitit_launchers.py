"""``hydra/launcher=local_submitit`` and ``slurm`` (conf/hydra/launcher/): hydra-submitit-launcher's launchers, saying
what a sweep did as kvstudy's own launcher does (kvstudy/running/sweep_launcher.py): each run's line (read from its
folder: ``summary.json`` or ``error.txt``) and ``sweep done: ...`` when the jobs are done. ``slurm`` where there is no
SLURM (no ``sbatch`` on the PATH) or submitit fails to submit ends in one ``error:`` line, not a traceback.

The submitit plugin is optional (``pip install -e ".[cluster]"``): without it this module defines nothing, and
kvstudy's command line says what to install before Hydra composes anything (kvstudy/config/validate.py
``check_launcher``).
"""
from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Sequence

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher, SlurmLauncher
except ImportError:  # the optional plugin is not installed
    LocalLauncher = SlurmLauncher = None


def _say(launch, job_overrides: Sequence[Sequence[str]], initial_job_idx: int):
    """Run ``launch`` (submitit's, which waits for every job), then print each run's line and the summary."""
    from kvstudy.running.sweep_launcher import FAILED, folder_result, say_run, summary_line, sweep_dir_of

    start_wall, start = time.time(), time.monotonic()
    returns = launch(job_overrides, initial_job_idx)
    kinds, sweep_dirs = [], set()
    for k, ret in enumerate(returns):
        hydra_cfg = getattr(ret, "hydra_cfg", None)
        folder = Path(str(hydra_cfg.hydra.runtime.output_dir)) if hydra_cfg is not None else None
        if folder is None:
            kind, line = FAILED, "error: the job returned no run folder (see its submitit log)"
        else:
            sweep_dirs.add(str(sweep_dir_of(folder, hydra_cfg.hydra.sweep.subdir)))  # the folder the run is in
            kind, line = folder_result(folder, start_wall)
            if kind != FAILED and getattr(getattr(ret, "status", None), "name", "") == "FAILED":
                kind, line = FAILED, f"error: {ret._return_value!r}"
        say_run(initial_job_idx + k, str(folder), line)
        kinds.append(kind)
    print(summary_line(kinds, time.monotonic() - start, sweep_dirs), flush=True)
    return returns


def _refuse(message: str) -> None:
    from kvstudy.errors import ConfigError, report

    sys.exit(report(ConfigError(message)))


if LocalLauncher is not None:
    class KvstudyLocalLauncher(LocalLauncher):
        """``hydra/launcher=local_submitit``: submitit's local executor, each run's result and the summary said."""

        def launch(self, job_overrides, initial_job_idx):
            return _say(super().launch, job_overrides, initial_job_idx)

    class KvstudySlurmLauncher(SlurmLauncher):
        """``hydra/launcher=slurm``: one line, not a traceback, where there is no SLURM or submitting fails."""

        def launch(self, job_overrides, initial_job_idx):
            from kvstudy.config.validate import SLURM_NOT_FOUND

            if shutil.which("sbatch") is None:
                _refuse(SLURM_NOT_FOUND)
            try:
                return _say(super().launch, job_overrides, initial_job_idx)
            except Exception as exc:  # sbatch refusing the job array, submitit failing to read its answer, ...
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                _refuse(f"hydra/launcher=slurm: the sweep on SLURM failed ({type(exc).__name__}: {first}); check "
                        f"hydra.launcher.partition and the settings in conf/hydra/launcher/slurm.yaml, or run here "
                        f"with hydra/launcher=kvstudy (the default)")
