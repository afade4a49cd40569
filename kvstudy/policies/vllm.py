"""vLLM V0's scheduler (``vllm/core/scheduler.py``, ``block_manager.py``, v0.6) and Sarathi-Serve's
(``sarathi/core/scheduler/sarathi_scheduler.py``; Agrawal et al., OSDI 2024) as step policies.

``vllm`` (not chunked; ``_schedule_default``):

1. If nothing is swapped out, admit waiting requests in queue order (FCFS) while the KV cache can hold
   their prompt above the watermark, the batch stays within ``max_num_batched_tokens`` (default
   max(max_model_len, 2048)) and at most ``max_num_seqs`` requests run (default 256); stop at the first
   that does not fit. Such a step is prefill only.
2. Otherwise decode every running request in running order. When one cannot get the block it needs,
   preempt the last of the running list (the latest admitted), and if none is left behind it, the
   request itself. Recompute victims go back to the front of the waiting queue; swapped ones wait on the
   host and come back (step 3) before any new admission.
3. If step 2 preempted nothing, swap requests back in order while ``can_swap_in`` allows.

``sarathi`` (decode-first chunked prefill under a token budget, ``chunk_size`` default 512): decode every
running request that has finished its prefill (preempting as above), then continue running prefills in
chunks, then bring swapped requests back, then admit new requests with a chunk each while the budget,
``can_allocate`` and ``max_num_seqs`` allow. Prefills and decodes share an iteration.

``preemption_mode``: ``recompute`` (the default, as kvstudy's issue asks, and vLLM's for single
sequences) or ``swap``; a request still in its prefill is always recomputed (vLLM swaps decodes only).
``running_order``: ``admission`` (vLLM: the running list in the order requests were admitted) or
``arrival`` (Vidur's replica schedulers sort it by arrival time before each step).

Under pipeline parallelism (kvstudy/engine/pipeline.py) a step forms the batch of one pipeline slot from the requests
not in flight; ``max_num_seqs`` caps the requests holding KV, in flight or not (Vidur's ``batch_size_cap`` against
its allocation map), and ``max_num_seqs // stages`` the requests of one batch (Vidur's ``_max_micro_batch_size``):
the decodes are then the first that many of the running list (Vidur sorts it by arrival: ``running_order=arrival``),
the rest wait for the next batch, neither decoded nor preempted.

``waiting_order`` (issue 36): ``fcfs`` (vLLM), or SGLang's cache-aware ``lpm`` / ``dfs_weight``
(kvstudy/policies/cache_orders.py) with memory.prefix_caching=true: the queue is walked in that order, admission
against memory unchanged (a request that does not fit still stops the walk, as in both vLLM and SGLang).
"""
from __future__ import annotations

from typing import List, Optional

from kvstudy.config.validate import check_group
from kvstudy.memory.base import LATER, NEVER
from kvstudy.policies.cache_orders import LPM_MAX_QUEUE, ordered
from kvstudy.policies.step import RECOMPUTE, Decision, StepPolicy, StepView


#: The decision of a decode-only step without preemption (shared: the engine never changes a decision).
DECODE_ALL = Decision(decode_all=True)


def _spare(view: StepView) -> int:
    """Blocks that must stay free after every growing request took its own for the fast paths to be exact: one
    under ``memory.decode_block_check=vllm`` (the last decode's turn still needs a free block), else none."""
    return 1 if view.memory.decode_block_check == "vllm" else 0


class _Plan:
    """A policy's running tally of one step: free blocks, batched tokens, running count."""

    __slots__ = ("free", "tokens", "num_seqs", "d")

    def __init__(self, view: StepView) -> None:
        self.free = view.memory.free
        self.tokens = 0
        self.num_seqs = len(view.running) + view.in_flight  # under pipeline parallelism in-flight requests hold KV too
        self.d = Decision()

    def start_prefill(self, i: int, blocks: int, chunk: int) -> None:
        """Request i starts (or restarts) its prefill with ``chunk`` tokens, taking ``blocks`` free blocks."""
        self.free -= blocks
        self.num_seqs += 1
        self.tokens += chunk
        self.d.prefill.append((i, chunk))


