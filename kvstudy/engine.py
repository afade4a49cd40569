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
  0 under beta-clearing) and its true ``kv_tokens_in_use`` (> capacity). ``stall_limit`` consecutive clearing events without a completed request end the run
  with status ``no_progress`` (the paper's "infinite processing loops" of a too-small alpha).
* A request whose s + o exceeds capacity can never be served: it is marked ``rejected`` up front.
  If the policy admits nothing while nothing runs and no arrival is left, the run ends ``stalled``.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import List

import numpy as np
import pandas as pd

from kvstudy.errors import KvStudyError
from kvstudy.policies.base import Policy, SchedulerView
from kvstudy.workloads.requests import Requests

FUTURE, WAITING, RUNNING, DONE, REJECTED = 0, 1, 2, 3, 4


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


class Engine:
    def __init__(self, requests: Requests, predicted: np.ndarray, policy: Policy, latency, capacity: int,
                 stall_limit: int = 100, max_iterations: int = 50_000_000, progress: bool = False,
                 overflow_cost: str = "batch") -> None:
        if overflow_cost not in ("batch", "free"):
            raise KvStudyError(f"engine.overflow_cost={overflow_cost!r}: allowed batch, free")
        self.overflow_cost = overflow_cost
        if capacity <= 0:
            raise KvStudyError(f"memory.capacity_tokens={capacity}: must be a positive number of tokens")
        self.r = requests
        self.pred = np.asarray(predicted, dtype=np.int64)
        self.policy = policy
        self.latency = latency
        self.capacity = int(capacity)
        self.stall_limit = stall_limit
        self.max_iterations = max_iterations
        self.progress = progress

    def _view(self, rnd, t, waiting: List[int], running: np.ndarray) -> SchedulerView:
        w = np.fromiter(waiting, dtype=np.int64, count=len(waiting))
        r = self.r
        return SchedulerView(
            round=rnd, time=t, capacity=self.capacity,
            waiting_ids=r.request_id[w], waiting_prompt=r.prompt_tokens[w], waiting_predicted=self.pred[w],
            waiting_arrival=r.arrival_time[w], running_ids=r.request_id[running],
            running_prompt=r.prompt_tokens[running], running_generated=self.gen[running],
            running_predicted=self.pred[running])

    @staticmethod
    def _positions(chosen, size: int, what: str, policy: str) -> np.ndarray:
        chosen = np.asarray(chosen, dtype=np.int64).ravel()
        if len(chosen) and (chosen.min() < 0 or chosen.max() >= size):
            raise PolicyError(f"policy '{policy}' returned {what} position outside 0..{size - 1}")
        if len(np.unique(chosen)) != len(chosen):
            raise PolicyError(f"policy '{policy}' returned a {what} position twice")
        return chosen

    def run(self) -> EngineResult:
        r, n, M = self.r, len(self.r), self.capacity
        s, o, a = r.prompt_tokens, r.output_tokens, r.arrival_time
        self.gen = np.zeros(n, dtype=np.int64)
        state = np.full(n, FUTURE, dtype=np.int8)
        state[s + o > M] = REJECTED
        first_sched = np.full(n, np.nan)
        first_token = np.full(n, np.nan)
        completion = np.full(n, np.nan)
        last_token = np.full(n, np.nan)
        tbt_sum = np.zeros(n)
        tbt_max = np.zeros(n)
        preemptions = np.zeros(n, dtype=np.int64)
        restarts = np.zeros(n, dtype=np.int64)
        it_start, it_dur, it_batch, it_prefill, it_decode, it_kv, it_cleared = [], [], [], [], [], [], []
        at_start = bool(getattr(self.latency, "stamps_at_start", False))
        name = getattr(self.policy, "name", type(self.policy).__name__)
        waiting: List[int] = []
        running = np.empty(0, dtype=np.int64)
        t, rnd, nxt, clearing, since_completion = 0.0, 0, 0, 0, 0
        status, message = "completed", ""
        done = int((state == REJECTED).sum())
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=n, desc=f"{name}", unit="req", leave=False)
        while True:
            while nxt < n and a[nxt] <= t:
                if state[nxt] == FUTURE:
                    state[nxt] = WAITING
                    waiting.append(nxt)
                nxt += 1
            if not waiting and not len(running):
                if nxt >= n:
                    break
                t = float(math.ceil(a[nxt])) if at_start else float(a[nxt])
                continue
            if rnd >= self.max_iterations:
                status, message = "max_iterations", f"stopped after {rnd} iterations (engine.max_iterations)"
                break
            need = int((s[running] + self.gen[running] + 1).sum())
            if need > M:
                view = self._view(rnd, t, waiting, running)
                evict = self._positions(self.policy.on_overflow(view), len(running), "eviction", name)
                victims = running[evict]
                dt = 0.0
                if self.overflow_cost == "batch":
                    dt = float(self.latency.iteration_seconds([], len(running),
                                                              int((s[running] + self.gen[running]).sum())))
                it_start.append(t)
                it_dur.append(dt)
                it_batch.append(len(running))
                it_prefill.append(0)
                it_decode.append(0)
                it_kv.append(need)
                it_cleared.append(len(victims))
                t += dt
                rnd += 1
                state[victims] = WAITING
                self.gen[victims] = 0
                preemptions[victims] += 1
                restarts[victims] += 1
                running = np.delete(running, evict)
                waiting = list(heapq.merge(waiting, sorted(victims.tolist())))
                clearing += 1
                since_completion += 1
                if since_completion >= self.stall_limit:
                    status = "no_progress"
                    message = (f"{since_completion} clearing events in a row without a completed request "
                               f"(engine.stall_limit={self.stall_limit}); the policy keeps overflowing memory")
                    break
                continue
            view = self._view(rnd, t, waiting, running)
            chosen = self._positions(self.policy.schedule(view), len(waiting), "admission", name)
            admitted = np.fromiter((waiting[p] for p in chosen), dtype=np.int64, count=len(chosen))
            if len(admitted):
                # No capacity check here: under constraint (3) an admission round is not charged; a decision
                # that overflows later is caught by the overflow check at the start of that round.
                drop = set(chosen.tolist())
                waiting = [w for k, w in enumerate(waiting) if k not in drop]
            elif not len(running):
                if nxt < n:
                    t = float(math.ceil(a[nxt])) if at_start else max(t, float(a[nxt]))
                    continue
                status = "stalled"
                first = int(r.request_id[waiting[0]])
                message = (f"policy '{name}' admits none of {len(waiting)} waiting request(s) on an idle engine "
                           f"(first: request {first}, prompt {int(s[waiting[0]])}, predicted output "
                           f"{int(self.pred[waiting[0]])}, capacity {M})")
                break
            chunks = [(int(x), 0) for x in s[admitted]]
            ctx_sum = int((s[running] + self.gen[running]).sum())
            dt = float(self.latency.iteration_seconds(chunks, len(running), ctx_sum))
            stamp = t if at_start else t + dt
            it_start.append(t)
            it_dur.append(dt)
            it_batch.append(len(running) + len(admitted))
            it_prefill.append(int(s[admitted].sum()))
            it_decode.append(len(running))
            it_kv.append(need)
            it_cleared.append(0)
            if len(running):
                self.gen[running] += 1
                gap = stamp - last_token[running]
                tbt_sum[running] += gap
                tbt_max[running] = np.maximum(tbt_max[running], gap)
                last_token[running] = stamp
                finished = self.gen[running] >= o[running]
                if finished.any():
                    ended = running[finished]
                    completion[ended] = stamp
                    state[ended] = DONE
                    running = running[~finished]
                    done += len(ended)
                    since_completion = 0
                    if bar is not None:
                        bar.update(len(ended))
            if len(admitted):
                state[admitted] = RUNNING
                first_sched[admitted] = np.where(np.isnan(first_sched[admitted]), t, first_sched[admitted])
                first_token[admitted] = np.where(np.isnan(first_token[admitted]), stamp, first_token[admitted])
                last_token[admitted] = stamp
                running = np.concatenate((running, admitted))
            t += dt
            rnd += 1
        if bar is not None:
            bar.close()
        if status == "completed" and (state == REJECTED).any():
            message = f"{int((state == REJECTED).sum())} request(s) rejected: prompt + output exceeds capacity {M}"
        states = np.array(["future", "waiting", "running", "done", "rejected"])[state]
        decodes = np.maximum(self.gen, 0)
        requests = pd.DataFrame({
            "request_id": r.request_id, "arrival_time": a, "prompt_tokens": s, "output_tokens": o,
            "predicted_output_tokens": self.pred, "state": states, "first_scheduled_time": first_sched,
            "first_token_time": first_token, "completion_time": completion,
            "ttft": first_token - a, "e2e_latency": completion - a,
            "mean_tbt": np.where(decodes > 0, tbt_sum / np.maximum(decodes, 1), np.nan),
            "max_tbt": np.where(decodes > 0, tbt_max, np.nan),
            "preemptions": preemptions, "restarts": restarts,
        }).sort_values("request_id", kind="stable").reset_index(drop=True)
        iterations = pd.DataFrame({
            "start": np.array(it_start, dtype=float), "duration": np.array(it_dur, dtype=float),
            "batch_size": np.array(it_batch, dtype=np.int64), "prefill_tokens": np.array(it_prefill, dtype=np.int64),
            "decode_tokens": np.array(it_decode, dtype=np.int64), "kv_tokens_in_use": np.array(it_kv, dtype=np.int64),
            "capacity": M, "overflow": np.array(it_kv, dtype=np.int64) > M, "cleared": np.array(it_cleared, dtype=np.int64)})
        return EngineResult(requests, iterations, status, message, clearing, M)
