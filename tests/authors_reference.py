"""Independent reference simulator for the MC-SF paper authors' real-data scripts.

Jaillet et al., "Online Scheduling for LLM Inference with KV Cache Constraints", published four
simulation scripts in ``anonymouspeople111/neurips2025-code``: ``MC-SF.py``, ``MC-Benchmark.py``,
``alpha-greedy.py`` and ``alpha-beta.py``.  This module re-implements, in its own words and structure,
what each of them computes for one run over a list of requests, request by request and with the same
floating-point expressions (Python floats throughout), so that another implementation can be checked
against it.  It is deliberately plain and slow.

Shared model (all four scripts)
-------------------------------
* One machine runs one batch at a time.  A request goes through one "prompt" step (its prefill) and then
  decode steps, one per batch, until ``output + 1`` steps have been done (``output`` decode steps when
  ``output >= 1``; a zero-length output still takes one decode step).  ``done`` counts the steps processed
  so far, prompt included, and the KV memory of a started, unfinished request is ``prompt + done``.
* The batch duration, in seconds, is
  ``((0.0027 * mean_context + 0.52) * size + 44.6 + 0.378 * prompt_tokens) / 1000``, where ``size`` is the
  number of jobs, ``mean_context`` the integer sum of the jobs' contexts divided by ``size`` (a prompt job
  has context 0; a decode job has context 1 for the first decode step, 2 for the second, ...), and
  ``prompt_tokens`` the summed prompt lengths of the batch's prompt jobs.  The batch ends at
  ``start + duration``; every job in it is credited at that instant, and a request whose last step is in
  the batch completes at that instant.
* Events: arrivals are taken from a heap of ``(arrival, "arrival", id)``, i.e. by time then id, one per
  loop iteration.  A batch end that coincides with the next arrival is handled first.  After handling a
  single event, if the machine is idle, a batch is formed at once (so a lone arrival on an idle machine
  starts a batch immediately; later arrivals at the same instant then find the machine busy).
* Forming a batch: every request with a ready decode step goes in (see the cap below for the alpha
  scripts), then waiting prompts are considered in the script's order.

MC-SF / MC-Benchmark (look-ahead memory check)
----------------------------------------------
* Waiting prompts are considered by output length (MC-SF) or by arrival time (MC-Benchmark).
* Each prompt is added tentatively; the set "running requests + this batch's requests" is then tested:
  for every request ``r`` its projected end is ``now + (output_r + 1 - done_r) * avg_batch_time``; at each
  distinct projected end ``t`` (ascending), the requests whose projected end is ``>= t - 1e-6`` count
  ``prompt_r + min(done_r + int((t - now) // avg_batch_time), output_r + 1)``; if that sum exceeds ``M``
  at any ``t``, the prompt is taken back out, returned to the waiting set, and no further prompt is
  considered for this batch.
* MC-SF only: after every event the real memory of started, unfinished requests is summed and, if above
  ``M``, the script prints and leaves its loop.  This is reproduced with status ``"memory_exceeded"``
  (it cannot happen while the look-ahead is respected, but it is part of the script).

alpha-greedy / alpha-beta (threshold admission with resets)
-----------------------------------------------------------
* Ready decode steps are taken one by one; once the batch holds ``B`` jobs the rest wait.
* If the memory of running requests exceeds ``M * (1 - alpha)``, no prompt is admitted; otherwise the
  waiting prompts are admitted in arrival order with no memory test, until the batch holds ``B`` jobs.
* The memory of running requests is checked after every batch end and after every arrival.  If above
  ``M``: alpha-greedy sends every running request back to the waiting set with its progress wiped (one
  reset event); alpha-beta makes passes, each one a reset event, in which every running request is sent
  back with probability ``beta``; after a pass that leaves memory above ``M`` the machine stays idle for one
  second (arrivals up to then are queued, time jumps by 1 s) and another pass follows.
* The loop stops once the clock reaches ``time_limit``; the clock never moves past it, a batch that would
  end after it is cut to end at it (and is credited in full there), and no batch starts at it.

Choices for what the scripts leave undefined (the same as kvstudy's, docs/authors_code.md)
--------------------------------------------------------------------------------
1. ``average_batch_processing_time`` is the ``avg_batch_time`` argument (default 0.05 s).
2. ``time_limit`` is the argument (default infinity: run until no event is left and the machine is idle).
   The MC scripts have no time limit; for them a finite ``time_limit`` only truncates the script's run:
   no event later than ``time_limit`` is handled (events exactly at it are), so the result is a prefix of
   the unlimited run; status ``"time_limit"`` when an event was left unhandled.
3. ``B`` (alpha scripts' batch cap) is ``batch_cap``; ``None`` means no cap.  Under a cap the ready decode
   steps are taken in ascending request id.  (The MC scripts have no cap; ``batch_cap`` is ignored there.)
4. MC-SF's sort by output length breaks ties by arrival time, then request id.  (MC-Benchmark and the
   alpha scripts sort by arrival time only; their ties are broken by request id too.)
5. alpha-beta's draws: one ``numpy.random.default_rng(seed)`` per run; each reset pass draws
   ``rng.random(k)`` for the ``k`` running requests in ascending id, and the j-th is reset when draw j
   ``< beta``.
6. The requests given are the whole run (the scripts' outer loops over 1,000..10,000 rows are not
   simulated).
7. A request never admitted never completes (``None``).  Termination: a batch is never started once
   ``max_batches`` batches have been started; the run then stops with status ``"max_batches"``.
   For alpha-beta with ``beta <= 0`` and no time limit the script's reset loop would never end; that
   combination is rejected with ``ValueError``.

Result: ``{"completion": [...], "batches": started batches, "resets": reset events (alpha-greedy: full
resets; alpha-beta: passes; MC: 0), "status": "completed" | "time_limit" | "max_batches" |
"memory_exceeded"}``.
"""
from __future__ import annotations

