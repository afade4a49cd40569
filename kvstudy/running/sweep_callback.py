"""A sweep in which some runs fail still finishes the others (issue 27); the run and sweep folders checked before
Hydra touches them, and Hydra's record of a finished run kept (issue 46).

In a multirun, ``python -m kvstudy`` records a run's user error in that run's folder (``error.txt``) instead
of stopping the whole sweep; this Hydra callback (registered in ``conf/config.yaml``) then counts the failed
runs when the sweep ends, prints one line per failure and exits with status 2, so a script or a scheduler sees
that the sweep is incomplete. Re-running the sweep redoes only the failed and unfinished runs.

Before Hydra makes the run folder (``hydra.run.dir``) or the sweep folder (``hydra.sweep.dir``), the same callback
checks it with kvstudy/running/paths.py's ``prepare_dir``: a file, a path under a file or a folder that cannot be
written is one ``error:`` line, status 2, before any work. And since Hydra writes its record (``.hydra/``: the
config, its own settings, the overrides) into the run folder before the run starts, the record already there is
kept in memory and put back when the run leaves the folder's results as they were (refused for a different config,
skipped as finished, failed, or a re-run interrupted): the record always describes the run whose results are there.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict, Optional, Tuple

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

ERROR_FILE = "error.txt"


def record_error(folder, text: str) -> None:
    """Write a run's ``error.txt``, unless the folder holds a finished run (never mark another run as failed) or
    cannot hold a file (the error, about that folder, is said on the command line)."""
    from kvstudy.running.atomic import write_text_atomic
    from kvstudy.running.outputs import is_complete

    if not is_complete(folder):
        try:
            write_text_atomic(Path(folder) / ERROR_FILE, text)
        except OSError:
            pass


def internal_error_text(exc: BaseException) -> str:
    """``error.txt`` of an exception that is no user error: its repr and traceback."""
    import traceback

    return f"internal error: {exc!r}\n{''.join(traceback.format_exception(exc))}"


def run_recording_errors(cfg: DictConfig, folder, record: bool = True) -> dict:
    """``api.run`` for one run (``python -m kvstudy``, and both ``-m`` paths): a user error is recorded in the
    run's ``error.txt`` (with ``record``) and raised again; a run that succeeds clears one an earlier attempt left.
    A run that leaves the folder's results as they were gets Hydra's record of them back (module docstring)."""
    from kvstudy import api
    from kvstudy.errors import KvStudyError
    from kvstudy.running.folder_lock import FolderBusy

    error_file = Path(folder) / ERROR_FILE
    before = _stamp(folder)
    try:
        summary = api.run(cfg, folder)
    except KvStudyError as exc:
        if record and not isinstance(exc, FolderBusy):  # a folder another process writes is not this run's to mark
            record_error(folder, f"{exc}\n")
        raise
    finally:  # the results there unchanged: Hydra's record of them comes back (module docstring)
        _restore_hydra_record(folder, replaced=_stamp(folder) != before)
    if error_file.exists():  # an earlier attempt of this run failed; this one did not
        error_file.unlink()
    return summary


#: Hydra's record (``.hydra/``) of a run folder as it was before Hydra rewrote it for this run, by the folder's
#: absolute path: (the record folder, {file: bytes}); filled by ``FailedRuns.on_run_start``
_KEPT_RECORDS: Dict[str, Tuple[Path, Dict[str, bytes]]] = {}


def _stamp(folder) -> Optional[tuple]:
    """Which summary.json the folder holds (every run replaces it by a rename): None if it holds none."""
    try:
        st = os.stat(Path(folder) / "summary.json")
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _keep_hydra_record(folder, subdir) -> None:
    record = Path(folder) / str(subdir)
    if not record.is_dir():
        return
    try:
        files = {p.relative_to(record).as_posix(): p.read_bytes() for p in sorted(record.rglob("*")) if p.is_file()}
    except OSError:  # a record kvstudy cannot read is one it cannot restore either
        return
    _KEPT_RECORDS[os.path.abspath(folder)] = (record, files)


def _restore_hydra_record(folder, replaced: bool) -> None:
    """Put back the record kept before Hydra rewrote it, unless this run replaced the folder's results."""
    from kvstudy.running.atomic import write_atomic

    kept = _KEPT_RECORDS.pop(os.path.abspath(folder), None)
    if kept is None or replaced:
        return
    record, files = kept
    try:
        for path in sorted(record.rglob("*"), reverse=True):  # what Hydra added that was not there before
            if path.is_file() and path.relative_to(record).as_posix() not in files:
                path.unlink()
        for name, data in files.items():
            write_atomic(record / name, lambda tmp, data=data: Path(tmp).write_bytes(data))
    except OSError as exc:
        print(f"warning: {record}: Hydra's record of the run there could not be put back ({exc})", file=sys.stderr)


def _resolved(config: DictConfig, key: str) -> Optional[str]:
    """``key`` of Hydra's config resolved (its ``${now:...}`` is cached in ``config``, so Hydra gets the same), or
    None where it cannot be resolved here (a sweep folder naming a swept key, a ``${hydra:...}`` resolver): Hydra
    then makes the folder unchecked, as before."""
    from omegaconf import OmegaConf

    try:
        value = OmegaConf.select(config, key)
    except Exception:
        return None
    return None if value is None else str(value)


def _check_folder(config: DictConfig, key: str) -> Optional[str]:
    """``prepare_dir`` of Hydra's ``key`` folder before Hydra makes it: a mistake ends the command in one line."""
    from kvstudy.errors import KvStudyError, report
    from kvstudy.running.paths import prepare_dir

    folder = _resolved(config, key)
    if folder is None:
        return None
    try:
        prepare_dir(folder, key, create=False)
    except KvStudyError as exc:
        sys.exit(report(exc))
    return folder


def _lock(folder: str) -> None:
    """The run folder's lock for the whole command, or one ``error:`` line naming the holder and status 2."""
    from kvstudy.errors import KvStudyError, report
    from kvstudy.running import folder_lock

    try:
        folder_lock.acquire(folder, "wait for it to finish, or choose another run folder (hydra.run.dir)")
    except KvStudyError as exc:
        sys.exit(report(exc))


class FailedRuns(Callback):
    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        """Before Hydra makes the run folder and writes its record there (module docstring)."""
        folder = _check_folder(config, "hydra.run.dir")
        if folder is not None:  # held before Hydra writes its record there: a second command is refused before it
            _lock(folder)       # touches the folder (kvstudy/running/folder_lock.py)
        subdir = _resolved(config, "hydra.output_subdir")
        if folder is not None and subdir is not None:
            _keep_hydra_record(folder, subdir)

    def on_run_end(self, config: DictConfig, **kwargs) -> None:
        from kvstudy.running import folder_lock

        folder = _resolved(config, "hydra.run.dir")
        if folder is not None:
            folder_lock.release(folder)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        """Before Hydra's sweeper makes the sweep folder."""
        _check_folder(config, "hydra.sweep.dir")

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
