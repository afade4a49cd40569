"""kvstudy's one iteration loop (issue 34): arrivals, the iteration, its time, token stamps and the run's records,
for every policy on every memory model it can run on. The engine owns time and KV accounting; the policy decides.

Pieces the loop calls (each with one job; docs/architecture.md is the reading guide):

* the run's state (state.py): every request's fields and the queues, one object;
* the memory model (``memory`` group; its interface is kvstudy/memory/base.py): the MC-SF paper's constraint (3) or
  vLLM's paged blocks. It fixes the token convention (``memory.convention``): ``paper``, o decode rounds after the
  prompt's round and an eviction restarts the request; ``vllm``, o tokens with the first from the prefill and a
  recompute keeps them;
* the policy: a step policy (kvstudy/policies/step.py: ``step(view) -> Decision``); an admission-only one
  (``order`` + ``admit``) arrives wrapped in the adapter (kvstudy/policies/admission.py) by assembly.py;
* the decision check (check.py) and the state transitions (transitions.py);
* the latency model: the iteration's seconds for its exact batch; the swap model: seconds of KV copies;
* the decode clock (decode_clock.py): the requests decoding every iteration, counted in O(1);
* the records (records.py): the iteration rows and the tables, in the memory model's convention.

One iteration, in phases (``StepEngine.loop``):

1. **arrivals**: requests that have arrived by the clock join the waiting queue (``arrivals=authors_code``: the MC-SF
   authors' event order on ties, memory=paper only). Idle, the clock jumps to the next arrival.
2. **clear** (a policy with an ``overflow_victims`` hook, i.e. an adapted admission policy): when the running
   requests' need for this iteration exceeds the memory, the policy names victims, the engine evicts them by
   recompute and records a clearing event at ``overflow_cost`` (kvstudy/engine/paper_setting.py: the paper's
   conventions).
3. **decide** and **check**: the policy returns a :class:`~kvstudy.policies.step.Decision`; check.py validates all of it
   before anything changes (on paged memory: blocks after the decision within capacity).
4. **apply**: in the order preempt, swap in, lend, prefill, decode, reserve: a recompute victim drops its KV and goes
   to the front of the waiting queue (vLLM's ``extendleft``), a swap victim's blocks move to host space (or, when that
   is full, it is recomputed instead and ``swap_fallbacks`` counts it).
5. **time**: the latency model's prediction for that exact batch (each prefill chunk with the context before it,
   each decode with its cached context; a recompute is a prefill of prompt + generated tokens) plus the swap model's
   seconds for the blocks moved (or the longer of the two when ``swap.overlap``).
6. **stamp**: tokens are stamped with the iteration's end (with its start under ``latency=unit`` on the paper's
   memory: the round's index). A prefill's last chunk produces a request's next token; a decode produces one.
7. **record**: the iteration's row (records.py), then the requests that produced their last token finish.

The most common iteration (every running request decodes, nothing else happens) runs as one function of the same
phases, a *decode run* (``_decode_run``): of one iteration, or, for a policy that promises its decode-only decision
repeats (``StepPolicy.steady_spare``: vLLM's and Sarathi's steps; issue 47), of the iterations after it too, without
asking the policy, until a request finishes, the next iteration would start at or past the next arrival (in a
cluster, the horizon), or the growing requests would not find their blocks with the promised spare; their seconds
come from the latency model's ``decode_run_seconds`` when it has one (Vidur's tables: one vectorised lookup). No
promise is asked for while events are recorded or the engine checks overflow before each step (an adapted
admission policy).

Rejected up front, each with ``reject_reason``: a request the memory model can never serve (``memory.rejection``);
on paged memory also, when preempted, a request whose recompute (prompt + generated tokens) can_allocate calls
NEVER (vLLM ignores such a prompt). ``stall_limit`` iterations in a row without a token (a chunk that takes a prefill
further than it ever got counts as progress), or clearing events in a row without a completed request, end the run
``no_progress``; a policy that runs nothing on an idle engine with nothing left to arrive ends ``stalled``.
"""
from __future__ import annotations

import math
from heapq import heappop
from time import perf_counter

import numpy as np

from kvstudy.engine import records
from kvstudy.engine.check import check_decision, located
from kvstudy.engine.events import EventLog
from kvstudy.engine.indexed_queue import IndexedQueue
from kvstudy.engine.pipeline import InFlight, Pipeline
from kvstudy.engine.state import RunState
from kvstudy.engine.states import (DONE, FUTURE, IN_FLIGHT, REJECTED, RUNNING, WAITING, EngineResult, PolicyError,
                                   interrupted_message)
from kvstudy.engine.transitions import Transitions
from kvstudy.errors import KvStudyError
from kvstudy.costs.swap_models import SwapModel, kv_bytes_per_gpu
from kvstudy.latency.models import VidurLatency
from kvstudy.policies.admission import Admission
from kvstudy.policies.step import RECOMPUTE, Decision, StepPolicy, StepView
from kvstudy.workloads.requests import Requests

NO_CHUNKS: tuple = ()  # a decode-only iteration's prefill chunks
IDLE = math.inf  # what the loop yields in a cluster when it waits for a request to be routed to it


