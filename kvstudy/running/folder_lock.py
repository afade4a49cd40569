"""One writer per run folder (issue 54): two commands writing one run folder at once had both reported ``completed``,
one's tables left under the other's ``.hydra/config.yaml``.

A run holds ``<run folder>/.kvstudy.lock`` from before it reads the folder (whether a finished run is there) until
its files are written: ``python -m kvstudy`` takes it before Hydra writes its record there (``FailedRuns.on_run_start``,
kvstudy/running/sweep_callback.py) and ``api.run`` takes it too (every launcher's runs, the API's), re-entrantly
in one process. A second writer is refused at once: ``FolderBusy``, one line naming the folder and the process that
holds it, and nothing of the folder touched (no ``error.txt``, its record put back).

The lock is ``fcntl.flock`` on the lock file (advisory, the same as the predictor cache's build lock), which the
kernel drops when its holder exits however it exits: a lock file left by a process that died (``kill -9``, a node
lost) is taken over by the next run; the process id written in it is only for the message. A holder removes the file
when it lets go; a taker checks that the file it locked is still the one at that path (else it was removed in
between and it tries again). A folder that cannot hold the file (read-only: a finished run resumed from a read-only
copy) is run unlocked, as such a run writes nothing; a file system without ``flock`` likewise.
"""
from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import os
from pathlib import Path
from typing import Dict, List

from kvstudy.errors import ConfigError

LOCK_NAME = ".kvstudy.lock"
#: what ``FolderBusy`` says (the sweep launcher counts the runs refused so by it)
BUSY_TEXT = "is writing this run folder now"


class FolderBusy(ConfigError):
    """Another process is writing this run folder."""


#: folders this process holds, by absolute path: [open lock file, times taken, whether the lock made the folder]
_HELD: Dict[str, List] = {}


def _holder(path: Path) -> str:
    try:
        pid = path.read_text().strip()
    except OSError:
        pid = ""
    return f"process {pid}" if pid.isdigit() else "another process"


def acquire(folder, fix: str = "wait for it to finish, or choose another run folder (hydra.run.dir)") -> bool:
    """Take ``folder``'s lock (made if missing), or raise ``FolderBusy``; True if taken (False: run unlocked, module
    docstring). Re-entrant within a process: ``release`` as many times."""
    key = os.path.abspath(folder)
    if key in _HELD:
        _HELD[key][1] += 1
        return True
    path = Path(key) / LOCK_NAME
    made = not os.path.exists(key)  # made for the lock: removed again if the run leaves it empty
    for _ in range(100):
        try:
            Path(key).mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:  # read-only, or a file on the way (said by the folder's own check): no lock to take
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise FolderBusy(f"{key}: {_holder(path)} {BUSY_TEXT} (it holds {path}); "
                                 f"{fix}") from None
            return False  # no flock on this file system
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except OSError:
            same = False
        if not same:  # its holder removed it between our open and our lock: try the new one
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        _HELD[key] = [fd, 1, made]
        return True
    return False


def release(folder) -> None:
    """Let go of ``folder``'s lock once (the last release removes the file and closes it)."""
    key = os.path.abspath(folder)
    held = _HELD.get(key)
    if held is None:
        return
    held[1] -= 1
    if held[1] > 0:
        return
    del _HELD[key]
    with contextlib.suppress(OSError):
        os.unlink(Path(key) / LOCK_NAME)  # removed while still locked: a taker that opened it sees it gone, retries
    os.close(held[0])
    if held[2]:
        with contextlib.suppress(OSError):
            os.rmdir(key)  # only if empty: a run that failed before writing leaves no folder, as before the lock


@contextlib.contextmanager
def locked(folder, fix: str = "wait for it to finish, or choose another run folder (hydra.run.dir)"):
    """``acquire`` for the duration of the block (``FolderBusy`` if another process holds it)."""
    taken = acquire(folder, fix)
    try:
        yield
    finally:
        if taken:
            release(folder)



@atexit.register
def _release_all() -> None:
    """At exit (``sys.exit`` from a command skips Hydra's ``on_run_end``): every lock let go and its file removed."""
    for key in list(_HELD):
        _HELD[key][1] = 1
        release(key)
