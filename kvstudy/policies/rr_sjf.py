"""RR-SJF (Gogineni et al.) and the baselines it was measured against, as the authors' vLLM fork runs them
(``sastec17/585_vllm``, ``vllm/core/scheduler.py``; spec ../shared/reference/specs/rr_sjf_cacheopt.md, A2-A3).

All four are vLLM V0's ``_schedule_default`` without chunked prefill (a step runs prefills or decodes):

1. Admission: walk the waiting queue *in its current order* and start requests while ``can_allocate``,
   the token budget and ``max_num_seqs`` allow; stop at the first that does not fit.
2. Only in a step that admitted nothing, the policy routine runs (``fcfs`` has none):
   * ``rr_sjf`` (``_schedule_rr_reverse``, A2.2): sort waiting by (longest waiting first, shortest
     predicted first) and running by (predicted, arrival); take the head h; while h does not fit
     (``can_allocate`` OK and the budget's seq cap and tokens), preempt the *last* eligible running request
     (largest prediction; eligible = running for at least ``steps_before_preemption`` steps) and append it to
     the *back* of waiting; h goes back to the front: it starts in a later step's admission.
   * ``rr`` (``_schedule_round_robin``, A2.3): the same with both queues left in their order (the victim is
     the latest admitted eligible request; the client sends no priority).
   * ``sjf`` (vLLM's ``priority`` policy, ``_schedule_priority_preemption``): sort running by (prediction,
     arrival), whether or not anything waits; while the last running request (the largest key) has a larger key
     than h and h does not fit, preempt it (no minimum-steps protection) and put it at the front of waiting;
     then waiting is sorted by (prediction, arrival). Because running stays sorted, the decode walk's victim
     (step 3) is the longest predicted request.
3. Decode every running request in running order; when one cannot get a block, preempt the tail (victims to
   the front of waiting), as vLLM.

Counters (A8.1, A8.3): waiting time w and the quantum k are counted in scheduler steps, as the fork counts
them: at the end of every step waiting requests get w + 1 and k = 0, running ones w = 0 and k + 1 (a
prefill-only step counts). ``quantum_unit: tokens`` counts k in tokens produced since the request last
started instead, for a reader who takes the paper's "tokens" literally.

Swap (A8.9: the fork's swap mode crashed, so the paper has no swap results). With ``preemption_mode: swap``
kvstudy swaps the victims out and keeps them *in this policy's waiting order*, where recompute victims
would be; a swapped request is brought back (swap in) when the admission walk reaches it. vLLM V0's own
rule (swapped requests return before any admission, with no admission while any is out) would undo every
round-robin preemption at the next step and never admit the head the preemption made room for.

Each policy keeps its own waiting order and running list (the engine's queue is vLLM's FCFS order). The
predicted lengths are the predictor's; only the engine knows the true ones.
"""
from __future__ import annotations

from typing import List

from kvstudy.config.validate import check_group
from kvstudy.policies.request_states import IN_FLIGHT, RUNNING, SWAPPED, WAITING
from kvstudy.memory.base import LATER, NEVER, OK
from kvstudy.policies.queue_order import QueueOrder
from kvstudy.policies.step import RECOMPUTE, Decision, StepView
from kvstudy.policies.vllm import VLLM, _Plan