class VLLM(StepPolicy):
    name = "vllm"

    def __init__(self, preemption_mode: str = RECOMPUTE, max_num_seqs: int = 256,
                 max_num_batched_tokens: Optional[int] = None, running_order: str = "admission",
                 name: str = "vllm", waiting_order: str = "fcfs") -> None:
        # every value against its declaration in kvstudy/config/schema.py (the subclasses' shared keys too)
        check_group("policy", {"_target_": "kvstudy.policies.vllm.VLLM", "preemption_mode": preemption_mode,
                               "max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
                               "running_order": running_order, "waiting_order": waiting_order})
        self.waiting_order = waiting_order
        self.indexed_waiting = waiting_order == "dfs_weight"  # the engine indexes its queue (cache_orders.py)
        self.preemption_mode = preemption_mode
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.running_order = running_order
        self.name = name

    def token_budget(self, view: StepView) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return max(view.max_model_len, 2048)

    # --- pieces shared with Sarathi -----------------------------------------------------------------
    def _micro(self, view: StepView) -> Optional[int]:
        """The most requests one batch may hold under pipeline parallelism (module docstring); None without it."""
        return max(1, self.max_num_seqs // view.stages) if view.stages > 1 else None

    def _one_batch(self, view: StepView) -> bool:
        """Every running request fits one batch (always without pipeline parallelism; with it, ``_micro``)."""
        return view.stages == 1 or len(view.running) - len(view.prefilling) <= self._micro(view)

    def _running(self, view: StepView) -> List[int]:
        if self.running_order == "arrival":  # by (arrival, index): the engine's indices are in arrival order already
            return sorted(view.running)
        return list(view.running)

    def _preempt(self, view: StepView, plan: _Plan, i: int) -> None:
        mode = self.preemption_mode
        if view.in_prefill(i):
            mode = RECOMPUTE
        plan.d.preempt.append((i, mode))
        plan.free += view.memory.freed_by(i)  # with prefix caching: not the blocks it shares
        plan.num_seqs -= 1

    def _schedule_decodes(self, view: StepView, plan: _Plan, skip_prefilling: bool) -> List[int]:
        """Decode the running list front to back, preempting from its back when a block is missing; returns
        the running requests still in prefill that were passed over (Sarathi continues them after).

        When the free blocks cover every request that needs one (``view.growing``), the walk would preempt
        nobody: the decision is then ``decode_all`` without visiting each request (under
        ``memory.decode_block_check=vllm`` one more block must stay free, so every turn sees one)."""
        if not self._one_batch(view):
            return self._walk_micro(view, plan, self._running(view), skip_prefilling, self._micro(view))
        if len(view.growing) + _spare(view) <= plan.free:
            plan.free -= len(view.growing)
            decoding = len(view.running) - len(view.prefilling)
            plan.tokens += decoding
            plan.d.decode_all = decoding > 0
            if not view.prefilling:
                return []
            return [i for i in self._running(view) if i in view.prefilling]
        return self._walk(view, plan, self._running(view), skip_prefilling)

    def _walk(self, view: StepView, plan: _Plan, queue: List[int], skip_prefilling: bool) -> List[int]:
        """vLLM's ``_schedule_running`` over ``queue`` (the running list in this policy's order): front to back,
        preempting from the back when a request cannot get its block; every request not preempted decodes."""
        prefilling, growing, decoded, spare = [], view.growing, 0, _spare(view)
        # queue[lo:hi] is still to walk; victims come from its back. A request neither growing nor skipped needs no
        # block: while ``spare`` blocks are free it just decodes, so the walk jumps to the next request that needs
        # a look (the same decisions as visiting each; this runs whenever a block is short)
        in_prefill = view.in_prefill
        look = [k for k, i in enumerate(queue) if i in growing or (skip_prefilling and in_prefill(i))]
        lo, hi, next_look = 0, len(queue), 0
        while lo < hi:
            if plan.free >= spare:
                while next_look < len(look) and look[next_look] < lo:
                    next_look += 1
                to = min(look[next_look], hi) if next_look < len(look) else hi
                decoded += to - lo
                lo = to
                if lo >= hi:
                    break
            i = queue[lo]
            lo += 1
            if skip_prefilling and in_prefill(i):
                prefilling.append(i)
                continue
            hi, decodes = self._turn(view, plan, queue, i, lo, hi, spare)
            decoded += decodes
        # every request the walk did not preempt decodes: that is decode_all after the preemptions
        plan.tokens += decoded
        plan.d.decode_all = decoded > 0
        return prefilling

    def _turn(self, view: StepView, plan: _Plan, queue: List[int], i: int, lo: int, hi: int, spare: int):
        """Request i's decode turn in a walk, ``queue[lo:hi]`` behind it. vLLM's can_append_slots (and Vidur) ask for
        ``spare`` free blocks at every decode's turn and take one only if its context grows into it (``view.growing``);
        while they are missing the back of the list is preempted, and i itself when nobody is left behind it.
        Returns (the new ``hi``, whether i decodes)."""
        need = view.decode_blocks_needed(i) if i in view.growing else 0
        while plan.free < max(need, spare):
            if lo < hi:
                hi -= 1
                self._preempt(view, plan, queue[hi])
            else:
                self._preempt(view, plan, i)
                return hi, False
        plan.free -= need
        return hi, True

    def _walk_any(self, view: StepView, plan: _Plan, queue: List[int], skip_prefilling: bool) -> List[int]:
        """``_walk``, or ``_walk_micro`` when a pipeline's batch cannot hold every request of ``queue``."""
        micro = self._micro(view)
        if micro is not None and len(queue) > micro:
            return self._walk_micro(view, plan, queue, skip_prefilling, micro)
        return self._walk(view, plan, queue, skip_prefilling)

    def _walk_micro(self, view: StepView, plan: _Plan, queue: List[int], skip_prefilling: bool, micro: int) -> List[int]:
        """``_walk`` for one batch of a pipeline (Vidur's vLLM and Sarathi ``_get_next_batch``): front to back until
        the batch holds ``micro`` requests, preempting from the back of the whole list when a request cannot get its
        block; the decodes are listed (the requests past the cut neither decode nor are preempted). Returns the
        requests still in prefill that were passed over before the cut."""
        prefilling, spare, in_prefill = [], _spare(view), view.in_prefill
        decode = plan.d.decode
        lo, hi = 0, len(queue)
        while lo < hi and len(decode) + len(plan.d.prefill) < micro:
            i = queue[lo]
            lo += 1
            if in_prefill(i):
                if skip_prefilling:
                    prefilling.append(i)
                continue
            hi, decodes = self._turn(view, plan, queue, i, lo, hi, spare)
            if decodes:
                decode.append(i)
        plan.tokens += len(decode)
        return prefilling

    def _schedule_swapped(self, view: StepView, plan: _Plan, budget: int) -> None:
        for i in view.swapped:
            status = view.memory.can_swap_in(i, free=plan.free)
            if status == LATER or plan.num_seqs + 1 > self.max_num_seqs or plan.tokens + 1 > budget:
                break
            if status == NEVER:
                continue
            plan.free -= view.memory.swap_in_blocks(i, view.prompt[i] + view.waiting_generated[i])
            plan.num_seqs += 1
            plan.tokens += 1
            plan.d.swap_in.append(i)
            if not plan.d.decode_all:
                plan.d.decode.append(i)

    def _head_fits(self, view: StepView) -> bool:
        """False when the head of the waiting queue cannot start now (LATER, or the seq cap): under load that
        is most steps, and ``_schedule_prefills`` would stop at once. A cache-aware order asks whether the
        smallest waiting request could start (its head is known only once the order is computed), unless the order
        is FCFS anyway (LPM above 128 waiting requests)."""
        if len(view.running) + view.in_flight >= self.max_num_seqs:
            return False
        mem = view.memory
        if self.waiting_order != "fcfs" and not (self.waiting_order == "lpm" and len(view.waiting) > LPM_MAX_QUEUE):
            waiting = view.waiting
            smallest = waiting.smallest() if hasattr(waiting, "smallest") else min(  # an engine's IndexedQueue
                view.prompt[i] + view.waiting_generated[i] for i in waiting)
            blocks = -(-smallest // mem.block_size)
            return mem.free - blocks >= mem.watermark_blocks or mem.num_blocks - blocks < mem.watermark_blocks
        i = view.waiting[0]
        blocks = -(-(view.prompt[i] + view.waiting_generated[i]) // mem.block_size)
        return mem.free - blocks >= mem.watermark_blocks or mem.num_blocks - blocks < mem.watermark_blocks

    def _schedule_prefills(self, view: StepView, plan: _Plan, budget: int, chunked: bool) -> None:
        mem = view.memory
        bs, wm, total = mem.block_size, mem.watermark_blocks, mem.num_blocks
        prompt, generated = view.prompt, view.waiting_generated
        queue = view.waiting if self.waiting_order == "fcfs" else ordered(view, self.waiting_order)
        micro = self._micro(view)
        for i in queue:
            if plan.num_seqs + 1 > self.max_num_seqs:
                break
            if micro is not None and len(plan.d.prefill) + len(plan.d.decode) + (
                    len(view.running) - len(view.prefilling) if plan.d.decode_all else 0) >= micro:
                break
            blocks = -(-(prompt[i] + generated[i]) // bs)  # view.prefill_blocks(i), inlined: it runs every step
            if total - blocks < wm:  # can_allocate NEVER: the engine rejects these up front; never reached
                continue
            if plan.free - blocks < wm:  # can_allocate LATER
                break
            remaining = view.prefill_target[i] - view.prefilled[i]
            chunk = min(remaining, budget - plan.tokens) if chunked else remaining
            if chunk <= 0 or plan.tokens + chunk > budget:
                break
            plan.start_prefill(i, blocks, chunk)

    def steady_spare(self, view: StepView) -> Optional[int]:
        """Both schedules decode every running request, preempting nobody, while the growing requests find their
        blocks with ``_spare`` to spare; with nothing swapped a waiting request that could not start cannot start
        later either while free blocks only fall and the running count stays (``_head_fits`` and
        ``_schedule_prefills`` are monotone in ``free``): the engine may advance such steps in a run (issue 47). The
        promise covers vLLM's and Sarathi's own ``step``; a subclass that changes ``step`` makes its own."""
        if type(self).step not in (VLLM.step, Sarathi.step):
            return None
        return _spare(view)

    # --- vLLM V0 _schedule_default --------------------------------------------------------------------
    def step(self, view: StepView) -> Decision:
        budget = self.token_budget(view)
        if view.waiting and not view.swapped and self._head_fits(view):
            plan = _Plan(view)
            self._schedule_prefills(view, plan, budget, chunked=False)
            if plan.d.prefill:
                return plan.d
        if (not view.swapped and view.running and not view.prefilling
                and len(view.growing) + _spare(view) <= view.memory.free and self._one_batch(view)):
            return DECODE_ALL  # the common step: every running request decodes and nobody is preempted
        plan = _Plan(view)
        self._schedule_decodes(view, plan, skip_prefilling=False)
        if view.swapped and not plan.d.preempt:
            self._schedule_swapped(view, plan, budget)
        return plan.d


class Sarathi(VLLM):
    name = "sarathi"

    def __init__(self, chunk_size: int = 512, preemption_mode: str = RECOMPUTE, max_num_seqs: int = 256,
                 running_order: str = "admission", name: str = "sarathi", waiting_order: str = "fcfs") -> None:
        # named as chunk_size before VLLM reads it as its max_num_batched_tokens
        check_group("policy", {"_target_": "kvstudy.policies.vllm.Sarathi", "chunk_size": chunk_size})
        super().__init__(preemption_mode=preemption_mode, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=chunk_size, running_order=running_order, name=name,
                         waiting_order=waiting_order)
        self.chunk_size = chunk_size

    def step(self, view: StepView) -> Decision:
        if (view.running and not view.prefilling and not view.swapped
                and len(view.growing) + _spare(view) <= view.memory.free
                and not (view.waiting and self._head_fits(view)) and self._one_batch(view)):
            return DECODE_ALL  # only decodes, nobody preempted, no prompt can start: the common step
        plan = _Plan(view)
        budget = self.chunk_size
        prefilling = self._schedule_decodes(view, plan, skip_prefilling=True)
        for i in prefilling:  # victims come from behind the decode cursor, so none of these was preempted
            chunk = min(view.prefill_target[i] - view.prefilled[i], budget - plan.tokens)
            if chunk > 0:
                plan.tokens += chunk
                plan.d.prefill.append((i, chunk))
        if not plan.d.preempt:
            self._schedule_swapped(view, plan, budget)
        if len(plan.d.swap_in) == len(view.swapped):  # swapped requests come back before new admissions
            self._schedule_prefills(view, plan, budget, chunked=True)
        return plan.d
