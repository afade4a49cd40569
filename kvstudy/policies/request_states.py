"""What a policy shares with the engine besides ``Decision`` (kvstudy/policies/step.py): the request states its view
shows (``view.state``; requests.parquet's ``state`` names them) and the error a decision the engine cannot carry out
raises. Here, not in kvstudy/engine/, so that a policy imports nothing of the engine (whose package imports the loop,
which imports the admission adapter: a cycle; tests/test_architecture.py)."""
from __future__ import annotations

from kvstudy.errors import KvStudyError

#: a request's state: not arrived, waiting, running, done, rejected, swapped out
FUTURE, WAITING, RUNNING, DONE, REJECTED, SWAPPED = 0, 1, 2, 3, 4, 5
#: in a cluster (kvstudy/cluster/driver.py), a replica's mark on a request routed to another replica: it never
#: arrives there (the merged requests.parquet takes each request's row from its own replica)
ELSEWHERE = 6
#: under pipeline parallelism (kvstudy/engine/pipeline.py), a running request in a batch still in flight: off the
#: view's running list until the batch's last stage ends, so no decision may name it
IN_FLIGHT = 7


class PolicyError(KvStudyError):
    """A policy returned a decision the engine cannot carry out."""