class QueuedVLLM(VLLM):
    """vLLM V0 ``_schedule_default`` with the policy's own queues and a routine in steps that admit nothing.
    As a policy of its own it is vLLM's ``fcfs`` (no routine)."""

    name = "fcfs"

    own_queue_order = True  # ``order`` below; the engine keeps its queue as a set (StepPolicy.own_queue_order)

    def __init__(self, steps_before_preemption: int = 5, quantum_unit: str = "steps",
                 preemption_mode: str = RECOMPUTE, max_num_seqs: int = 256, max_num_batched_tokens=None,
                 name: str = None) -> None:
        # its own keys against kvstudy/config/schema.py (RoundRobin, RRSJF and SJF take the same); VLLM checks the rest
        check_group("policy", {"_target_": "kvstudy.policies.rr_sjf.QueuedVLLM",
                               "steps_before_preemption": steps_before_preemption, "quantum_unit": quantum_unit})
        super().__init__(preemption_mode=preemption_mode, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens, running_order="admission",
                         name=name or type(self).name)
        self.quantum = steps_before_preemption
        self.quantum_unit = quantum_unit

    # --- per-run state ---------------------------------------------------------------------------------------
    def reset(self, seed: int) -> None:
        super().reset(seed)
        # waiting (and, under swap, swapped-out) requests in this policy's order: front, sorted middle and back, so
        # admissions, victims and the SJF sorts cost O(log n) at any queue length (issues 47 and 59)
        self.order = QueueOrder()
        self.run: List[int] = []  # running requests in this policy's order
        self.seen = 0  # arrivals (engine indices, in arrival order) already placed in ``order``
        self.wait_since = {}  # step whose end first counted request i as waiting (w = step - wait_since)
        self.run_since = {}  # step in which request i last started running (k = step - run_since)
        self.gen_at_start = {}  # its tokens then (quantum_unit: tokens)

    def waiting_steps(self, view: StepView, i: int) -> int:
        return view.step - self.wait_since[i]

    def running_for(self, view: StepView, i: int) -> int:
        if self.quantum_unit == "tokens":
            return view.generated[i] - self.gen_at_start[i]
        return view.step - self.run_since[i]

    def key(self, view: StepView, i: int):
        """vLLM's ``_get_priority``: (priority, arrival time); priority = predicted output tokens."""
        return view.predicted[i], view.arrival[i], i

    def _sync(self, view: StepView) -> None:
        """Arrivals join the back of the queue; requests that left it (done, or rejected by the engine) go."""
        state = view.state
        for i in view.joined:  # handed off to this replica (disaggregation): they join the back, as arrivals
            self.order.append(i)
            self.wait_since[i] = view.step
        for i in range(self.seen, view.num_arrived):
            if state[i] == WAITING:
                self.order.append(i)
                self.wait_since[i] = view.step
        self.seen = view.num_arrived
        expected = len(view.waiting) + (len(view.swapped) if self.preemption_mode != RECOMPUTE else 0)
        if len(self.order) != expected:
            self.order.keep(lambda i: state[i] == WAITING or state[i] == SWAPPED)
        if len(self.run) != len(view.running) + view.in_flight:  # in flight (a pipeline's batch): kept in the list
            self.run = [i for i in self.run if state[i] == RUNNING or state[i] == IN_FLIGHT]

    # --- one step --------------------------------------------------------------------------------------------
    def _admit(self, view: StepView, plan: _Plan, budget: int) -> int:
        """vLLM's admission walk over this policy's waiting order; a swapped-out request comes back in its turn.
        Returns how many of the queue's front it looked at (what it started is among them)."""
        mem = view.memory
        state = view.state
        walked, micro = 0, self._micro(view)
        for i in self.order:
            walked += 1
            if plan.num_seqs + 1 > self.max_num_seqs:
                break
            if micro is not None and len(plan.d.prefill) + len(plan.d.swap_in) >= micro:
                break
            if state[i] == SWAPPED:
                status = mem.can_swap_in(i, free=plan.free)
                if status == LATER:
                    break
                if status == NEVER:
                    continue
                plan.free -= mem.swap_in_blocks(i, view.prompt[i] + view.waiting_generated[i])
                plan.num_seqs += 1
                plan.d.swap_in.append(i)
                continue
            blocks = view.prefill_blocks(i)
            status = mem.can_allocate(blocks, free=plan.free)
            if status == LATER:
                break
            if status == NEVER:
                continue
            tokens = view.prompt[i] + view.waiting_generated[i]
            if plan.tokens + tokens > budget:
                break
            plan.start_prefill(i, blocks, tokens)
        return walked

    def fits(self, view: StepView, plan: _Plan, h: int, budget: int) -> bool:
        """``can_allocate(h) == OK and budget.can_schedule(len(h.tokens), 1)`` as the routine asks it."""
        mem = view.memory
        if view.state[h] == SWAPPED:
            return mem.can_swap_in(h, free=plan.free) == OK and plan.num_seqs + 1 <= self.max_num_seqs
        return (mem.can_allocate(view.prefill_blocks(h), free=plan.free) == OK
                and plan.num_seqs + 1 <= self.max_num_seqs
                and plan.tokens + view.prompt[h] + view.waiting_generated[h] <= budget)

    def _victim(self, view: StepView, plan: _Plan, v: int) -> None:
        self._preempt(view, plan, v)
        self.run.remove(v)

    def routine(self, view: StepView, plan: _Plan, budget: int) -> None:
        """Steps that admitted nothing: ``fcfs`` has no routine."""

    def step(self, view: StepView) -> Decision:
        self._sync(view)
        flying = None
        if view.in_flight:  # a pipeline's batches in flight: out of this step's list, back at its end (as the engine)
            state = view.state
            flying = [i for i in self.run if state[i] == IN_FLIGHT]
            self.run = [i for i in self.run if state[i] != IN_FLIGHT]
        budget = self.token_budget(view)
        plan = _Plan(view)
        walked = self._admit(view, plan, budget) if self.order else 0
        if not plan.d.prefill and not plan.d.swap_in:
            self.routine(view, plan, budget)
            routine_victims = len(plan.d.preempt)
            self._walk_any(view, plan, list(self.run), skip_prefilling=False)
            walk_victims = [v for v, _ in plan.d.preempt[routine_victims:]]
            for v in walk_victims:  # vLLM's waiting.extendleft(preempted): the last one ends up first
                self.run.remove(v)
                self.order.appendleft(v)
                self.wait_since[v] = view.step
        self._started(view, plan, walked)
        if flying:
            self.run.extend(flying)
        return plan.d

    def _started(self, view: StepView, plan: _Plan, walked: int) -> None:
        """Requests this decision starts (prefill or swap in) leave the queue and join the running list; the admission
        walk started them from the first ``walked`` of the queue (the routine starts nobody)."""
        started = [i for i, _ in plan.d.prefill] + list(plan.d.swap_in)
        if not started:
            return
        self.order.take(walked, started)
        for i in started:
            self.run_since[i] = view.step
            self.gen_at_start[i] = view.waiting_generated[i]
        self.run.extend(started)


