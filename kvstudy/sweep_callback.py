"""A sweep in which some runs fail still finishes the others (issue 27).

In a multirun, ``python -m kvstudy`` records a run's user error in that run's folder (``error.txt``) instead
of stopping the whole sweep; this Hydra callback (registered in ``conf/config.yaml``) then counts the failed
runs when the sweep ends, prints one line per failure and exits with status 2, so a script or a scheduler sees
that the sweep is incomplete. Re-running the sweep redoes only the failed and unfinished runs.
"""
from __future__ import annotations

import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

ERROR_FILE = "error.txt"


def record_error(folder, text: str) -> None:
    """Write a run's ``error.txt``, unless the folder holds a finished run (never mark another run as failed)."""
    from kvstudy.atomic import write_text_atomic
    from kvstudy.outputs import is_complete

    if not is_complete(folder):
        write_text_atomic(Path(folder) / ERROR_FILE, text)


def internal_error_text(exc: BaseException) -> str:
    """``error.txt`` of an exception that is no user error: its repr and traceback."""
    import traceback

    return f"internal error: {exc!r}\n{''.join(traceback.format_exception(exc))}"


def run_recording_errors(cfg: DictConfig, folder, record: bool = True) -> dict:
    """``api.run`` for one run of a sweep (both ``python -m kvstudy -m`` paths): a user error is recorded in the
    run's ``error.txt`` (with ``record``) and raised again; a run that succeeds clears one an earlier attempt left."""
    from kvstudy import api
    from kvstudy.errors import KvStudyError

    error_file = Path(folder) / ERROR_FILE
    try:
        summary = api.run(cfg, folder)
    except KvStudyError as exc:
        if record:
            record_error(folder, f"{exc}\n")
        raise
    if error_file.exists():  # an earlier attempt of this run failed; this one did not
        error_file.unlink()
    return summary


class FailedRuns(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        root = Path(config.hydra.sweep.dir)
        failed = sorted(p for p in root.rglob(ERROR_FILE)) if root.exists() else []
        if not failed:
            return
        for path in failed:
            print(f"error: {path.parent}: {path.read_text().strip().splitlines()[0]}", file=sys.stderr)
        print(f"error: {len(failed)} run(s) of the sweep in {root} failed (above); the others finished",
              file=sys.stderr)
        sys.exit(2)
