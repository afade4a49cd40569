"""kvstudy's batch-level iteration loop. The engine, not the policy, owns time and KV accounting.

Conventions (the one place they are written down; MC-SF paper Sec. 2 and IP constraint (3)):

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

import bisect
import heapq
import math
from itertools import islice
from dataclasses import dataclass, field
from typing import List

import numpy as np
import pandas as pd

from kvstudy.errors import KvStudyError
from kvstudy.policies.base import Policy, SchedulerView
from kvstudy.workloads.requests import Requests

FUTURE, WAITING, RUNNING, DONE, REJECTED = 0, 1, 2, 3, 4
#: Only the preemptive loop (kvstudy/step_engine.py) swaps requests out; the code lives here with the others.
SWAPPED = 5
#: One row of iterations.parquet per iteration, recorded as a tuple in this order.
ITERATION_COLUMNS = ("start", "duration", "batch_size", "prefill_tokens", "decode_tokens", "kv_tokens_in_use",
                     "overflow", "cleared")


def interrupted_message(iterations: int) -> str:
    """The status message of a run stopped by Ctrl-C or SIGTERM (both loops)."""
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


class _LazyView(SchedulerView):
    """A ``SchedulerView`` whose arrays are built from engine state on first read (see SchedulerView)."""

    def __init__(self, engine: "Engine", rnd: int, t: float, waiting: List[int], running: dict, kv: int) -> None:
        self.round, self.time, self.capacity, self.running_kv_tokens = rnd, t, engine.capacity, kv
        self._engine, self._waiting, self._running = engine, waiting, running

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def _arrays(self, idx: np.ndarray, prefix: str) -> dict:
        e, r = self._engine, self._engine.r
        out = {f"{prefix}_ids": r.request_id[idx], f"{prefix}_prompt": r.prompt_tokens[idx],
               f"{prefix}_predicted": e.pred[idx], f"{prefix}_arrival": r.arrival_time[idx]}
        if prefix == "running":
            out["running_generated"] = self.round - e.p_round[idx] - 1
        return out

    def __getattr__(self, name: str):
        if name not in SchedulerView.ARRAYS:
            raise AttributeError(name)
        if name.startswith("waiting"):
            idx = np.fromiter(self._waiting, dtype=np.int64, count=len(self._waiting))
            self.__dict__.update(self._arrays(idx, "waiting"))
        else:
            self.__dict__.update(self._arrays(self._engine._running_array(self._running), "running"))
        return self.__dict__[name]

    def head_prompts(self, k: int) -> np.ndarray:
        prompts = self._engine.s_list
        return np.array([prompts[i] for i in islice(self._waiting, k)], dtype=np.int64)

    def ordered_waiting(self, by: str):
        """See ``SchedulerView.ordered_waiting``; served from the engine's queue without building arrays. The
        waiting list is sorted by request index, which is arrival order with ties by id (checked at start), so
        a request's position is a binary search and eq. (6)'s order is the engine's ``by_predicted`` keys."""
        e = self._engine
        prompts, pred, waiting = e.s_list, e.pred, self._waiting
        if by == "arrival":
            for pos, i in enumerate(waiting):
                yield pos, prompts[i], int(pred[i])
        elif by == "predicted" and e.by_predicted is not None:
            n = len(e.r)
            for key in e.by_predicted:
                i = key % n
                yield bisect.bisect_left(waiting, i), prompts[i], key // n
        else:
            yield from super().ordered_waiting(by)


