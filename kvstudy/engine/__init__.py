"""The engine: kvstudy's one iteration loop and everything it owns (docs/architecture.md is the reading guide).

The engine owns time and KV accounting; a policy only decides. Modules:

* ``loop.py``: :class:`StepEngine`, the loop;
* ``paper_setting.py``: :func:`Engine`, the loop on the MC-SF paper's memory (its conventions in the docstring);
* ``decode_clock.py``: the requests decoding every iteration, counted in O(1);
* ``records.py``: the run's tables (requests, iterations) in the memory model's convention;
* ``events.py``: ``record.events=true``'s event and batch tables;
* ``states.py``: request states, the engine's result and its errors.
"""
from kvstudy.engine.loop import StepEngine  # noqa: F401
from kvstudy.engine.paper_setting import Engine  # noqa: F401
from kvstudy.engine.states import (DONE, FUTURE, REJECTED, RUNNING, SWAPPED, WAITING, EngineResult,  # noqa: F401
                                   PolicyError, interrupted_message)