class RoundRobin(QueuedVLLM):
    """The paper's RR (``round_robin``): FIFO queue, victims to the back, quantum ``steps_before_preemption``."""

    name = "rr"

    def sorted_queues(self, view: StepView):
        """(waiting, running) in this policy's order: RR's waiting queue is its own, changed in place (the routine
        takes its head and puts it back, victims join the back: O(1) at any queue length)."""
        return self.order, list(self.run)

    def routine(self, view: StepView, plan: _Plan, budget: int) -> None:
        if not self.order:
            return
        W, R = self.sorted_queues(view)
        self.run = R
        h = W.popleft()
        eligible = [r for r in R if self.running_for(view, r) >= self.quantum]
        while eligible:
            if self.fits(view, plan, h, budget):
                break
            v = eligible.pop()
            self._victim(view, plan, v)
            W.append(v)
            self.wait_since[v] = view.step
        W.appendleft(h)
        self.order = W


class RRSJF(RoundRobin):
    """RR-SJF (Alg. 1 as ``_schedule_rr_reverse`` runs it): waiting by (-waiting steps, predicted),
    running by (predicted, arrival); the victim is the eligible request with the longest prediction."""

    name = "rr_sjf"

    def sorted_queues(self, view: StepView):
        since, pred = self.wait_since, view.predicted
        # -w, then p, stable otherwise: w = step - wait_since, and wait_since is fixed while a request waits
        self.order.sort(lambda i: (since[i], pred[i]))
        R = sorted(self.run, key=lambda i: self.key(view, i))
        return self.order, R


class SJF(QueuedVLLM):
    """vLLM's ``priority`` policy (the paper's SJF): preempts on priority inversion, no quantum."""

    name = "sjf"

    def routine(self, view: StepView, plan: _Plan, budget: int) -> None:
        # vLLM sorts the running list by priority in every step without admissions, before it looks at the
        # waiting queue: so the decode walk's victim is the lowest-priority request even when nothing waits
        key = lambda i: self.key(view, i)  # noqa: E731
        self.run = sorted(self.run, key=key)
        if not self.order:
            return
        W = self.order
        h = W.first()
        while self.run and key(self.run[-1]) > key(h) and not self.fits(view, plan, h, budget):
            v = self.run[-1]
            self._victim(view, plan, v)
            W.appendleft(v)  # vLLM inserts it at the front; the sort below places it (the key is a total order)
            self.wait_since[v] = view.step
        W.sort(key)
