"""What the one loop (kvstudy/engine/loop.py) shares with the code around it: request states, the result of a run,
the error a policy's bad decision raises, the status message of an interrupted run."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import pandas as pd

from kvstudy.errors import KvStudyError

#: a request's state (requests.parquet ``state`` names them): not arrived, waiting, running, done, rejected, swapped out
FUTURE, WAITING, RUNNING, DONE, REJECTED, SWAPPED = 0, 1, 2, 3, 4, 5
#: in a cluster (kvstudy/cluster/driver.py), a replica's mark on a request routed to another replica: it never
#: arrives there (the merged requests.parquet takes each request's row from its own replica)
ELSEWHERE = 6


def interrupted_message(iterations: int) -> str:
    """The status message of a run stopped by Ctrl-C or SIGTERM."""
    return (f"interrupted after {iterations} iterations (Ctrl-C or SIGTERM); requests finished so far are kept, "
            f"the rest are reported as they stood; the folder is re-run on resume")


class PolicyError(KvStudyError):
    """A policy returned a decision the engine cannot carry out."""


@dataclass
class EngineResult:
    requests: pd.DataFrame
    iterations: pd.DataFrame
    status: str
    message: str
    clearing_events: int
    capacity: int
    extra: dict = field(default_factory=dict)
    events: Optional[pd.DataFrame] = None   # record.events=true: kvstudy/engine/events.py
    batches: Optional[pd.DataFrame] = None
