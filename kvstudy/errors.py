"""The one error type a user sees: its message names the file, field or value and what is allowed.

The command line prints ``error: <message>`` on one line and exits with status 2 instead of a traceback.
"""


class KvStudyError(Exception):
    """Base class for every user-facing error."""


class ConfigError(KvStudyError):
    """A config value or combination that kvstudy cannot run."""


class DataError(KvStudyError):
    """A workload, trace or profile file that is malformed."""


class OutOfRangeError(KvStudyError):
    """A latency query outside the range the predictor was trained on."""