class StepEngine:
    """The one loop (module docstring). ``memory`` fixes the KV accounting and the token convention
    (kvstudy/memory/base.py). ``arrivals`` and ``overflow_cost=authors_code`` reproduce the MC-SF authors' loop
    (memory=paper only). Build one through assembly.py's ``build_engine``, which checks the settings together and
    wraps an admission-only policy; this constructor only composes."""

    def __init__(self, requests: Requests, predicted: np.ndarray, policy: StepPolicy, latency,
                 memory, swap: SwapModel, arch, hardware, stall_limit: int = 100,
                 max_iterations: int = 50_000_000, progress: bool = False, direction=None,
                 overflow_cost: str = "batch", arrivals: str = "paper", record_events: bool = False) -> None:
        if not callable(getattr(policy, "step", None)):
            raise PolicyError(f"policy '{getattr(policy, 'name', type(policy).__name__)}' is no step policy: build "
                              f"the engine with kvstudy.engine.assembly.build_engine, which adapts an admission policy")
        self.requests, self.policy, self.latency, self.memory, self.swap = requests, policy, latency, memory, swap
        self.predicted = predicted
        self.overflow_cost, self.arrivals = overflow_cost, arrivals
        #: an admission-only policy through the adapter: no vLLM watermark rule, its own queue orders
        self.adapted = isinstance(policy, Admission)
        self.direction = None if direction is None else np.asarray(direction, dtype=np.int8).tolist()
        self.arch, self.hw = arch, hardware
        self.max_model_len = int(arch.max_model_len) if arch is not None else 0  # none: the paper's memory alone
        self.stall_limit, self.max_iterations, self.progress = stall_limit, max_iterations, progress
        self.record_events = bool(record_events)  # record.events: kvstudy/engine/events.py (None when off)
        self.events = None
        self.state: RunState = None  # built by each run (``loop``)
        #: the paper's convention: o decode rounds after the prompt's round (o + 1 tokens), an eviction restarts the
        #: request; under latency=unit a round's tokens are stamped with its start (the round's index)
        self.paper = memory.convention == "paper"
        self.at_start = self.paper and bool(getattr(latency, "stamps_at_start", False))
        self.needs_generated = bool(getattr(latency, "needs_generated", False))
        self.seconds = self._timer(latency, self.needs_generated)
        self.run_seconds = self._run_timer(latency)
        self.overlap = bool(swap.overlap)  # copies overlap compute: an iteration takes the longer of the two
        self.policy_seconds = 0.0  # wall time inside the policy (CacheOPT's Sec. 5.3 scheduling overhead)
        self.block_bytes_all = 0
        #: a decode replica's handoff (kvstudy/cluster/handoff.py ``Handoff``): the KV pulls of handed-off requests,
        #: set by the disaggregated driver; None otherwise
        self.handoff = None
        #: a decode replica's decision that may pull a handed-off request's KV at or past this time waits before it is
        #: carried out until the driver resumes it (pulls over one link happen in time order; the driver sets it)
        self.pull_limit = math.inf
        #: pipeline stages the latency model times (kvstudy/engine/pipeline.py: more than one keeps up to that many
        #: batches in flight, as Vidur's replicas do); assembly.py checks it against hardware.pipeline_parallel
        self.stages = int(getattr(latency, "stages", 1) or 1)
        self.pipe = None
        #: a replica of a cluster that ``drive`` steps (kvstudy/cluster/driver.py): the per-request lists its replicas
        #: share (RunState's ``shared``), and its records then hold only its own requests' rows (and those routed
        #: nowhere; ``merge`` puts them together); None: a run of its own
        self.shared_lists = None

    @staticmethod
    def _timer(latency, needs_generated: bool):
        """``seconds(chunks, decodes, their cached context, their produced tokens)``: the latency model's time of one
        iteration (the produced tokens only for a model that reads them: the MC-SF authors' formula)."""
        if type(latency) is VidurLatency:  # its tables answer a Python float already (no float() per iteration)
            call = latency.tables.iteration_seconds
            return lambda chunks, n, ctx, gen: call(chunks, n, ctx)
        call = latency.iteration_seconds
        if needs_generated:
            return lambda chunks, n, ctx, gen: float(call(chunks, n, ctx, decode_generated_sum=gen))
        return lambda chunks, n, ctx, gen: float(call(chunks, n, ctx))

    @staticmethod
    def _run_timer(latency):
        """``run_seconds(decodes, their cached context, count)``: the latency model's seconds of ``count`` decode-only
        iterations in a row (its optional ``decode_run_seconds``, kvstudy/latency/models.py; vectorised for Vidur's
        tables), or None: the engine asks ``iteration_seconds`` iteration by iteration."""
        if type(latency) is VidurLatency:
            return latency.tables.decode_run_seconds
        if getattr(latency, "needs_generated", False):
            return None  # no model that reads produced tokens has one
        return getattr(latency, "decode_run_seconds", None)

    # --- set-up -------------------------------------------------------------------------------------------------
    def _begin(self) -> None:
        """A run starts: the memory bound to the model, the run's state built, requests that can never be served
        rejected."""
        mem, r = self.memory, self.requests
        if self.arch is not None:  # host space and copy sizes (the paper's memory needs neither)
            mem.bind(kv_bytes_per_gpu(self.arch, self.hw))
            self.swap.bind(self.arch, self.hw, mem.block_size)
            self.block_bytes_all = mem.block_size * self.arch.kv_bytes_per_token(1)
        elif mem.tracks_blocks:
            raise KvStudyError(f"memory={mem.name} needs the model and hardware (host space, copy sizes)")
        if mem.prefix_caching:
            mem.set_segments(r.segments)
        # the KV connector (kvstudy/memory/connector.py): its loads are timed with each iteration (``_time``); it may
        # weigh a load against the latency model's prefill time of those tokens
        self.connector = mem.connector
        if self.arch is not None:
            seconds = self.seconds
            self.connector.set_timing(self.arch.num_layers // self.hw.pipeline_parallel,
                                      lambda tokens, context: seconds([(tokens, context)], 0, 0, 0))
        own_order = self.adapted or bool(getattr(self.policy, "own_queue_order", False))
        self.state = st = RunState(r, self.predicted, self.paper, mem.block_size if mem.tracks_blocks else 0,
                                   mem.gpu, own_queue_orders=own_order, shared=self.shared_lists)
        if mem.prefix_caching:
            mem.cache.on_first = None  # (a queue of an earlier run is not told)
        if getattr(self.policy, "indexed_waiting", False):  # kvstudy/engine/indexed_queue.py
            clock, prompt = st.clock, st.prompt
            st.waiting = IndexedQueue(lambda i: prompt[i] + clock.tokens[i], mem.first_block, mem.first_block_cached)
            if mem.prefix_caching:
                mem.cache.on_first = st.waiting.told_cached
        self.rows = records.row_log(mem)
        if self.adapted:
            self.policy.forget()  # a second run of this engine starts from nothing, as the first
        self.events = ev = EventLog() if self.record_events else None
        self.act = Transitions(st, mem, ev, self.paper, self.adapted, self.block_bytes_all)  # transitions.py
        self.pipe = Pipeline(self.stages) if self.stages > 1 else None
        if self.handoff is not None:  # a decode replica of a disaggregated cluster (kvstudy/cluster/handoff.py)
            self.handoff.begin()
            self.act.pull = self.handoff.pull
        s, out, watermark = st.prompt, r.output_tokens.tolist(), not self.adapted
        for i in range(st.n):
            why = mem.rejection(s[i], out[i], watermark=watermark)
            if why:
                st.request_state[i], st.reject_reason[i] = REJECTED, why
                if ev is not None:
                    ev.add(st.arrival[i], i, "reject", step=-1)

    def run(self) -> EngineResult:
        """Run every request to its end (or the run's stop) and return the run's records."""
        loop = self.loop(cluster=False)
        try:
            next(loop)  # alone on its clock the loop never pauses: it returns at once
        except StopIteration as stop:
            return stop.value
        raise KvStudyError("the engine paused outside a cluster")  # a bug: never reached

    # --- the loop ------------------------------------------------------------------------------------------------
    def loop(self, cluster: bool = True):
        """The loop as a generator, its phases numbered as in the module docstring; returns the run's records
        (``StopIteration.value``). Alone (``run``) it never pauses. In a cluster (kvstudy/cluster/driver.py) it yields
        its clock before a decision at or past its *horizon* (the next arrival, routed first) and is sent the next
        one; idle, it yields ``IDLE`` and is sent the next arrival routed to it (None: none will come)."""
        name, view, overflow, spare, check = self._start()
        st = self.state
        waiting, running, swapped = st.waiting, st.running, st.swapped
        next_time = self._next_arrival_time()
        t, step, no_token, since_completion, clearing, policy_s = 0.0, 0, 0, 0, 0, 0.0
        status, message, horizon, bar = "completed", "", -math.inf, self._progress_bar(name)
        # what a disaggregated replica hands the driver (a prefill replica's handoffs, a decode replica's pulls, whose
        # releases may wake a prefill replica): it pauses after each iteration that made some, for the driver to act
        sent = self.handoff.started if self.handoff is not None else st.handed
        # a decode replica's decode run the driver's horizon cut goes on after the pause as it would have without it
        # (``_go_on``; the policy's steady_spare promise still holds: nothing arrived): carry is where it stopped
        carry, carries = None, cluster and self.handoff is not None and spare is not None
        pipe = self.pipe  # pipeline parallelism: batches in flight (kvstudy/engine/pipeline.py), or None
        try:
            while True:
                if cluster and (t >= horizon or sent):  # the driver routes what arrives by t before this decides
                    horizon = yield t
                    if st.inbox and st.inbox[0][0] < next_time:  # the driver posted an event (disaggregation)
                        next_time = st.inbox[0][0]
                if pipe is not None and pipe.flight and pipe.flight[0].end <= t:  # batches whose last stage ended
                    if self._land(t, cluster, bar):
                        since_completion = 0
                if t >= next_time:  # 1. arrivals
                    next_time = self._arrive(t)
                    carry = None
                self.idled = False  # authors_code: consumed by the pass after the idle second
                if pipe is not None and pipe.flight and not waiting and not running and not swapped:
                    t = self._pipe_wait(t, next_time, horizon if cluster else math.inf)  # all of them in flight
                    continue
                if not waiting and not running and not swapped:
                    woke = (yield IDLE) if cluster else self._wake()
                    if woke is None:
                        break
                    # woken: others arriving then are routed first (never earlier than the clock: an event a
                    # disaggregated cluster's driver posted, kvstudy/cluster/disaggregated.py, may be due before it)
                    t, horizon = max(t, self._round_up(woke)), -math.inf
                    next_time = self._next_arrival_time()
                    continue
                if step >= self.max_iterations:
                    status, message = "max_iterations", f"stopped after {step} iterations (engine.max_iterations)"
                    break
                went = None
                if carry is not None:  # the decode run the driver's pause cut, on from where it stopped
                    went, carry = self._go_on(carry, min(next_time, horizon), self.max_iterations - step + 1,
                                              spare), None
                if went is not None:
                    t, dt, stamp, finished, kv, run = went
                    step, produced = step + run - 1, True
                    if not finished and t + dt >= horizon:
                        carry = self._stop_point(t, dt, stamp, kv)
                else:
                    d, decode_only, seconds = self._decide(view, check, step, t, name, overflow)  # 3. decide, check
                    if d is None:  # 2. clear: the running requests' need overflows the memory (the policy's hook)
                        t += self._clear(overflow, view, t, step, name)
                        step, clearing, since_completion = step + 1, clearing + 1, since_completion + 1
                        if since_completion >= self.stall_limit:
                            status, message = "no_progress", self._overflowing_message(since_completion)
                            break
                        continue
                    policy_s += seconds
                    if decode_only and not (st.prefilling or st.reserved) and running and pipe is None:
                        # 4-7 for the most common iteration, and the decode-only iterations after it that the policy
                        # promised (steady_spare): one decode run, of one iteration when there is no promise
                        most = 1 if spare is None or swapped else self.max_iterations - step
                        limit = min(next_time, horizon) if cluster else next_time
                        t, dt, stamp, finished, kv, run = self._decode_run(t, limit, most, spare)
                        step, produced = step + run - 1, True
                        if carries and not finished and not swapped and run < most and t + dt >= horizon:
                            carry = self._stop_point(t, dt, stamp, kv)
                    else:
                        if cluster and st.supplied and t >= self.pull_limit:  # it may pull: after the earlier pulls
                            horizon = yield t
                            if st.inbox and st.inbox[0][0] < next_time:
                                next_time = st.inbox[0][0]
                        batch = self._apply(d, t)  # 4. apply
                        if not batch.chunks and not batch.decodes:  # nothing computes: copies take their time, or idle
                            t += batch.swap_seconds
                            if pipe is not None and pipe.flight:  # what could run is in flight: wait for its end
                                t = self._pipe_wait(t, next_time, horizon if cluster else math.inf)
                                continue
                            if not (d.preempt or d.swap_in or running or swapped):
                                woke = (yield IDLE) if cluster else self._wake()
                                if woke is not None:  # idle: nothing runs until the next arrival
                                    t, horizon = max(t, self._round_up(woke)), -math.inf
                                    next_time = self._next_arrival_time()
                                    continue
                            no_token += 1
                            stop = self._ran_nothing(d, no_token, overflow is not None, name)
                            if stop:
                                status, message = stop
                                break
                            continue
                        dt = self._time(d, batch)  # 5. time
                        if pipe is not None:  # through the stages behind the batches ahead of it: its end
                            members = self._members(d, batch)
                            dt = pipe.place(t, dt, self.latency.hop_seconds(batch.decodes + sum(
                                c for c, _ in batch.chunks))) - t
                        stamp, finished, produced, kv = self._stamp_and_record(d, batch, t, dt, step)  # 6, 7
                        if pipe is not None:  # in flight until its end; finished ones free their KV then
                            self._send(members, finished, stamp, step, t + dt, kv)
                            finished = []
                if finished:
                    since_completion = 0
                    self._finish(finished, stamp, step, t + dt, kv, cluster, bar)
                no_token = 0 if produced else no_token + 1
                t = t + dt if pipe is None else pipe.next_decision(t)
                view.last_iteration_seconds = dt
                step += 1
                if no_token >= self.stall_limit:
                    status, message = "no_progress", self._no_token_message(no_token, name)
                    break
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM turned into it by the run's handler: keep what is done
            status, message = "interrupted", interrupted_message(step)
        finally:
            self.policy_seconds += policy_s  # the steps' (the clearing events' are added as they happen)
            if bar is not None:  # cleared before anything is printed: an error never lands on the bar's line
                bar.close()
        return self._end(status, message, clearing, cluster)

    def _start(self):
        """A run starts (``_begin``); returns (the policy's name, the one view that serves every step, the policy's
        overflow hook or None, its decode-run promise or None, whether its decisions are checked)."""
        self._begin()
        self.policy_seconds = 0.0
        policy = self.policy
        name = getattr(policy, "name", type(policy).__name__)
        view = StepView(self, 0, 0.0)  # its containers are the engine's own: one view serves every step
        overflow = getattr(policy, "overflow_victims", None)  # the engine detects overflow for this policy
        # decode-only iterations the policy promises to repeat are advanced without asking it (issue 47); not while
        # events are recorded (each iteration's decodes are listed) or the engine checks overflow before each step
        spare = policy.steady_spare(view) if self.events is None and overflow is None and self.stages == 1 else None
        # the adapter on the paper's memory holds just the positions it validated and has no capacity to check
        # (constraint (3): admissions are not charged; an overflow is caught at the next round): not checked here
        check = not (self.paper and self.adapted)
        self.idled = False  # authors_code: the last step was an idle second, whose end arrivals join at (inclusive)
        return name, view, overflow, spare, check

    def _finish(self, finished: list, stamp: float, step: int, end: float, kv: int, cluster: bool, bar) -> None:
        """The requests that produced their last token in the iteration ending at ``end`` finish (in a cluster the
        driver first learns the replica's load as it was during it: outstanding requests, KV in use)."""
        st = self.state
        if cluster:
            st.inflight = (end, st.outstanding(), self.memory.used if self.memory.tracks_blocks else kv)
        self.act.finish(finished, stamp, step)
        if bar is not None:
            bar.update(len(finished))  # tqdm redraws at most every mininterval

    # --- 1. arrivals ---------------------------------------------------------------------------------------------
    def _arrive(self, t: float) -> float:
        """Requests that have arrived by ``t`` join the waiting queue; returns the next arrival's time (inf: none).
        ``arrivals=paper``: every one arrived by the clock; ``authors_code`` (the MC-SF authors' event order,
        memory=paper): an arrival at the instant a batch ends joins after the next batch is formed, unless the last
        step was an idle second (``idled``)."""
        st = self.state
        a, n, state, waiting, nxt = st.arrival, st.n, st.request_state, st.waiting, st.next_arrival
        inclusive = self.arrivals != "authors_code" or self.idled
        while nxt < n and (a[nxt] <= t if inclusive else a[nxt] < t):
            if state[nxt] == FUTURE:
                state[nxt] = WAITING
                waiting.append(nxt)
            nxt += 1
        st.next_arrival = nxt
        if st.inbox:
            return min(a[nxt] if nxt < n else math.inf, self._deliver(t))
        return a[nxt] if nxt < n else math.inf

    def _next_arrival_time(self) -> float:
        st = self.state
        nxt = st.arrival[st.next_arrival] if st.next_arrival < st.n else math.inf
        return min(nxt, st.inbox[0][0]) if st.inbox else nxt

    def _deliver(self, t: float) -> float:
        """The driver's events due by ``t`` (kvstudy/cluster/disaggregated.py, in time order): a handed-off request
        joins the waiting queue with its first token made and its prompt's KV to be pulled (``arrive``), or a prefill
        replica's finished request frees the blocks it kept for the transfer (``release``). Returns the next one's
        time (inf: none)."""
        st, inbox = self.state, self.state.inbox
        while inbox and inbox[0][0] <= t:
            _, _, kind, i, payload = heappop(inbox)
            if kind == "release":
                self.act.free(i, computed=st.prompt[i] + st.output[i] - 1)
                continue
            first_token, first_scheduled = payload
            st.request_state[i] = WAITING
            if i < st.policy_arrived:  # else the policy meets it among its next step's arrivals (StepView.joined)
                st.joined.append(i)
            st.clock.tokens[i] = 1  # the prefill replica made token 1; this one computes its KV and makes token 2
            st.first_token[i] = st.last_token[i] = first_token
            st.first_scheduled[i] = first_scheduled
            st.prefill_target[i] = st.prompt[i] + 1
            st.prefilled[i] = st.supplied[i] = st.prompt[i]  # a policy plans the one token left to compute
            st.waiting.append(i)  # with its token counted (an indexed queue sizes it as it joins)
            if self.events is not None:
                self.events.add(first_token, i, "handed_in", tokens=st.prompt[i])
        return inbox[0][0] if inbox else math.inf

    def _wake(self):
        """Alone on its clock and idle: the next arrival, which the engine jumps to (None: nothing left to arrive;
        the caller rounds it up to a whole round under latency=unit on the paper's memory). Under
        ``arrivals=authors_code`` that request joins the queue at once, alone (later ones at that instant wait for its
        batch)."""
        st = self.state
        n, state, nxt = st.n, st.request_state, st.next_arrival
        if self.arrivals != "authors_code":
            return st.arrival[nxt] if nxt < n else None
        while nxt < n and state[nxt] != FUTURE:  # rejected requests never arrive
            nxt += 1
        if nxt >= n:
            st.next_arrival = nxt
            return None
        state[nxt] = WAITING
        st.waiting.append(nxt)
        st.next_arrival = nxt + 1
        return st.arrival[nxt]

    def _round_up(self, woke: float) -> float:
        """The clock an idle engine jumps to: the arrival, a whole round under latency=unit on the paper's memory."""
        return float(math.ceil(woke)) if self.at_start else woke

    # --- 2. clear ------------------------------------------------------------------------------------------------
    def _clear(self, overflow, view: StepView, t: float, step: int, name: str) -> float:
        """A clearing event (the running requests' need for this iteration exceeds the memory): recompute the policy's
        victims (on the paper's memory: restart them), record the event as an ``overflow`` iteration and return its
        cost in seconds (``overflow_cost``: ``batch``, the latency of the batch that overflowed, which produces no
        token; ``free``, nothing; ``authors_code``, nothing when the eviction brings the KV within capacity, else one
        idle second whose end arrivals join at). Survivors make no progress in it: on the paper's memory their
        schedules move one round later (records.py)."""
        st, mem = self.state, self.memory
        state, running = st.request_state, st.running
        t0 = perf_counter()
        try:
            victims = overflow(view)
            self.policy_seconds += perf_counter() - t0
            st.policy_arrived = view.num_arrived  # the hook took in the arrivals and joined requests, as a step does
            if st.joined:
                st.joined.clear()
            seen = set()
            for i in victims:
                if not isinstance(i, (int, np.integer)) or not 0 <= i < len(state) or state[i] != RUNNING or i in seen:
                    raise PolicyError(f"policy '{name}' names request {i!r} as an overflow victim: not a running "
                                      f"request of this run, or named twice")
                seen.add(i)
        except PolicyError as exc:
            raise located(self, exc, step, t) from None
        n_dec, ctx = len(running) - len(st.prefilling), st.decode_context_tokens
        dt = 0.0
        if self.overflow_cost == "batch":
            dt = self.seconds(NO_CHUNKS, n_dec, ctx, ctx + n_dec - st.decode_prompt_tokens)
        used = mem.used
        if len(victims) > 8:  # a clearing of many (alpha-greedy clears all): one pass over the running list
            gone = set(victims)
            running[:] = [i for i in running if i not in gone]
            for i in victims:
                self.act.preempt(i, RECOMPUTE, t, listed=False, kind="evict")
        else:
            for i in victims:
                self.act.preempt(i, RECOMPUTE, t, kind="evict")
        if self.events is not None:
            self.events.add(t, -1, "clear", tokens=len(victims))
        st.waiting.extendleft(i for i in victims if state[i] == WAITING)
        if self.overflow_cost == "authors_code" and st.decode_context_tokens + len(running) > mem.capacity_tokens:
            dt, self.idled = 1.0, True  # the scripts idle one second before clearing again
        if self.paper:
            admission_round = st.admission_round
            for i in running:
                admission_round[i] += 1
        self.rows.clearing(start=t, duration=dt, decodes=n_dec, decode_kv=ctx + n_dec, cleared=len(victims),
                           blocks_used=used)
        return dt

    # --- 3. decide and check ------------------------------------------------------------------------------------------
    def _decide(self, view: StepView, check: bool, step: int, t: float, name: str, overflow):
        """What the policy sees this step (the running requests whose context crosses a block boundary now,
        ``growing``; the step, the clock, the arrivals), then its decision, checked whole before anything changes
        (check.py; a refused one names where the run was). Returns (the decision, whether every running request
        decodes and nothing else happens, the seconds inside the policy); (None, False, 0.0) when the policy has an
        overflow hook and the running requests' need overflows the memory (the loop clears instead, ``_clear``).
        A decode-only decision is checked the short way: the growing requests' blocks fit. One function, not two,
        because it runs every iteration (a Python call is a measurable share of the cheapest policies' step)."""
        st, mem = self.state, self.memory
        clock, growing = st.clock, st.growing
        if growing:
            growing.clear()
        if clock.grow_at.get(clock.ticks):
            growing.update(clock.growing())
        view.step, view.time, view.num_arrived = step, t, st.next_arrival
        if self.events is not None:
            self.events.step = step
        if overflow is not None and mem.overflows(st.decode_context_tokens + len(st.running), len(growing)):
            return None, False, 0.0
        t0 = perf_counter()
        try:
            d = self.policy.step(view)
            seconds = perf_counter() - t0
            st.policy_arrived = view.num_arrived
            if st.joined:  # the policy has seen them
                st.joined.clear()
            decode_only = d.__class__ is Decision and d.decode_all and not (
                d.preempt or d.swap_in or d.prefill or d.decode or d.reserve or d.lend)
            if check and not (decode_only and (not mem.tracks_blocks or mem.used + len(growing) <= mem.num_blocks)):
                check_decision(self, d, name)
        except PolicyError as exc:
            raise located(self, exc, step, t) from None
        return d, decode_only, seconds

    # --- 4-7 for the most common iteration: every running request decodes, nothing else happens -------------------
    def _decode_run(self, t: float, limit: float, max_run: int, spare):
        """The decided decode-only iteration (the general path's arithmetic without its empty branches), and when
        ``max_run`` > 1 the ones after it that the policy's ``steady_spare`` promise covers (issue 47; ``_run_on``):
        a decode-only iteration is a run of one. Returns (the last iteration's start, its seconds, its token stamp, the
        requests that finished in it, its decoders' KV tokens, how many iterations ran)."""
        st = self.state
        clock = st.clock
        n, ctx, prompts = len(st.running), st.decode_context_tokens, st.decode_prompt_tokens
        if st.growing or clock.ticks in clock.grow_at:
            self._grow_blocks()
        if self.events is not None:  # (runs of one only: no promise is asked for while events are recorded)
            self.events.decoded(st.running)
        compute = self.seconds(NO_CHUNKS, n, ctx, ctx + n - prompts)
        dt = max(compute, 0.0) if self.overlap else compute + 0.0
        stamp = t if self.at_start else t + dt
        finished = clock.tick(stamp)
        self.rows.decode_only(t, dt, n, ctx + n)
        run = 1
        if not finished and run < max_run and t + dt < limit:
            t, dt, stamp, finished, ctx, run = self._run_on(t, dt, stamp, ctx, n, prompts, limit, max_run, spare)
        return t, dt, stamp, finished, self._settle_run(finished, ctx, n, prompts), run

    def _stop_point(self, t: float, dt: float, stamp: float, kv: int) -> tuple:
        """Where a decode run the driver's horizon cut stopped, for ``_go_on``: its last iteration's start, seconds
        and stamp (that iteration's decoders held ``kv`` tokens), their context before it, how many decode, their
        prompts."""
        st = self.state
        n = len(st.running)
        return t, dt, stamp, kv - n, n, st.decode_prompt_tokens

    def _go_on(self, carry: tuple, limit: float, max_run: int, spare: int):
        """A decode replica's decode run that stopped at the disaggregated driver's horizon (kvstudy/cluster/
        disaggregated.py) goes on where it stopped, with no decision, as it would have gone on without the pause:
        ``carry`` is (its last iteration's start, seconds and stamp, its decoders' context before it, how many decode,
        their prompts); nothing has arrived since. Returns ``_decode_run``'s tuple for the iterations it ran (their
        count last), or None when none may (the promise's condition fails: the policy decides)."""
        t, dt, stamp, ctx, n, prompts = carry
        t, dt, stamp, finished, ctx, run = self._run_on(t, dt, stamp, ctx, n, prompts, limit, max_run, spare)
        if run == 1:
            return None
        return t, dt, stamp, finished, self._settle_run(finished, ctx, n, prompts), run - 1

    def _settle_run(self, finished, ctx: int, n: int, prompts: int) -> int:
        """A decode run's end: the requests that finished in its last iteration leave the clock and the running
        aggregates (its ``n`` decoders held ``ctx`` tokens of context before that iteration, ``prompts`` of prompt).
        Returns the last iteration's decoders' KV tokens."""
        st = self.state
        left_ctx, left_prompts = self._leave_clock(finished) if finished else (0, 0)
        st.decode_context_tokens = ctx + n - left_ctx
        st.decode_prompt_tokens = prompts - left_prompts
        return ctx + n

    def _run_on(self, t: float, dt: float, stamp: float, ctx: int, n: int, prompts: int, limit: float,
                max_run: int, spare: int):
        """A decode run's iterations after its first (which started at ``t``, took ``dt``, its decoders holding
        ``ctx`` tokens of context): each as the first, while no request finished in the last one, the next one starts
        before ``limit`` (the next arrival; in a cluster also the horizon), the growing requests find their blocks
        with ``spare`` to spare, and ``max_run`` (engine.max_iterations) allows; their seconds from the latency
        model's ``decode_run_seconds`` when it has one, asked in blocks. Returns (the last iteration's start, its
        seconds, its stamp, the requests that finished in it, its decoders' context before it, iterations in all)."""
        mem, clock = self.memory, self.state.clock
        grow_at, tick, rows, seconds = clock.grow_at, clock.tick, self.rows, self.seconds
        at_start, overlap, run_seconds = self.at_start, self.overlap, self.run_seconds
        run, ahead, at, block, finished = 1, [], 0, 32, []  # ahead: the next iterations' seconds, asked in blocks
        while True:
            # the next iteration's growing requests take their blocks if the promise's condition holds; else the
            # policy decides (the loop's next pass computes the same growing set for it)
            if grow_at.get(clock.ticks):
                if not clock.grow_if_room(mem.hold, mem.free - spare):
                    break
            elif spare > mem.free:  # nobody grows, but the policy wants blocks to spare (vLLM: one at each turn)
                break
            t += dt
            ctx += n
            if at < len(ahead):
                dt = ahead[at]
                at += 1
            else:
                compute = seconds(NO_CHUNKS, n, ctx, ctx + n - prompts)
                dt = max(compute, 0.0) if overlap else compute + 0.0
                room = (limit - t) / dt if dt > 0.0 and run_seconds else 0.0  # iterations to the limit
                if room > 8:  # room ahead: ask in a block
                    count = min(block if room >= block else int(room) + 1, max_run - run - 1)
                    ahead = run_seconds(n, ctx + n, count)
                    ahead = [max(c, 0.0) for c in ahead] if overlap else [c + 0.0 for c in ahead]
                    at, block = 0, min(2 * block, 1024)
            stamp = t if at_start else t + dt
            finished = tick(stamp)
            rows.decode_only(t, dt, n, ctx + n)
            run += 1
            if finished or run >= max_run or t + dt >= limit:
                break
        return t, dt, stamp, finished, ctx, run

    def _grow_blocks(self) -> None:
        """The running requests on the decode clock whose context crosses a block boundary now take their block (the
        caller checks first that some may: ``growing``, or a boundary due at this tick; never on the paper's memory)."""
        st, mem = self.state, self.memory
        on_clock = st.clock.on_clock
        st.clock.grow([i for i in st.growing if on_clock[i]], mem.hold)  # preempted ones are off the clock

    def _leave_clock(self, finished):
        """The requests that produced their last token leave the decode clock; returns (their cached contexts, their
        prompts), which leave the running aggregates after the iteration's row."""
        st = self.state
        s, o, stop = st.prompt, st.output, st.clock.stop
        left_ctx = left_prompts = 0
        for i in finished:
            stop(i)
            left_ctx += s[i] + o[i] - 1
            left_prompts += s[i]
        return left_ctx, left_prompts

    # --- pipeline parallelism: batches in flight (kvstudy/engine/pipeline.py) --------------------------------------
    def _members(self, d: Decision, batch: "Batch") -> set:
        """The requests the applied decision runs: its prefills and its decoders."""
        st = self.state
        members = {i for i, _ in batch.prefills}
        if d.decode_all:
            prefilling = st.prefilling
            members.update(i for i in st.running if i not in prefilling)
        else:
            members.update(d.decode)
        return members

    def _send(self, members: set, finished: list, stamp: float, step: int, end: float, kv: int) -> None:
        """A stamped batch goes in flight until ``end``: its requests leave the running list (in their order), the
        prefilling set, the decode clock and the running aggregates, so the policy's next steps do not see them; those
        that finished stay in flight too and free their KV when it ends (``_land``)."""
        st = self.state
        clock, s, running, prefilling, state = st.clock, st.prompt, st.running, st.prefilling, st.request_state
        order = [i for i in running if i in members]
        running[:] = [i for i in running if i not in members]
        gone = set(finished)
        ctx = prompts = 0
        for i in order:
            state[i] = IN_FLIGHT
            if i in gone:  # off the clock and out of the aggregates already (_stamp_and_record)
                continue
            if i in prefilling:
                prefilling.discard(i)  # back at its end: _land reads prefilled < target
            else:
                if clock.on_clock[i]:
                    clock.stop(i)
                ctx += s[i] + clock.tokens[i] - 1
                prompts += s[i]
        st.decode_context_tokens -= ctx
        st.decode_prompt_tokens -= prompts
        st.in_flight.update(order)
        self.pipe.flight.append(InFlight(end, order, finished, stamp, step, kv))

    def _land(self, t: float, cluster: bool, bar) -> bool:
        """Every batch in flight whose last stage ended by ``t`` gives its requests back (at the end of the running
        list, as Vidur's ``on_batch_end`` appends them) and its finished requests finish, freeing their KV. Returns
        whether any finished."""
        st, flight = self.state, self.pipe.flight
        clock, s, running, state = st.clock, st.prompt, st.running, st.request_state
        prefilled, target, in_flight = st.prefilled, st.prefill_target, st.in_flight
        any_finished = False
        while flight and flight[0].end <= t:
            b = flight.popleft()
            gone = set(b.finished)
            ctx = prompts = 0
            for i in b.members:
                in_flight.discard(i)
                state[i] = RUNNING
                running.append(i)
                if i in gone:
                    continue
                if prefilled[i] < target[i]:
                    st.prefilling.add(i)
                else:
                    clock.start(i, clock.tokens[i])
                    ctx += s[i] + clock.tokens[i] - 1
                    prompts += s[i]
            st.decode_context_tokens += ctx
            st.decode_prompt_tokens += prompts
            if b.finished:
                self._finish(b.finished, b.stamp, b.step, b.end, b.kv, cluster, bar)
                any_finished = True
        return any_finished

    def _pipe_wait(self, t: float, next_time: float, horizon: float) -> float:
        """Every request that could run is in flight: the next batch forms when the first stage is free and a batch
        ends or a request arrives (in a cluster, by the driver's horizon), whichever is first."""
        pipe = self.pipe
        soonest = min(pipe.next_end(), next_time, horizon)
        at = pipe.next_decision(t)
        return at if at > soonest else soonest

    # --- 4. apply ------------------------------------------------------------------------------------------------
    def _apply(self, d: Decision, t: float) -> "Batch":
        """Carry out a checked decision in the order preempt, swap in, lend, prefill, decode, reserve; returns what
        runs in the iteration."""
        st, mem, clock = self.state, self.memory, self.state.clock
        state = st.request_state
        act, n_rec, blocks_out, blocks_in = self.act, 0, 0, 0
        for i, mode in d.preempt:
            done, blocks = act.preempt(i, mode, t)
            n_rec += done == RECOMPUTE
            blocks_out += blocks
        if d.preempt:  # vLLM's waiting.extendleft(preempted): the last victim (the earliest admitted) ends first
            st.waiting.extendleft(i for i, _ in d.preempt if state[i] == WAITING)
        for i in d.swap_in:
            blocks_in += act.swap_in(i, t)
        topped = set()
        for g, h, b in d.lend:  # embedded guests take their host's unused blocks before they start
            if h in d.reserve and h not in topped:  # a host's reservation once, before its first loan: held again
                # before each loan it would take back what the last one lent (issue 59: 16 blocks over the
                # check's count, a cache 7 blocks over capacity, at iteration 559,112 of CacheOPT at 10^6)
                mem.hold(h, mem.blocks(d.reserve[h]))
                topped.add(h)
            mem.lend(h, g, b)
            clock.reschedule_growth(h)
            st.reserved.add(g)
        batch = Batch(n_rec)
        self._prefills(d, t, batch)
        self._decoders(d, batch)
        if d.reserve:
            lenders = {h for _, h, _ in d.lend} if d.lend else ()
            for i, tokens in d.reserve.items():
                if i in lenders:
                    continue  # held before it lent
                mem.hold(i, mem.blocks(tokens))
                st.reserved.add(i)
                clock.reschedule_growth(i)
        if blocks_out or blocks_in:
            batch.swap_seconds = self.swap.seconds(blocks_out) + self.swap.seconds(blocks_in)
        return batch

    def _prefills(self, d: Decision, t: float, batch: "Batch") -> None:
        """Prefills start (waiting requests) or go on; each chunk is timed with the context before it. With prefix
        caching a prefill skips its cached prefix (a chunk runs past it, capped at the rest) and the blocks its chunk
        fills are cached now (vLLM v1 caches at scheduling)."""
        st, mem = self.state, self.memory
        state, prefilled, target = st.request_state, st.prefilled, st.prefill_target
        prefills, chunks, partial = batch.prefills, batch.chunks, 0
        for i, chunk in d.prefill:
            if state[i] == WAITING:
                self.act.start_prefill(i, t)
            chunk = min(chunk, target[i] - prefilled[i])
            mem.advance(i, prefilled[i] + chunk)
            prefills.append((i, chunk))
        for i, chunk in prefills:
            chunks.append((chunk, prefilled[i]))
            if prefilled[i] + chunk < target[i]:
                partial += chunk
        batch.partial = partial

    def _decoders(self, d: Decision, batch: "Batch") -> None:
        """Who decodes: every running request past its prefill (``decode_all``, on the decode clock), or a list (every
        request off the clock, counted one by one), or none (a prefill-only step: swapped-in requests decode from the
        next one)."""
        st, mem = self.state, self.memory
        clock, running, s = st.clock, st.running, st.prompt
        if d.decode_all or not d.decode:
            for i in d.swap_in:
                clock.start(i, clock.tokens[i])
            if d.decode_all:
                batch.decodes, batch.decode_ctx = len(running) - len(st.prefilling), st.decode_context_tokens
                if st.growing or clock.ticks in clock.grow_at:
                    self._grow_blocks()
            return
        for i in [i for i in running if clock.on_clock[i]]:
            clock.stop(i)
        bs, tokens = mem.block_size, clock.tokens
        batch.decodes = len(d.decode)
        batch.decode_ctx = sum(s[i] + tokens[i] - 1 for i in d.decode)
        for i in d.decode:
            mem.hold(i, (s[i] + tokens[i] + bs - 1) // bs)

    # --- 5. time -------------------------------------------------------------------------------------------------
    def _time(self, d: Decision, batch: "Batch") -> float:
        """The iteration's seconds: the latency model's for its exact batch, and the swap model's copies (the longer
        of the two when they overlap)."""
        st = self.state
        n_dec, ctx_now = batch.decodes, batch.decode_ctx
        if d.decode_all:  # the decodes' produced tokens (the MC-SF authors' formula counts them)
            gen_sum = ctx_now + n_dec - st.decode_prompt_tokens
        else:
            gen_sum = sum(st.clock.tokens[i] for i in d.decode) if d.decode and self.needs_generated else 0
        # the connector's loads its prefills started: waited for, or layer by layer
        compute = self.connector.iteration_seconds(self.seconds(batch.chunks, n_dec, ctx_now, gen_sum))
        if self.handoff is not None:  # handed-off prompts' KV pulled by this iteration's prefills (disaggregation)
            compute = self.handoff.iteration_seconds(compute)
        swap_s = batch.swap_seconds
        return max(compute, swap_s) if self.overlap else compute + swap_s

    # --- 6. stamp, 7. record ---------------------------------------------------------------------------------------
    def _stamp_and_record(self, d: Decision, batch: "Batch", t: float, dt: float, step: int):
        """Stamp the iteration's tokens (one per decoder, one per prefill whose last chunk ran), record its row, and
        return (the stamp, the requests that produced their last token, whether anything progressed, the decoders'
        KV tokens)."""
        st = self.state
        if self.events is not None:
            self.events.prefilled(batch.prefills)
            self.events.decoded([i for i in st.running if i not in st.prefilling] if d.decode_all else d.decode)
        stamp = t if self.at_start else t + dt  # when this iteration's tokens are stamped
        n_dec = batch.decodes
        st.decode_context_tokens += n_dec
        clock, o = st.clock, st.output
        if d.decode_all:
            finished = clock.tick(stamp)  # still on the clock: _leave_clock stops them
            left_ctx, left_prompts = self._leave_clock(finished) if finished else (0, 0)
        else:
            finished, left_ctx, left_prompts = [], 0, 0
            for i in d.decode:  # every decoder is off the clock: one by one
                clock.tokens[i] += 1
                self.act.token(i, stamp)
                if clock.tokens[i] == o[i]:
                    finished.append(i)
                    left_ctx += st.prompt[i] + o[i] - 1
                    left_prompts += st.prompt[i]
        progressed, prefill_tokens, done_at_prefill = self._stamp_prefills(batch.prefills, finished, stamp, step)
        running, prefilling = st.running, st.prefilling
        if d.decode:  # back on the clock, all who decode from here on
            for i in running:
                if i not in prefilling and st.request_state[i] == RUNNING and clock.tokens[i] < o[i]:
                    clock.start(i, clock.tokens[i])
        else:
            for i, _ in batch.prefills:
                if i not in prefilling and clock.tokens[i] < o[i]:
                    clock.start(i, clock.tokens[i])
        # KV held during this iteration (before completions free it), and blocks held beyond it
        batch.blocks_reserved = self._reserved_blocks() if prefilling or st.reserved else 0
        batch.prefill_tokens = prefill_tokens
        batch.kv_in_use = st.decode_context_tokens + st.prefill_kv_tokens + done_at_prefill
        self.rows.iteration(t, dt, batch, d)
        st.decode_context_tokens -= left_ctx
        st.decode_prompt_tokens -= left_prompts
        return stamp, finished, progressed or n_dec > 0, batch.decode_ctx + n_dec

    def _stamp_prefills(self, prefills, finished: list, stamp: float, step: int):
        """The prefill chunks' progress and the tokens of those that completed; a request that produced its last
        token is added to ``finished``. Returns (a chunk went further than its prefill ever got, prefill tokens,
        tokens of prefills that completed their request)."""
        st = self.state
        clock, prefilled, target, furthest, o = st.clock, st.prefilled, st.prefill_target, st.furthest_prefilled, st.output
        first_token, ev = st.first_token, self.events
        advanced, produced, prefill_tokens, done_at_prefill = False, False, 0, 0
        for i, chunk in prefills:
            p = prefilled[i] + chunk
            if p > furthest[i]:  # a chunk past where this request's prefill ever got: progress, no token yet
                furthest[i] = p
                advanced = True
            prefilled[i] = p
            prefill_tokens += chunk
            st.prefill_kv_tokens += chunk
            if p != target[i]:
                continue
            st.prefilling.discard(i)
            st.prefill_kv_tokens -= p
            produced = True
            clock.tokens[i] += 1
            if first_token[i] != first_token[i]:  # its first token (NaN before): no gap to count
                first_token[i] = st.last_token[i] = stamp
                if ev is not None:
                    ev.add(stamp, i, "first_token")
            else:
                self.act.token(i, stamp)
            if self.paper:  # the paper's records: this life's admission round and first token
                st.admission_round[i], st.admission_stamp[i] = step, stamp
            if clock.tokens[i] == o[i]:
                finished.append(i)
                done_at_prefill += p
            else:
                st.decode_context_tokens += p  # = s + generated - 1: it decodes from the next iteration
                st.decode_prompt_tokens += st.prompt[i]
        return advanced or produced, prefill_tokens, done_at_prefill

    def _reserved_blocks(self) -> int:
        """Blocks held beyond the running requests' contexts (chunked prefills, reservations)."""
        st = self.state
        gpu, bs, s = self.memory.gpu, self.memory.block_size, st.prompt
        prefilling, prefilled, held = st.prefilling, st.prefilled, st.reserved
        # the decode clock's ``generated`` inlined: this runs every iteration over every reserving request (CacheOPT
        # reserves for all of them: 14% of a profiled run of 20,000 requests, issue 59)
        clock = st.clock
        tokens, ticks, joined, on = clock.tokens, clock.ticks, clock.joined_at, clock.on_clock
        reserved = 0
        for i in prefilling:
            reserved += gpu[i] - (prefilled[i] + bs - 1) // bs
        for i in st.running:
            if i in held and i not in prefilling:
                g = tokens[i] + ticks - joined[i] if on[i] else tokens[i]
                reserved += gpu[i] - (s[i] + g - 2 + bs) // bs  # ctx = s + g - 1
        return reserved

    # --- the run's end -------------------------------------------------------------------------------------------
    def _end(self, status: str, message: str, clearing: int, cluster: bool) -> EngineResult:
        """The run's records: requests still on the clock stopped, the status settled, the tables built."""
        st = self.state
        state = st.request_state
        if self.pipe is not None and self.pipe.flight:  # a run stopped early: batches in flight report as running
            for b in self.pipe.flight:
                for i in b.members:
                    state[i] = RUNNING
                    st.running.append(i)
            self.pipe.flight.clear()
            st.in_flight.clear()
        for i in st.running:  # a run stopped early: tokens of requests still on the clock
            if st.clock.on_clock[i]:
                st.clock.stop(i)
        if status == "completed" and st.n and not cluster and not (state == DONE).any():  # every request rejected
            first = int(np.flatnonzero(state == REJECTED)[0]) if (state == REJECTED).any() else 0
            status = "nothing_served"
            message = (f"no request was served: all {st.n} were rejected (request {st.request_id[first]}: "
                       f"{st.reject_reason[first] or 'see reject_reason'})")
        if self.paper:  # the paper's memory: the tables the old paper loop wrote, column for column
            result = records.paper_result(self, self.rows, status, message, clearing)
        else:
            rejected = int((state == REJECTED).sum())
            if status == "completed" and rejected:
                message = f"{rejected} request(s) rejected (see reject_reason)"
            result = records.paged_result(self, self.rows, status, message, clearing)
            if not cluster:  # a cluster pools every replica's gaps once (kvstudy/cluster/driver.py)
                result.extra["tbt_pooled"] = records.pooled_tbt(self)
            result.extra["policy_seconds"] = round(self.policy_seconds, 4)
            result.extra["policy_us_per_iteration"] = round(1e6 * self.policy_seconds / max(1, len(self.rows.rows)), 2)
        if self.events is not None:
            result.events, result.batches = self.events.tables(st.requests.request_id)
        if self.shared_lists is not None:  # a replica of a cluster: its own rows (the driver's merge)
            records.own_rows(result, st)
        return result

    # --- messages and the progress bar ------------------------------------------------------------------------------
    def _progress_bar(self, name: str):
        if not self.progress:
            return None
        from tqdm import tqdm  # only when asked: tqdm's import costs a run that shows no bar

        return tqdm(total=self.state.n, desc=name, unit="req", leave=False)

    def _admits_none_message(self, name: str) -> str:
        st = self.state
        first = min(st.waiting)  # the first in arrival order
        prediction = getattr(self.policy, "prediction", None)  # as the policy sees it
        return (f"policy '{name}' admits none of {len(st.waiting)} waiting request(s) on an idle engine (first: "
                f"request {st.request_id[first]}, prompt {st.prompt[first]}, predicted output "
                f"{prediction(first) if prediction else st.predicted[first]}, capacity {self.memory.capacity_tokens})")

    def _ran_nothing(self, d: Decision, no_token: int, admission: bool, name: str):
        """(status, message) after an iteration in which nothing computed (``no_token`` such in a row), or None: go
        on. An admission policy that admits nothing on an idle engine never will (``stalled``); ``stall_limit``
        such iterations in a row end the run."""
        st = self.state
        if admission and not (d.preempt or d.swap_in or st.running or st.swapped):
            return "stalled", self._admits_none_message(name)
        if no_token < self.stall_limit:
            return None
        return "stalled" if not st.running else "no_progress", (
            f"policy '{name}' ran no request in {no_token} iterations in a row (engine.stall_limit="
            f"{self.stall_limit}) with {len(st.waiting)} waiting, {len(st.running)} running and "
            f"{len(st.swapped)} swapped")

    def _no_token_message(self, no_token: int, name: str) -> str:
        return (f"{no_token} iterations in a row produced no token (engine.stall_limit={self.stall_limit}): policy "
                f"'{name}' keeps preempting or re-prefilling")

    def _overflowing_message(self, since_completion: int) -> str:
        return (f"{since_completion} clearing events in a row without a completed request (engine.stall_limit="
                f"{self.stall_limit}); the policy keeps overflowing memory")


class Batch:
    """What one general iteration runs (``StepEngine._apply``), by name: prefill ``(request, tokens)`` pairs and their
    ``(tokens, context before)`` chunks, the decoders and their cached context tokens, the tokens of chunks that leave
    a prefill unfinished, the requests preempted by recompute, the swap copies' seconds; records.py's row logs read
    the iteration's row from it."""

    __slots__ = ("prefills", "chunks", "decodes", "decode_ctx", "partial", "recomputes", "swap_seconds",
                 "prefill_tokens", "kv_in_use", "blocks_reserved")

    def __init__(self, recomputes: int) -> None:
        self.prefills, self.chunks = [], []
        self.decodes = self.decode_ctx = self.partial = 0
        self.recomputes = recomputes
        self.swap_seconds = 0.0
        #: set when the iteration is stamped: prefill tokens computed, KV tokens held during it, blocks held beyond
        #: the running requests' contexts
        self.prefill_tokens = self.kv_in_use = self.blocks_reserved = 0