import math

import numpy as np

ALGORITHMS = ("mcsf", "mc_benchmark", "alpha_greedy", "alpha_beta")

# Slack the MC scripts allow when deciding whether a request is still alive at a projected end time.
_END_SLACK = 1e-6


class _Request:
    """Per-request state mirroring the scripts' request objects (only the fields that matter)."""

    __slots__ = ("rid", "arrival", "prompt", "output", "done", "left", "context", "started", "completed",
                 "finish")

    def __init__(self, rid, arrival, prompt, output):
        self.rid = rid
        self.arrival = float(arrival)
        self.prompt = int(prompt)
        self.output = int(output)
        self.done = 0  # steps processed, the prompt step included
        self.left = self.output + 1  # steps still to process, the prompt step included
        self.context = 0  # context of the next decode step
        self.started = False
        self.completed = False
        self.finish = None

    def wipe(self):
        """Lose all progress (an alpha-script reset): back to an unstarted request."""
        self.done = 0
        self.started = False
        self.left = self.output + 1
        self.context = 0


def _batch_seconds(jobs):
    """Duration of a batch as all four scripts compute it: the millisecond formula over the job count, the
    mean context (integer sum divided by the count) and the total prompt length, divided by 1000.

    ``jobs`` is a list of ``(request id, context, prompt length or 0)``."""
    size = len(jobs)
    mean_context = sum(job[1] for job in jobs) / size
    prompt_tokens = sum(job[2] for job in jobs)
    return ((0.0027 * mean_context + 0.52) * size + 44.6 + 0.378 * prompt_tokens) / 1000


