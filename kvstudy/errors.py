"""The one error type a user sees: its message names the file, field or value and what is allowed.

The command line prints ``error: <message>`` on one line and exits with status 2 instead of a traceback.
"""
import functools
import sys


class KvStudyError(Exception):
    """Base class for every user-facing error."""


class ConfigError(KvStudyError):
    """A config value or combination that kvstudy cannot run."""


class DataError(KvStudyError):
    """A workload, trace or profile file that is malformed."""


class OutOfRangeError(KvStudyError):
    """A latency query outside the range the predictor was trained on."""


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

    return wrapper
