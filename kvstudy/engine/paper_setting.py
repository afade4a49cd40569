"""The MC-SF paper's setting on the one loop: ``Engine(requests, predicted, policy, latency, capacity)`` is
:class:`~kvstudy.engine.loop.StepEngine` on :class:`~kvstudy.memory.paper.PaperMemory` with an admission-only
policy (kvstudy/policies/admission.py adapts it), the loop the MC-SF studies, the optimum study and the tests call
by this name. Before issue 34 this module held a second loop of its own; its results are unchanged (docs/engine.md).

Conventions of the paper's memory (MC-SF paper Sec. 2 and IP constraint (3)):

* A request with prompt s and output o is *admitted* in one iteration (its prompt is processed; this
  produces the first output token) and then *decodes* for o iterations. In its j-th decode iteration
  it holds s + j KV tokens; after the last one its memory is freed. As in constraint (3), a prompt's
  own admission iteration is not charged to the KV budget (it is charged s + 1 from the next one);
  ``iterations.kv_tokens_in_use`` is sum(s + j) over decoding requests and never exceeds capacity
  unless an overflow is recorded.
* Iteration time comes from the latency model for that exact batch: prefill chunks (s, 0) for the
  admitted requests and one decode per running request, whose cached context is s + j - 1.
* Time stamps: a token is stamped with the end of the iteration that produced it; under the ``unit``
  model (``stamps_at_start``) with the round index, the paper's convention, so a request arriving in
  round a can be admitted in round a, and admitted in round p it completes at p + o (eq. (1)).
  ``first_scheduled_time`` is the start of the admission iteration, ``first_token_time`` the stamp of
  that iteration, ``completion_time`` the stamp of its last decode. When nothing is running or
  waiting the clock jumps to the next arrival (rounded up to a whole round under ``unit``).
* Overflow: if the running requests' true need for this round exceeds capacity (possible only with
  protection heuristics or under-predictions), the policy's ``on_overflow`` names requests to evict;
  they return to the queue unprocessed (KV and progress lost: ``preemptions`` and ``restarts`` + 1).
  Cost in time (``overflow_cost``): ``batch`` (default) charges each clearing event the latency of the
  running batch that overflowed, during which no token is produced (the attempt is wasted); so a
  beta-clearing policy that evicts too few requests pays again next round, which is the "significant
  time" the paper attributes to small beta (App. C). ``free`` charges nothing beyond the recomputation.
  An overflow is recorded as an iteration with ``overflow`` true, ``cleared`` = requests evicted (possibly
  0 under beta-clearing) and its true ``kv_tokens_in_use`` (> capacity). ``authors_code`` charges what the MC-SF
  authors' scripts charge (``alpha-greedy.py``, ``alpha-beta.py``): nothing when the eviction brings the KV in use
  within capacity, else one idle second before the policy is asked again, arrivals up to its end included.
  ``stall_limit`` consecutive clearing events without a completed request end the run with status
  ``no_progress`` (the paper's "infinite processing loops" of a too-small alpha).
* ``raise_prediction_on_eviction`` (default false, the paper's literal rule): when true, an evicted request's
  prediction rises to at least one more than the tokens it had produced (it was still running, so its length
  is larger), so eq. (5) no longer drops it at the same point after re-admission; S3 (Jin et al. 2023) applies
  a harsher version of the same idea, doubling a request's predicted demand each time it overruns.
* ``arrivals`` (``paper``, default): requests that have arrived by the clock join the queue before each decision.
  ``authors_code`` follows the event order of the authors' scripts: an arrival at the very instant a batch ends
  joins after the next batch is formed, and an idle engine forms a batch right after the first arrival that
  wakes it (later arrivals at the same instant wait for that batch). The two differ only on ties in time.
* ``max_batch`` (default none): at most that many jobs (decodes and prompts) per iteration, the batch cap ``B`` of
  the authors' alpha scripts. Decodes come first and the policy's admissions are cut, in its order, to the slots
  they leave; so no more than ``max_batch`` requests ever run and every running request still decodes each round.
* A request whose s + o exceeds capacity can never be served: it is marked ``rejected`` up front.
  If the policy admits nothing while nothing runs and no arrival is left, the run ends ``stalled``.
"""
from __future__ import annotations

import numpy as np

from kvstudy.memory.paper import PaperMemory
from kvstudy.engine.states import (DONE, FUTURE, REJECTED, RUNNING, SWAPPED, WAITING, EngineResult,  # noqa: F401
                            PolicyError, interrupted_message)
from kvstudy.engine.assembly import build_engine
from kvstudy.engine.loop import StepEngine


class _NoSwap:
    """The paper's memory moves nothing to the host: no swap model is needed."""
    overlap = False

    def bind(self, *args) -> None:
        pass

    def seconds(self, blocks: int) -> float:
        return 0.0

    def describe(self) -> dict:
        return {"name": "none"}


def Engine(requests, predicted: np.ndarray, policy, latency, capacity: int, stall_limit: int = 100,
           max_iterations: int = 50_000_000, progress: bool = False, overflow_cost: str = "batch",
           raise_prediction_on_eviction: bool = False, arrivals: str = "paper", max_batch=None,
           arch=None, hardware=None) -> StepEngine:
    """The one loop on the paper's memory of ``capacity`` tokens, the admission policy adapted (the policy is reset
    by the caller)."""
    return build_engine(requests, predicted, policy, latency, PaperMemory(capacity), _NoSwap(), arch, hardware,
                        stall_limit=stall_limit, max_iterations=max_iterations, progress=progress,
                        overflow_cost=overflow_cost, raise_prediction_on_eviction=raise_prediction_on_eviction,
                        arrivals=arrivals, max_batch=max_batch)