class _Run:
    """State common to the four scripts: requests, arrival cursor, waiting/running/ready sets, machine."""

    def __init__(self, arrival, prompt, output):
        if not (len(arrival) == len(prompt) == len(output)):
            raise ValueError("arrival, prompt and output must have the same length")
        self.reqs = [_Request(i, a, p, o) for i, (a, p, o) in enumerate(zip(arrival, prompt, output))]
        # The scripts pop arrivals from a heap of (time, "arrival", id): time first, then id.
        self.arrivals = sorted(range(len(self.reqs)), key=lambda i: (self.reqs[i].arrival, i))
        self.cursor = 0
        self.waiting = set()  # arrived (or reset), not started
        self.running = set()  # started, not completed
        self.ready = set()  # running requests whose next decode step may join a batch
        self.now = 0.0
        self.busy = False
        self.batch_end = 0.0
        self.batch_ids = None
        self.batches = 0
        self.resets = 0

    def next_arrival_time(self):
        return self.reqs[self.arrivals[self.cursor]].arrival if self.cursor < len(self.arrivals) else None

    def take_arrival(self):
        """Pop the next arrival into the waiting set."""
        rid = self.arrivals[self.cursor]
        self.cursor += 1
        self.waiting.add(rid)

    def finish_batch(self, bump_context_first):
        """Credit every job of the batch ending now.  A not-started request was a prompt: it becomes running,
        has done one step, its next decode step is ready with context 1.  Otherwise one decode step is done;
        if steps remain its next step is ready (context + 1), else it completes now and leaves the running
        set.  The MC scripts raise the context only when steps remain, the alpha scripts always (no effect
        on results: a finished request's context is never read)."""
        for rid in self.batch_ids:
            r = self.reqs[rid]
            if not r.started:
                r.started = True
                r.done += 1
                self.ready.add(rid)
                self.running.add(rid)
                r.left -= 1
                r.context = 1
            else:
                r.done += 1
                r.left -= 1
                if bump_context_first:
                    r.context += 1
                if r.left > 0:
                    self.ready.add(rid)
                    if not bump_context_first:
                        r.context += 1
                else:
                    r.completed = True
                    r.finish = self.now
                    self.running.discard(rid)
                    self.ready.discard(rid)
        self.busy = False
        self.batch_ids = None

    def running_memory(self):
        """KV memory of running requests: prompt + steps done, summed (integers)."""
        return sum(self.reqs[rid].prompt + self.reqs[rid].done for rid in self.running)

    def send_back(self, rid):
        """Reset one running request: progress wiped, back to waiting, out of running and ready."""
        self.reqs[rid].wipe()
        self.waiting.add(rid)
        self.running.discard(rid)
        self.ready.discard(rid)

    def start_batch(self, jobs, end_cap=math.inf):
        """Start a batch now; its end is now + duration, cut to ``end_cap`` (the alpha scripts' time limit)."""
        end = self.now + _batch_seconds(jobs)
        if end > end_cap:
            end = end_cap
        self.batch_end = end
        self.busy = True
        self.batch_ids = [job[0] for job in jobs]
        self.batches += 1

    def result(self, status):
        return {"completion": [r.finish if r.completed else None for r in self.reqs], "batches": self.batches,
                "resets": self.resets, "status": status}


# --------------------------------------------------------------------------------------------------------
# MC-SF and MC-Benchmark
# --------------------------------------------------------------------------------------------------------

