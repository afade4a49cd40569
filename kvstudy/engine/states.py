"""What the one loop (kvstudy/engine/loop.py) shares with the code around it: the result of a run, the status message
of an interrupted run, and (from kvstudy/policies/request_states.py, where policies read them) the request states and
the error a policy's bad decision raises."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pandas as pd

from kvstudy.policies.request_states import (DONE, ELSEWHERE, FUTURE, IN_FLIGHT, REJECTED, RUNNING,  # noqa: F401
                                             SWAPPED, WAITING, PolicyError)


def interrupted_message(iterations: int) -> str:
    """The status message of a run stopped by Ctrl-C or SIGTERM."""
    return (f"interrupted after {iterations} iterations (Ctrl-C or SIGTERM); requests finished so far are kept, "
            f"the rest are reported as they stood; the folder is re-run on resume")


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
    #: a cluster replica's records that hold only some requests' rows (kvstudy/engine/records.py ``own_rows``): the
    #: positions, in request_id order, of the rows its ``requests`` holds; None: one row per request
    rows: Optional[np.ndarray] = None