def _range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo_k..hi_k]) for each k (inclusive ranges, lo <= hi), with a sparse table."""
    table = [values]
    span = 1
    while 2 * span <= len(values):
        prev = table[-1]
        table.append(np.maximum(prev[:-span], prev[span:]))
        span *= 2
    length = hi - lo + 1
    level = np.floor(np.log2(np.maximum(length, 1))).astype(int)
    out = np.empty(len(lo))
    for lv in np.unique(level):
        sel = level == lv
        tab = table[lv]
        out[sel] = np.maximum(tab[lo[sel]], tab[hi[sel] - (1 << lv) + 1])
    return out


class Engine:
    def __init__(self, requests: Requests, predicted: np.ndarray, policy: Policy, latency, capacity: int,
                 stall_limit: int = 100, max_iterations: int = 50_000_000, progress: bool = False,
                 overflow_cost: str = "batch", raise_prediction_on_eviction: bool = False,
                 arrivals: str = "paper", max_batch=None) -> None:
        if not isinstance(raise_prediction_on_eviction, bool):
            raise KvStudyError(f"engine.raise_prediction_on_eviction={raise_prediction_on_eviction!r}: allowed true, "
                               f"false")
        self.raise_on_eviction = raise_prediction_on_eviction
        if overflow_cost not in ("batch", "free", "authors_code"):
            raise KvStudyError(f"engine.overflow_cost={overflow_cost!r}: allowed batch, free, authors_code")
        if arrivals not in ("paper", "authors_code"):
            raise KvStudyError(f"engine.arrivals={arrivals!r}: allowed paper, authors_code")
        self.arrivals = arrivals
        if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1):
            raise KvStudyError(f"engine.max_batch={max_batch!r}: allowed null (no cap) or a whole number >= 1")
        self.max_batch = max_batch
        if capacity <= 0:
            raise KvStudyError(f"memory.capacity_tokens={capacity}: must be a positive number of tokens")
        self.overflow_cost = overflow_cost
        self.r = requests
        self.pred_given = np.asarray(predicted, dtype=np.int64)
        # What policies see; a copy only when evictions may raise it (the given predictions are reported as given).
        self.pred = self.pred_given.copy() if raise_prediction_on_eviction else self.pred_given
        self.policy = policy
        self.latency = latency
        self.capacity = int(capacity)
        self.stall_limit = stall_limit
        self.max_iterations = max_iterations
        self.progress = progress
        self.by_predicted = None  # set in run() for policies that read the queue shortest-predicted first

    @staticmethod
    def _running_array(running: dict) -> np.ndarray:
        return np.fromiter(running, dtype=np.int64, count=len(running))

    @staticmethod
    def _positions(chosen, size: int, what: str, policy: str) -> np.ndarray:
        chosen = np.asarray(chosen, dtype=np.int64).ravel()
        if len(chosen) == 0:
            return chosen
        if chosen.min() < 0 or chosen.max() >= size:
            raise PolicyError(f"policy '{policy}' returned {what} position outside 0..{size - 1}")
        if len(chosen) > 1 and len(set(chosen.tolist())) != len(chosen):
            raise PolicyError(f"policy '{policy}' returned a {what} position twice")
        return chosen

    def run(self) -> EngineResult:
        r, n, M = self.r, len(self.r), self.capacity
        s, o, a = r.prompt_tokens, r.output_tokens, r.arrival_time
        self.s_list = s_list = s.tolist()
        o_list = o.tolist()
        self.p_round = p_round = np.full(n, -1, dtype=np.int64)  # admission round of the current life
        state = np.full(n, FUTURE, dtype=np.int8)
        state[s + o > M] = REJECTED
        first_sched = np.full(n, np.nan)
        first_token = np.full(n, np.nan)
        admit_stamp = np.full(n, np.nan)  # first token of the completing life (for TBT)
        completion = np.full(n, np.nan)
        done_round = np.full(n, -1, dtype=np.int64)
        preemptions = np.zeros(n, dtype=np.int64)
        restarts = np.zeros(n, dtype=np.int64)
        log = []  # one ITERATION_COLUMNS tuple per iteration
        at_start = bool(getattr(self.latency, "stamps_at_start", False))
        name = getattr(self.policy, "name", type(self.policy).__name__)
        iteration_seconds = self.latency.iteration_seconds

        def arrival_clock(i: int) -> float:
            """When the idle engine next has work: request i's arrival (a whole round under ``unit``)."""
            return float(math.ceil(a[i])) if at_start else float(a[i])
        waiting: List[int] = []  # request indices, kept sorted: arrival order
        # eq. (6)'s order of the waiting queue, kept as requests join and leave, for a policy that reads it that
        # way (Policy.waiting_order): keys predicted * n + index, so sorting them sorts by prediction, then arrival
        # and id, which is index order when the requests are sorted by (arrival, id) (true for make_requests)
        ids = r.request_id
        by_pred = None
        if getattr(self.policy, "waiting_order", None) == "predicted" and bool(
                np.all((np.diff(a) > 0) | ((np.diff(a) == 0) & (np.diff(ids) > 0)))):
            by_pred = []
        self.by_predicted = by_pred
        pred = self.pred
        running: dict = {}  # insertion-ordered set of running requests
        finish_at: dict = {}  # round -> requests whose last decode is in that round
        kv = 0  # sum over running of s + generated + 1: the KV they hold this round
        t, rnd, nxt, clearing, since_completion = 0.0, 0, 0, 0, 0
        status, message = "completed", ""
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=n, desc=f"{name}", unit="req", leave=False)
        # authors_code: an arrival at the instant a batch ends joins after that batch is formed (strictly earlier
        # arrivals only), and an idle engine wakes for one arrival (``wake``)
        strict = self.arrivals == "authors_code"
        idled = False  # authors_code: the last step was an idle second, whose end arrivals join at (inclusive)

        def join(i: int) -> None:
            """Request i has arrived: it joins the waiting queue (and eq. (6)'s order, when kept)."""
            state[i] = WAITING
            waiting.append(i)
            if by_pred is not None:
                bisect.insort(by_pred, int(pred[i]) * n + i)

        def wake():
            """The clock an idle engine jumps to (None: nothing left to arrive). Under authors_code the request
            arriving then joins the queue at once, alone."""
            nonlocal nxt
            if not strict:
                return arrival_clock(nxt) if nxt < n else None
            while nxt < n and state[nxt] != FUTURE:  # rejected requests never arrive
                nxt += 1
            if nxt >= n:
                return None
            join(nxt)
            nxt += 1
            return arrival_clock(nxt - 1)

        needs_generated = bool(getattr(self.latency, "needs_generated", False))
        cap = self.max_batch
        s_run = 0  # sum of the running requests' prompts: kv - s_run is the tokens they have produced
        try:
            while True:
                while nxt < n and (a[nxt] < t if strict and not idled else a[nxt] <= t):
                    if state[nxt] == FUTURE:
                        join(nxt)
                    nxt += 1
                idled = False
                if not waiting and not running:
                    woke = wake()
                    if woke is None:
                        break
                    t = woke
                    continue
                if rnd >= self.max_iterations:
                    status, message = "max_iterations", f"stopped after {rnd} iterations (engine.max_iterations)"
                    break
                if kv > M:
                    view = _LazyView(self, rnd, t, waiting, running, kv)
                    run_arr = self._running_array(running)
                    evict = self._positions(self.policy.on_overflow(view), len(run_arr), "eviction", name)
                    victims = run_arr[evict]
                    dt = 0.0
                    if self.overflow_cost == "batch":
                        extra = {"decode_generated_sum": kv - s_run} if needs_generated else {}
                        dt = float(iteration_seconds([], len(run_arr), kv - len(run_arr), **extra))
                    kept = kv - int((s[victims] + rnd - p_round[victims]).sum())
                    if self.overflow_cost == "authors_code" and kept > M:
                        dt = 1.0  # the scripts idle one second before clearing again,
                        idled = True  # taking the arrivals up to and including its end
                    log.append((t, dt, len(run_arr), 0, 0, kv, True, len(victims)))
                    kv = kept
                    s_run -= int(s[victims].sum())
                    for i in victims.tolist():
                        del running[i]
                    state[victims] = WAITING
                    if self.raise_on_eviction and len(victims):
                        # The remedy for Fig. 5's clearing cycles: an evicted request was still running after producing
                        # rnd - p tokens, so its length exceeds that; its prediction rises to at least that + 1.
                        reached = rnd - p_round[victims]
                        self.pred[victims] = np.maximum(self.pred[victims], reached + 1)
                    p_round[victims] = -1
                    preemptions[victims] += 1
                    restarts[victims] += 1
                    # Survivors made no progress in the wasted round: their schedule moves one round later.
                    for i in running:
                        p_round[i] += 1
                        finish_at.setdefault(int(p_round[i]) + o_list[i], []).append(i)
                    if len(victims) <= 8:  # typical (vLLM-like preemption): a binary-search insert each
                        for v in victims.tolist():
                            bisect.insort(waiting, v)
                    else:
                        waiting = list(heapq.merge(waiting, sorted(victims.tolist())))
                    if by_pred is not None:
                        for v in victims.tolist():  # after the remedy above may have raised their predictions
                            bisect.insort(by_pred, int(pred[v]) * n + v)
                    t += dt
                    rnd += 1
                    clearing += 1
                    since_completion += 1
                    if since_completion >= self.stall_limit:
                        status = "no_progress"
                        message = (f"{since_completion} clearing events in a row without a completed request "
                                   f"(engine.stall_limit={self.stall_limit}); the policy keeps overflowing memory")
                        break
                    continue
                if waiting:  # a policy admits only from the queue: with none waiting there is nothing to ask
                    view = _LazyView(self, rnd, t, waiting, running, kv)
                    chosen = self._positions(self.policy.schedule(view), len(waiting), "admission", name)
                    if cap is not None and len(chosen) > cap - len(running):
                        chosen = chosen[: cap - len(running)]  # decodes first, prompts fill the rest
                    admitted = [waiting[k] for k in chosen.tolist()]
                else:
                    admitted = []
                if admitted:
                    # No capacity check here: under constraint (3) an admission round is not charged; a decision
                    # that overflows later is caught by the overflow check at the start of that round.
                    if by_pred is not None:
                        for i in admitted:
                            del by_pred[bisect.bisect_left(by_pred, int(pred[i]) * n + i)]
                    if chosen.max() == len(chosen) - 1:  # a prefix of the queue (FCFS policies)
                        del waiting[: len(chosen)]
                    elif len(chosen) <= 64:  # a few from anywhere (shortest first): C-level deletes, no Python pass
                        for k in sorted(chosen.tolist(), reverse=True):
                            del waiting[k]
                    else:
                        drop = set(chosen.tolist())
                        waiting = [w for k, w in enumerate(waiting) if k not in drop]
                elif not running:
                    woke = wake()  # not arrived yet, so later than t (or at t under authors_code)
                    if woke is not None:
                        t = woke
                        continue
                    status = "stalled"
                    first = int(r.request_id[waiting[0]])
                    message = (f"policy '{name}' admits none of {len(waiting)} waiting request(s) on an idle engine "
                               f"(first: request {first}, prompt {int(s[waiting[0]])}, predicted output "
                               f"{int(self.pred[waiting[0]])}, capacity {M})")
                    break
                num_running = len(running)
                chunks = [(s_list[i], 0) for i in admitted]
                if needs_generated:
                    dt = float(iteration_seconds(chunks, num_running, kv - num_running,
                                                 decode_generated_sum=kv - s_run))
                else:
                    dt = float(iteration_seconds(chunks, num_running, kv - num_running))
                stamp = t if at_start else t + dt
                prefill = sum(c for c, _ in chunks)
                log.append((t, dt, num_running + len(admitted), prefill, num_running, kv, False, 0))
                finished = [i for i in finish_at.pop(rnd, ()) if state[i] == RUNNING and p_round[i] + o_list[i] == rnd]
                freed = 0
                for i in finished:
                    del running[i]
                    freed += s_list[i] + o_list[i]
                    s_run -= s_list[i]
                if finished:
                    for i in finished:  # few per round: element-wise beats building index arrays
                        completion[i] = stamp
                        done_round[i] = rnd
                        state[i] = DONE
                    since_completion = 0
                    if bar is not None:
                        bar.update(len(finished))
                kv += (num_running - len(finished)) - freed  # survivors grow by one token each
                for i in admitted:
                    running[i] = None
                    finish_at.setdefault(rnd + o_list[i], []).append(i)
                if admitted:
                    kv += prefill + len(admitted)
                    s_run += prefill
                    for i in admitted:
                        state[i] = RUNNING
                        p_round[i] = rnd
                        admit_stamp[i] = stamp
                        if first_token[i] != first_token[i]:  # NaN: first life of this request
                            first_sched[i] = t
                            first_token[i] = stamp
                t += dt
                rnd += 1
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM turned into it by api.run: keep what is done
            status, message = "interrupted", interrupted_message(rnd)
        if bar is not None:
            bar.close()
        if status == "completed" and (state == REJECTED).any():
            message = f"{int((state == REJECTED).sum())} request(s) rejected: prompt + output exceeds capacity {M}"
        iterations = pd.DataFrame.from_records(log, columns=ITERATION_COLUMNS).astype(
            {"start": float, "duration": float, "batch_size": np.int64, "prefill_tokens": np.int64,
             "decode_tokens": np.int64, "kv_tokens_in_use": np.int64, "cleared": np.int64, "overflow": bool})
        iterations.insert(6, "capacity", M)
        start, dur, over = (iterations[c].to_numpy() for c in ("start", "duration", "overflow"))
        mean_tbt, max_tbt = self._tbt(state, o, completion, admit_stamp, p_round, done_round, start, dur, over,
                                      at_start)
        states = np.array(["future", "waiting", "running", "done", "rejected"])[state]
        requests = pd.DataFrame({
            "request_id": r.request_id, "arrival_time": a, "prompt_tokens": s, "output_tokens": o,
            "predicted_output_tokens": self.pred_given, "state": states, "first_scheduled_time": first_sched,
            "first_token_time": first_token, "completion_time": completion,
            "ttft": first_token - a, "e2e_latency": completion - a, "mean_tbt": mean_tbt, "max_tbt": max_tbt,
            "preemptions": preemptions, "restarts": restarts,
        }).sort_values("request_id", kind="stable").reset_index(drop=True)
        return EngineResult(requests, iterations, status, message, clearing, M)

    @staticmethod
    def _tbt(state, o, completion, admit_stamp, p_round, done_round, start, dur, over, at_start):
        """Time between tokens over a request's completing life: its tokens are stamped in its admission
        round and each decode round after it (overflow rounds produce no token, so a gap spans them)."""
        n = len(state)
        mean_tbt = np.full(n, np.nan)
        max_tbt = np.full(n, np.nan)
        done = np.flatnonzero(state == DONE)
        if not len(done):
            return mean_tbt, max_tbt
        mean_tbt[done] = (completion[done] - admit_stamp[done]) / o[done]
        stamps = start if at_start else start + dur
        token_rounds = np.flatnonzero(~over)
        gaps = np.zeros(len(stamps))
        gaps[token_rounds[1:]] = np.diff(stamps[token_rounds])
        max_tbt[done] = _range_max(gaps, p_round[done] + 1, done_round[done])
        return mean_tbt, max_tbt