def _lookahead_fits(reqs, members, now, avg_batch_time, M):
    """The MC scripts' memory test for a tentative set of requests, done the plain way.

    For each request, projected end = now + (output + 1 - done) * avg_batch_time.  For each distinct
    projected end t, ascending: every request whose projected end is >= t - 1e-6 is alive and holds
    prompt + min(done + int((t - now) // avg_batch_time), output + 1); the test fails at the first t where
    the alive requests hold more than M."""
    ends = {}
    for rid in members:
        r = reqs[rid]
        steps_left = (r.output + 1) - r.done
        ends[rid] = now + steps_left * avg_batch_time
    for t in sorted(set(ends.values())):
        steps_ahead = int((t - now) // avg_batch_time)
        held = 0
        for rid in members:
            if ends[rid] >= t - _END_SLACK:
                r = reqs[rid]
                held += r.prompt + min(r.done + steps_ahead, r.output + 1)
        if held > M:
            return False
    return True


def _run_lookahead(run, M, avg_batch_time, prompt_order, stop_on_overflow, time_limit, max_batches):
    """Main loop of MC-SF.py / MC-Benchmark.py.

    Loop while an arrival is left or a batch runs.  The next event is the batch end when a batch runs and it
    is no later than the next arrival, otherwise one arrival.  After the event, if the machine is idle: all
    ready decode steps join the batch; then the waiting prompts, in ``prompt_order``, are added one at a
    time, each followed by the look-ahead test over running requests + this batch's requests; the first
    prompt failing it is put back and ends the admission.  A non-empty batch starts at once.  MC-SF only
    (``stop_on_overflow``): after every event, if started unfinished requests hold more than M, stop."""
    reqs = run.reqs
    while run.cursor < len(run.arrivals) or run.busy:
        upcoming = run.next_arrival_time()
        batch_first = run.busy and (upcoming is None or run.batch_end <= upcoming)
        event_time = run.batch_end if batch_first else upcoming
        if event_time > time_limit:  # choice 2: the MC scripts have no limit; truncate their run
            return run.result("time_limit")
        run.now = event_time
        if batch_first:
            run.finish_batch(bump_context_first=False)
        else:
            run.take_arrival()

        if not run.busy:
            jobs = []
            in_batch = set()
            for rid in sorted(run.ready):  # order inside a batch does not affect any result
                jobs.append((rid, reqs[rid].context, 0))
                in_batch.add(rid)
            run.ready.clear()
            members = set(run.running) | in_batch
            for rid in sorted(run.waiting, key=prompt_order):
                if rid in in_batch:
                    continue
                members.add(rid)
                if _lookahead_fits(reqs, members, run.now, avg_batch_time, M):
                    jobs.append((rid, 0, reqs[rid].prompt))
                    in_batch.add(rid)
                    run.waiting.discard(rid)
                else:
                    members.discard(rid)
                    break
            if jobs:
                if run.batches >= max_batches:
                    return run.result("max_batches")
                run.start_batch(jobs)

        # Started-and-unfinished requests are exactly the running set in the MC scripts.
        if stop_on_overflow and run.running_memory() > M:
            return run.result("memory_exceeded")
    return run.result("completed")


# --------------------------------------------------------------------------------------------------------
# alpha-greedy and alpha-beta
# --------------------------------------------------------------------------------------------------------

def _reset_all(run, M):
    """alpha-greedy's overflow handling: if running requests hold more than M, count one reset and send
    every running request back to the waiting set with its progress wiped."""
    if run.running_memory() > M:
        run.resets += 1
        for rid in sorted(run.running):
            run.send_back(rid)


def _reset_partially(run, M, beta, rng, time_limit):
    """alpha-beta's overflow handling.  While running requests hold more than M and the clock is before the
    limit: count one reset pass; draw one uniform per running request (ascending id) and send back those
    drawing below beta; if memory is now within M, stop; otherwise idle for one second: queue every arrival
    at or before now + 1 (and not after the limit), moving the clock to each, then set the clock to
    min(now + 1, limit) and stop if the limit is reached."""
    held = run.running_memory()
    while held > M and run.now < time_limit:
        run.resets += 1
        order = sorted(run.running)
        draws = rng.random(len(order))
        for rid, u in zip(order, draws):
            if u < beta:
                run.send_back(rid)
        held = run.running_memory()
        if held <= M:
            break
        resume = run.now + 1
        while True:
            upcoming = run.next_arrival_time()
            if upcoming is None or not (upcoming <= resume and upcoming <= time_limit):
                break
            run.now = upcoming
            run.take_arrival()
        run.now = min(resume, time_limit)
        if run.now >= time_limit:
            break


def _run_threshold(run, M, alpha, cap, on_overflow, time_limit, max_batches):
    """Main loop of alpha-greedy.py / alpha-beta.py.

    Each iteration: stop if the clock is at the limit; the next event time is the batch end if a batch runs,
    replaced by the next arrival only if strictly earlier; stop if there is none; move the clock there
    (never past the limit).  If a batch runs and ends now, credit it, else if the next arrival is now, queue
    it (one only); either way then check memory and apply ``on_overflow``.  If the machine is idle and the
    clock is before the limit, form a batch: ready decode steps in ascending id until the batch holds
    ``cap`` jobs; if running requests hold more than M * (1 - alpha) no prompt joins, else waiting prompts
    in arrival order join until the batch holds ``cap`` jobs; a non-empty batch starts, its end cut to the
    limit."""
    reqs = run.reqs
    by_arrival = lambda rid: (reqs[rid].arrival, rid)  # noqa: E731
    while True:
        if run.now >= time_limit:
            return run.result("time_limit")
        event_time = run.batch_end if run.busy else None
        upcoming = run.next_arrival_time()
        if upcoming is not None and (event_time is None or upcoming < event_time):
            event_time = upcoming
        if event_time is None:
            return run.result("completed")
        run.now = min(event_time, time_limit)

        if run.busy and run.now == run.batch_end:
            run.finish_batch(bump_context_first=True)
            on_overflow()
        elif upcoming is not None and run.now == upcoming:
            run.take_arrival()
            on_overflow()

        if not run.busy and run.now < time_limit:
            jobs = []
            in_batch = set()
            for rid in sorted(run.ready):  # choice 3: ascending id
                jobs.append((rid, reqs[rid].context, 0))
                in_batch.add(rid)
                run.ready.discard(rid)
                if cap is not None and len(jobs) >= cap:
                    break
            if not run.running_memory() > M * (1 - alpha):
                for rid in sorted(run.waiting, key=by_arrival):
                    if rid in in_batch:
                        continue
                    if cap is not None and len(jobs) >= cap:
                        break
                    jobs.append((rid, 0, reqs[rid].prompt))
                    in_batch.add(rid)
                    run.waiting.discard(rid)
            if jobs:
                if run.batches >= max_batches:
                    return run.result("max_batches")
                run.start_batch(jobs, end_cap=time_limit)


# --------------------------------------------------------------------------------------------------------

def simulate(algorithm: str, arrival, prompt, output, M: int, *, avg_batch_time: float = 0.05,
             alpha: float = None, beta: float = None, batch_cap: int = None, seed: int = 0,
             time_limit: float = float("inf"), max_batches: int = 10_000_000) -> dict:
    """Run one of the authors' four scripts over the given requests (request i has id i).

    ``algorithm``: "mcsf" (MC-SF.py), "mc_benchmark" (MC-Benchmark.py), "alpha_greedy" (alpha-greedy.py),
    "alpha_beta" (alpha-beta.py).  ``alpha`` is needed by the alpha scripts, ``beta`` by alpha-beta;
    ``batch_cap`` and ``seed`` only matter for the alpha scripts.  See the module docstring for semantics.
    Returns ``{"completion", "batches", "resets", "status"}``."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; expected one of {ALGORITHMS}")
    run = _Run(arrival, prompt, output)
    time_limit = float(time_limit)

    if algorithm in ("mcsf", "mc_benchmark"):
        if algorithm == "mcsf":
            order = lambda rid: (run.reqs[rid].output, run.reqs[rid].arrival, rid)  # noqa: E731
        else:
            order = lambda rid: (run.reqs[rid].arrival, rid)  # noqa: E731
        return _run_lookahead(run, M, avg_batch_time, order, stop_on_overflow=(algorithm == "mcsf"),
                              time_limit=time_limit, max_batches=max_batches)

    if alpha is None:
        raise ValueError(f"{algorithm} needs alpha")
    if algorithm == "alpha_greedy":
        on_overflow = lambda: _reset_all(run, M)  # noqa: E731
    else:
        if beta is None:
            raise ValueError("alpha_beta needs beta")
        if beta <= 0 and math.isinf(time_limit):
            raise ValueError("alpha_beta with beta <= 0 and no time limit never leaves its reset loop")
        rng = np.random.default_rng(seed)
        on_overflow = lambda: _reset_partially(run, M, beta, rng, time_limit)  # noqa: E731
    return _run_threshold(run, M, alpha, batch_cap, on_overflow, time_limit, max_batches)
