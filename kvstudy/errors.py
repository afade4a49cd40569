"""The one error type a user sees: its message names the file, field or value and what is allowed.

The command line prints ``error: <message>`` on one line and exits with status 2 instead of a traceback.
"""
import contextlib
import errno
import functools
import sys
from typing import Optional


class KvStudyError(Exception):
    """Base class for every user-facing error."""


class ConfigError(KvStudyError):
    """A config value or combination that kvstudy cannot run."""


class DataError(KvStudyError):
    """A workload, trace or profile file that is malformed."""


class OutOfRangeError(KvStudyError):
    """A latency query outside the range the predictor was trained on."""


class ResourceError(KvStudyError):
    """The file system refused a write kvstudy had to make: the disk is full, a quota is reached, a name is too long
    for it, or it is read-only (issue 54). Its message names the path and what to do."""


#: the errors of ``OSError`` that are the machine's, not kvstudy's: said in one line (``resource_error``)
_RESOURCE = {errno.ENOSPC: ("no space left on the device", "free space there"),
             errno.EDQUOT: ("disk quota exceeded", "free space within the quota"),
             errno.ENAMETOOLONG: ("a name too long for the file system (at most 255 bytes a name)",
                                  "choose a shorter name"),
             errno.EROFS: ("a read-only file system", "choose a folder on a writable file system")}


def resource_error(exc: BaseException, where=None, fix: str = "") -> Optional[ResourceError]:
    """``exc`` as one line if it is a full disk, a quota, a name too long or a read-only file system (else None):
    ``<path>: <what> while <phase>; <what to do>``. ``where``: the path when the exception names none."""
    if not isinstance(exc, OSError) or exc.errno not in _RESOURCE:
        return None
    what, todo = _RESOURCE[exc.errno]
    path = exc.filename or where or "(a file kvstudy writes)"
    doing = f" while {current_phase(exc)[0]}" if current_phase(exc) else ""
    return ResourceError(f"{path}: {what}{doing}; {fix or todo}, then run again")


@contextlib.contextmanager
def file_system(where=None, fix: str = ""):
    """Inside: a full disk, a quota, a name too long or a read-only file system becomes a ``ResourceError`` of one
    line naming the path (``resource_error``); any other error passes unchanged."""
    try:
        yield
    except OSError as exc:
        err = resource_error(exc, where, fix)
        if err is None:
            raise
        raise err from None


#: the long phases under way, innermost last: (what is done, what is left behind if it is stopped)
_PHASES: list = []


@contextlib.contextmanager
def phase(what: str, leaves: str):
    """A long phase (building profiles, training a predictor, a run, a sweep) under way: Ctrl-C in it is said as
    ``interrupted`` naming it (``interrupted``), and a full disk in it names it (``resource_error``)."""
    _PHASES.append((what, leaves))
    try:
        yield
    except BaseException as exc:
        if getattr(exc, "kvstudy_phase", None) is None:  # the innermost phase the exception left is the one to name
            try:
                exc.kvstudy_phase = (what, leaves)
            except AttributeError:
                pass
        raise
    finally:
        _PHASES.pop()


def current_phase(exc: Optional[BaseException] = None):
    """(what, leaves) of the phase ``exc`` came out of, else of the phase under way; None outside any."""
    return getattr(exc, "kvstudy_phase", None) or (_PHASES[-1] if _PHASES else None)


def interrupted(exc: Optional[BaseException] = None) -> int:
    """Ctrl-C (or SIGTERM taken as it) outside a run's engine, which says ``status interrupted`` itself: one line
    naming the phase it stopped and what it left behind, and status 130, as a run's Ctrl-C."""
    what, leaves = current_phase(exc) or ("preparing the command", "nothing was written")
    print(f"error: interrupted (Ctrl-C) while {what}; {leaves}", file=sys.stderr)
    return 130


def report(exc: KvStudyError) -> int:
    """Print ``error: <message>`` on stderr; the exit status for a user error."""
    print(f"error: {exc}", file=sys.stderr)
    return 2


def cli_entry(main):
    """Wrap a command's ``main(argv) -> int`` so a ``KvStudyError`` ends in one clear line and status 2."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except KvStudyError as exc:
            return report(exc)
        except KeyboardInterrupt as exc:  # outside a run's engine (building profiles, training): one line, 130
            return interrupted(exc)
        except OSError as exc:  # a full disk, a name too long: one line naming the path (``resource_error``)
            err = resource_error(exc)
            if err is None:
                raise
            return report(err)

    return wrapper
