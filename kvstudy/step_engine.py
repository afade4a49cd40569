"""kvstudy's preemptive iteration loop (``memory=paged``): paged KV blocks, recompute and swap, chunked
prefill. The engine owns time and KV accounting; the policy decides (``kvstudy/policies/step.py``).

One iteration:

1. Requests that have arrived by the clock join the waiting queue.
2. The policy returns a :class:`~kvstudy.policies.step.Decision`; ``_apply`` validates all of it before
   changing anything, then carries it out in the order preempt, swap in, prefill, decode, through the
   memory model (:class:`~kvstudy.memory.paged.PagedMemory`): a recompute victim drops its KV and goes
   to the front of the waiting queue (vLLM's ``extendleft``), a swap victim's blocks move to host space
   (or, when that is full, it is recomputed instead and ``swap_fallbacks`` counts it).
3. Its time is Vidur's prediction for that exact batch (each prefill chunk with the context before it,
   each decode with its cached context; a recompute is a prefill of prompt + generated tokens) plus the
   swap model's seconds for the blocks moved (or the longer of the two when ``swap.overlap``).
4. Tokens are stamped with the iteration's end. A prefill's last chunk produces a request's next token;
   a decode produces one. A request of output o is done after its o-th token (vLLM's convention: first
   token from the prefill, o - 1 decodes), and its blocks are freed.

Rejected up front, each with ``reject_reason``: a request whose prompt + output needs more blocks than
the cache has (it would preempt itself forever), or whose prompt vLLM's ``can_allocate`` calls NEVER
(fewer blocks than the watermark leaves); and, when preempted, a request whose recompute (prompt + generated
tokens) can_allocate calls NEVER (vLLM ignores such a prompt). A run in which ``stall_limit`` iterations in a row produce no
token ends ``no_progress``; a policy that runs nothing on an idle engine with nothing left to arrive
ends ``stalled``.
"""
from __future__ import annotations

import math
from time import perf_counter
from collections import deque

import numpy as np
import pandas as pd

from kvstudy.decode_clock import DecodeClock
from kvstudy.latency.models import VidurLatency
from kvstudy.engine import (DONE, FUTURE, REJECTED, RUNNING, SWAPPED, WAITING, EngineResult, PolicyError,
                            interrupted_message)
from kvstudy.memory.paged import NEVER, PagedMemory
from kvstudy.policies.admission import Admission
from kvstudy.policies.step import RECOMPUTE, SWAP, Decision, StepPolicy, StepView
from kvstudy.swap_models import SwapModel, kv_bytes_per_gpu
from kvstudy.workloads.requests import Requests

STATE_NAMES = np.array(["future", "waiting", "running", "done", "rejected", "swapped"])
ITERATION_COLUMNS = ("start", "duration", "batch_size", "prefill_tokens", "decode_tokens", "kv_tokens_in_use",
                     "capacity", "overflow", "cleared", "blocks_used", "blocks_reserved", "blocks_free",
                     "host_blocks", "swap_seconds", "chunk_tokens", "preempted_recompute", "preempted_swap",
                     "swapped_in")
ITERATION_TYPES = (float, float, np.int64, np.int64, np.int64, np.int64, np.int64, bool, np.int64, np.int64, np.int64,
                   np.int64, np.int64, float, np.int64, np.int64, np.int64, np.int64)


class _Generated:
    """``view.generated[i]``: tokens request i has produced, read through the decode clock."""

    def __init__(self, clock: DecodeClock) -> None:
        self._clock = clock

    def __getitem__(self, i: int) -> int:
        return self._clock.generated(i)


class StepEngine:
    def __init__(self, requests: Requests, predicted: np.ndarray, policy: StepPolicy, latency,
                 memory: PagedMemory, swap: SwapModel, arch, hardware, stall_limit: int = 100,
                 max_iterations: int = 50_000_000, progress: bool = False, direction=None,
                 overflow_cost: str = "batch") -> None:
        if not getattr(policy, "preemptive", False):  # order + admit: the engine adapts it (reset by the caller)
            policy = Admission(policy)
        if overflow_cost not in ("batch", "free"):
            raise PolicyError(f"engine.overflow_cost={overflow_cost!r}: allowed on memory=paged: batch, free")
        self.overflow_cost = overflow_cost
        self.r, self.policy, self.latency, self.memory, self.swap = requests, policy, latency, memory, swap
        self.pred = np.asarray(predicted, dtype=np.int64)
        self.direction = None if direction is None else np.asarray(direction, dtype=np.int8).tolist()
        self.arch, self.hw = arch, hardware
        self.max_model_len = int(arch.max_model_len)
        self.stall_limit, self.max_iterations, self.progress = stall_limit, max_iterations, progress

    # --- the policy's decision --------------------------------------------------------------------------
    def _check(self, d: Decision, name: str) -> None:
        """Every id named once, in the state its list needs, in a mode the memory model can do; the blocks
        the decision needs fit. Raises PolicyError naming the first problem; changes nothing."""
        if not isinstance(d, Decision):
            raise PolicyError(f"policy '{name}' returned {type(d).__name__}, not a Decision")
        state, mem = self.state, self.memory
        if not (d.preempt or d.swap_in or d.prefill or d.decode or d.reserve or d.lend):  # the common decode-only step
            if d.decode_all and mem.used + len(self.growing) > mem.num_blocks:
                raise PolicyError(f"policy '{name}' decodes every running request, which needs "
                                  f"{mem.used + len(self.growing)} KV blocks, more than the {mem.num_blocks} the "
                                  f"cache has")
            return
        seen = set()

        def once(i, what):
            if not isinstance(i, (int, np.integer)) or not 0 <= i < len(state):
                raise PolicyError(f"policy '{name}' names request {i!r} in {what}: not a request of this run")
            if i in seen:
                raise PolicyError(f"policy '{name}' names request {self.id_list[i]} twice in one decision")
            seen.add(i)

        for item in d.preempt:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise PolicyError(f"policy '{name}': preempt entries are (request, mode), got {item!r}")
            i, mode = item
            once(i, "preempt")
            if state[i] != RUNNING:
                raise PolicyError(f"policy '{name}' preempts request {self.id_list[i]}, which is not running "
                                  f"(state {STATE_NAMES[state[i]]})")
            if mode not in mem.modes:
                raise PolicyError(f"policy '{name}': preemption mode {mode!r} is not one memory="
                                  f"{mem.name} can do (allowed: {', '.join(mem.modes)})")
            if mode == SWAP and self.prefilled[i] < self.target[i]:
                raise PolicyError(f"policy '{name}' swaps request {self.id_list[i]} in the middle of its prefill; "
                                  f"only a decoding request can be swapped (recompute it)")
        preempted = {i for i, _ in d.preempt}
        for i in d.swap_in:
            once(i, "swap_in")
            if state[i] != SWAPPED:
                raise PolicyError(f"policy '{name}' swaps in request {self.id_list[i]}, which is not swapped out "
                                  f"(state {STATE_NAMES[state[i]]})")
        for item in d.prefill:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise PolicyError(f"policy '{name}': prefill entries are (request, tokens), got {item!r}")
            i, chunk = item
            once(i, "prefill")
            remaining = self.target[i] - self.prefilled[i]
            if state[i] == WAITING:
                remaining = self.s_list[i] + self.generated[i]
            elif state[i] != RUNNING or i in preempted or remaining == 0:
                raise PolicyError(f"policy '{name}' prefills request {self.id_list[i]}, which is neither waiting nor "
                                  f"running with its prefill unfinished (state {STATE_NAMES[state[i]]})")
            if not isinstance(chunk, (int, np.integer)) or not 0 < chunk <= remaining:
                raise PolicyError(f"policy '{name}' gives request {self.id_list[i]} a prefill chunk of {chunk!r} "
                                  f"tokens; allowed 1..{remaining}")
        swapping_in = set(d.swap_in)
        if d.decode_all and d.decode:
            raise PolicyError(f"policy '{name}': a decision has decode_all or a decode list, not both")
        for i in d.decode:
            if i not in swapping_in:  # a request swapped back in may decode in the same iteration
                once(i, "decode")
            elif d.decode.count(i) > 1:
                raise PolicyError(f"policy '{name}' names request {self.id_list[i]} twice in decode")
            ok = (state[i] == RUNNING and i not in preempted) or i in swapping_in
            if not ok or self.prefilled[i] < self.target[i]:
                raise PolicyError(f"policy '{name}' decodes request {self.id_list[i]}, which is not running with its "
                                  f"prefill complete (state {STATE_NAMES[state[i]]})")
        for i, tokens in d.reserve.items():
            alone = isinstance(i, (int, np.integer)) and 0 <= i < len(state) and i not in seen \
                and state[i] == RUNNING  # a running request's top-up
            if not (i in seen or alone) or i in preempted or not isinstance(tokens, (int, np.integer)) or tokens < 0:
                raise PolicyError(f"policy '{name}': reserve {{{i!r}: {tokens!r}}} must name a request of this "
                                  f"decision or a running one, not preempted, with a token count >= 0")
        lent, guests = {}, set()
        starting = {i for i, _ in d.prefill if state[i] == WAITING} if d.lend else ()
        for item in d.lend:
            if not (isinstance(item, tuple) and len(item) == 3):
                raise PolicyError(f"policy '{name}': lend entries are (guest, host, blocks), got {item!r}")
            g, h, b = item
            if g not in starting or g in guests:
                raise PolicyError(f"policy '{name}' lends to request {g!r}, which is not starting its prefill in this "
                                  f"decision (or is named twice in lend)")
            if not isinstance(h, (int, np.integer)) or not 0 <= h < len(state) or state[h] != RUNNING \
                    or h in preempted or h in mem.loans:
                raise PolicyError(f"policy '{name}' borrows from request {h!r}, which is not a running request that "
                                  f"is kept in this decision and holds no loan itself")
            lent[h] = lent.get(h, 0) + b
            keep = mem.blocks(self.s_list[h] + self.generated[h] + (0 if self.prefilled[h] < self.target[h] else 1))
            if not isinstance(b, (int, np.integer)) or b < mem.blocks(self.s_list[g] + self.generated[g]) \
                    or mem.held(h) + (max(0, mem.blocks(d.reserve[h]) - mem.held(h)) if h in d.reserve else 0) \
                    - lent[h] < keep:
                raise PolicyError(f"policy '{name}' lends {b!r} blocks of request {self.id_list[h]} to request "
                                  f"{self.id_list[g]}: the guest needs at least its context's blocks, the host keeps "
                                  f"{keep} (its next token's)")
            if g in d.reserve and mem.blocks(d.reserve[g]) > b:
                raise PolicyError(f"policy '{name}' reserves more for guest {self.id_list[g]} than it borrows")
            guests.add(g)
        # Blocks after the decision, counted before any change (the engine's own arithmetic).
        freed = sum(mem.held(i) for i in preempted)
        need = 0
        for i in d.swap_in:
            need += mem.swap_in_blocks(i, self.s_list[i] + self.generated[i])
        for i, _ in d.prefill:
            if state[i] == WAITING and i not in guests:
                need += mem.blocks(self.s_list[i] + self.generated[i])
        if d.decode_all:
            need += len(self.growing) - sum(1 for i in preempted if i in self.growing)
        for i in d.decode:
            if i not in swapping_in:
                need += max(0, mem.blocks(self.s_list[i] + self.generated[i]) - mem.held(i))
        for i, tokens in d.reserve.items():
            if i in guests:
                continue
            base = mem.held(i) if state[i] == RUNNING else 0
            need += max(0, mem.blocks(tokens) - max(base, mem.blocks(self.s_list[i] + self.generated[i])))
        if mem.used - freed + need > mem.num_blocks:
            raise PolicyError(f"policy '{name}' needs {mem.used - freed + need} KV blocks after its decision, more "
                              f"than the {mem.num_blocks} the cache has")

    def _clear(self, victims, t: float, log: list, name: str) -> float:
        """A clearing event (the running requests' next tokens need more blocks than the cache has): recompute the
        policy's victims, record the event as an ``overflow`` iteration and return its cost in seconds
        (``overflow_cost``: ``batch``, the latency of the batch that overflowed, which produces no token; ``free``,
        nothing). Survivors make no progress in it, as in the paper loop (kvstudy/engine.py)."""
        state, running, mem = self.state, self.running, self.memory
        seen = set()
        for i in victims:
            if not isinstance(i, (int, np.integer)) or not 0 <= i < len(state) or state[i] != RUNNING or i in seen:
                raise PolicyError(f"policy '{name}' names request {i!r} as an overflow victim: not a running request "
                                  f"of this run, or named twice")
            seen.add(i)
        n_dec, ctx = len(running) - len(self.prefilling), self.decode_ctx
        dt = 0.0
        if self.overflow_cost == "batch":
            if getattr(self.latency, "needs_generated", False):
                gen_sum = ctx + n_dec - sum(self.s_list[i] for i in running if i not in self.prefilling)
                dt = float(self.latency.iteration_seconds([], n_dec, ctx, decode_generated_sum=gen_sum))
            else:
                dt = float(self.latency.iteration_seconds([], n_dec, ctx))
        used = mem.used
        for i in victims:
            self._preempt(i, RECOMPUTE, t)
        self.waiting.extendleft(i for i in victims if state[i] == WAITING)
        log.append((t, dt, n_dec, 0, 0, ctx + n_dec, mem.capacity_tokens, True, len(victims), used, 0,
                    mem.num_blocks - used, mem.host_used, 0.0, 0, len(victims), 0, 0))
        return dt

    # --- per-request events (few per iteration) -------------------------------------------------------------
    def _preempt(self, i: int, mode: str, t: float) -> str:
        """Stop running request i: its KV goes to host space (swap) or is dropped (recompute)."""
        mem, s = self.memory, self.s_list
        self.running.remove(i)
        self.preempted_at[i] = t
        if i in self.prefilling:
            g = self.clock.gen[i]
        else:
            g = self.clock.stop(i) if self.clock.on[i] else self.clock.gen[i]
            self.decode_ctx -= s[i] + g - 1
        held = mem.held(i)
        # swap only if the request can come back: host room, and can_swap_in (its blocks + 1 above the watermark)
        # not NEVER-like on an empty cache; else it is recomputed (vLLM would keep it swapped out forever)
        if mode == SWAP and mem.host_has_room(held) and mem.num_blocks - (held + 1) >= mem.watermark_blocks:
            blocks = self._free(i, swap=True)
            self.moved_out += blocks
            self.swapped_bytes[i] += blocks * self.block_bytes_all
            self.state[i] = SWAPPED
            self.swapped.append(i)
            self.pre_swap[i] += 1
            return SWAP
        if mode == SWAP:
            self.fallbacks[i] += 1
        if i in self.prefilling:
            self.recomputed[i] += self.prefilled[i]
            self.prefill_kv -= self.prefilled[i]
            self.prefilling.discard(i)
        else:
            self.recomputed[i] += s[i] + g - 1
        self._free(i)
        self.prefilled[i] = 0
        self.target[i] = s[i] + g
        self.state[i] = WAITING
        self.pre_rec[i] += 1
        if mem.can_allocate(mem.blocks(s[i] + g)) == NEVER:  # vLLM ignores such a prompt: it could never return
            self.state[i] = REJECTED
            self.reason[i] = (f"recompute after preemption needs {mem.blocks(s[i] + g)} blocks for prompt + "
                              f"generated = {s[i] + g} tokens; the watermark leaves "
                              f"{mem.num_blocks - mem.watermark_blocks}")
        return RECOMPUTE

    def _free(self, i: int, swap: bool = False) -> int:
        """Release request i's GPU blocks (to host space with ``swap``); a loan it held goes back to its host, whose
        next block boundary then moves. Returns the blocks it held."""
        mem = self.memory
        host = mem.loans[i][0] if mem.loans and i in mem.loans else None
        blocks = mem.swap_out(i) if swap else mem.release(i)
        if host is not None:
            self.clock.reschedule_growth(host)
        return blocks

    def _resumed(self, i: int, t: float) -> None:
        if self.preempted_at[i] == self.preempted_at[i]:
            self.preempted_s[i] += t - self.preempted_at[i]
            self.preempted_at[i] = math.nan

    def _swap_in(self, i: int, t: float) -> None:
        mem, g = self.memory, self.clock.gen[i]
        self.swapped.remove(i)
        blocks = mem.swap_in(i)
        self.moved_in += blocks
        self.swapped_bytes[i] += blocks * self.block_bytes_all
        mem.hold(i, mem.blocks(self.s_list[i] + g))  # the block its next token needs, if any
        self._resumed(i, t)
        self.state[i] = RUNNING
        self.running.append(i)
        self.decode_ctx += self.s_list[i] + g - 1

    def _start_prefill(self, i: int, t: float) -> None:
        mem = self.memory
        self.waiting.remove(i)  # usually the head: deque.remove is O(position)
        self.state[i] = RUNNING
        self.running.append(i)
        self.prefilling.add(i)
        self.target[i] = self.s_list[i] + self.clock.gen[i]
        self.prefilled[i] = 0
        mem.hold(i, mem.blocks(self.target[i]))
        if self.first_sched[i] != self.first_sched[i]:
            self.first_sched[i] = t
        self._resumed(i, t)

    def _token(self, i: int, end: float) -> None:
        """Request i (off the clock) produced a token at ``end``."""
        if self.first_token[i] != self.first_token[i]:
            self.first_token[i] = end
        else:
            gap = end - self.last_token[i]
            self.off_clock_gaps.append(gap)
            if gap > self.max_gap[i]:
                self.max_gap[i] = gap
        self.last_token[i] = end

    def _reserved_blocks(self) -> int:
        """Blocks held beyond the running requests' contexts (chunked prefills, reservations)."""
        gpu, bs, s = self.memory.gpu, self.memory.block_size, self.s_list
        reserved = 0
        for i in self.prefilling.union(self.reserved_ids.intersection(self.running)):
            ctx = self.prefilled[i] if i in self.prefilling else s[i] + self.clock.generated(i) - 1
            reserved += gpu[i] - (ctx + bs - 1) // bs
        return reserved

    # --- the loop ------------------------------------------------------------------------------------------
    def _setup(self) -> None:
        r, n, mem = self.r, len(self.r), self.memory
        self.s_list = s = r.prompt_tokens.tolist()
        self.o_list = o = r.output_tokens.tolist()
        self.a_list = r.arrival_time.tolist()
        self.pred_list = self.pred.tolist()
        self.id_list = r.request_id.tolist()
        mem.bind(kv_bytes_per_gpu(self.arch, self.hw))
        self.swap.bind(self.arch, self.hw, mem.block_size)
        self.block_bytes_all = mem.block_size * self.arch.kv_bytes_per_token(1)
        self.state = state = np.full(n, FUTURE, dtype=np.int8)
        self.first_sched, self.first_token, self.completion = [math.nan] * n, [math.nan] * n, [math.nan] * n
        self.last_token, self.max_gap = [math.nan] * n, [0.0] * n
        self.off_clock_gaps = []  # gaps between tokens produced off the decode clock (pooled TBT)
        self.clock = DecodeClock(n, s, o, mem.block_size, mem.gpu, self.last_token, self.max_gap)
        self.generated = _Generated(self.clock)
        self.prefilled, self.target = [0] * n, list(s)
        self.waiting, self.running, self.swapped = deque(), [], deque()
        self.prefilling, self.growing, self.reserved_ids = set(), set(), set()
        self.pre_rec, self.pre_swap, self.fallbacks = [0] * n, [0] * n, [0] * n
        self.preempted_at, self.preempted_s = [math.nan] * n, [0.0] * n
        self.recomputed, self.swapped_bytes = [0] * n, [0] * n
        self.decode_ctx = 0  # sum of s + generated - 1 over running requests past their prefill (cached contexts)
        self.prefill_kv = 0  # KV tokens of running requests still in their prefill
        self.reason = [""] * n
        for i in range(n):
            if mem.blocks(s[i] + o[i]) > mem.num_blocks:
                state[i], self.reason[i] = REJECTED, (f"prompt + output = {s[i] + o[i]} tokens needs "
                                                      f"{mem.blocks(s[i] + o[i])} blocks, more than the cache's "
                                                      f"{mem.num_blocks}")
            elif mem.can_allocate(mem.blocks(s[i])) == NEVER:
                state[i], self.reason[i] = REJECTED, (f"prompt of {s[i]} tokens needs {mem.blocks(s[i])} blocks; "
                                                      f"the watermark leaves {mem.num_blocks - mem.watermark_blocks}")

    def run(self) -> EngineResult:
        self._setup()
        n, mem, clock = len(self.r), self.memory, self.clock
        name = getattr(self.policy, "name", type(self.policy).__name__)
        s, o, a = self.s_list, self.o_list, self.a_list
        state, waiting, running, swapped = self.state, self.waiting, self.running, self.swapped
        prefilling, growing, prefilled, target = self.prefilling, self.growing, self.prefilled, self.target
        bs, num_blocks = mem.block_size, mem.num_blocks
        view = StepView(self, 0, 0.0)  # its containers are the engine's own: one view serves every step
        log = []
        iteration_seconds = self.latency.iteration_seconds
        if type(self.latency) is VidurLatency:  # the same call without one layer of indirection per step
            iteration_seconds = self.latency.tables.iteration_ms
        swap_seconds, overlap = self.swap.seconds, self.swap.overlap
        needs_generated = bool(getattr(self.latency, "needs_generated", False))
        t, step, nxt, no_token, completed, clearing = 0.0, 0, 0, 0, 0, 0
        overflow = getattr(self.policy, "overflow", None)  # the engine detects overflow for this policy
        policy_s = 0.0  # wall time inside policy.step (the scheduling overhead CacheOPT's Sec. 5.3 compares)
        status, message = "completed", ""
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=n, desc=name, unit="req", leave=False)
        try:
            while True:
                while nxt < n and a[nxt] <= t:
                    if state[nxt] == FUTURE:
                        state[nxt] = WAITING
                        waiting.append(nxt)
                    nxt += 1
                if not waiting and not running and not swapped:
                    if nxt >= n:
                        break
                    t = a[nxt]
                    continue
                if step >= self.max_iterations:
                    status, message = "max_iterations", f"stopped after {step} iterations (engine.max_iterations)"
                    break
                if growing:
                    growing.clear()
                if clock.grow_at.get(clock.D):
                    growing.update(clock.growing())
                view.step, view.time, view.num_arrived = step, t, nxt
                if overflow is not None and mem.used + len(growing) > num_blocks:
                    # an over-committing admission policy (kvstudy/policies/admission.py): a clearing event
                    dt = self._clear(overflow(view), t, log, name)
                    t += dt
                    step += 1
                    clearing += 1
                    no_token += 1
                    if no_token >= self.stall_limit:
                        status = "no_progress"
                        message = (f"{no_token} iterations in a row produced no token (engine.stall_limit="
                                   f"{self.stall_limit}): policy '{name}' keeps overflowing memory ({clearing} "
                                   f"clearing events)")
                        break
                    continue
                t0 = perf_counter()
                d = self.policy.step(view)
                policy_s += perf_counter() - t0
                self._check(d, name)
                # 1. preempt; vLLM's waiting.extendleft(preempted): the last victim (the earliest admitted) ends first
                self.moved_out = self.moved_in = n_rec = 0
                for i, mode in d.preempt:
                    n_rec += self._preempt(i, mode, t) == RECOMPUTE
                if d.preempt:
                    waiting.extendleft(i for i, _ in d.preempt if state[i] == WAITING)
                # 2. swap in; 3. prefills start (timed with the context before each chunk)
                for i in d.swap_in:
                    self._swap_in(i, t)
                for g, h, b in d.lend:  # embedded guests take their host's unused blocks before they start
                    if h in d.reserve:
                        mem.hold(h, mem.blocks(d.reserve[h]))
                    mem.lend(h, g, b)
                    clock.reschedule_growth(h)
                    self.reserved_ids.add(g)
                chunks, partial = [], 0
                for i, chunk in d.prefill:
                    if state[i] == WAITING:
                        self._start_prefill(i, t)
                    chunks.append((chunk, prefilled[i]))
                    if prefilled[i] + chunk < target[i]:
                        partial += chunk
                # 4. who decodes: every running request past its prefill (decode_all, on the clock), or a list
                listed = bool(d.decode)  # some requests named one by one (else all of them, or none: prefill only)
                if d.decode_all:
                    for i in d.swap_in:
                        clock.start(i, clock.gen[i])
                    n_dec = len(running) - len(prefilling)
                    ctx_now = self.decode_ctx
                    grew = [i for i in growing if clock.on[i]]  # preempted ones are off the clock
                    for i in grew:
                        mem.hold(i, (s[i] + clock.generated(i) + bs - 1) // bs)
                    clock.grown(grew)
                elif not listed:  # no decodes (a prefill-only step): swapped-in requests decode from the next one
                    for i in d.swap_in:
                        clock.start(i, clock.gen[i])
                    n_dec, ctx_now = 0, 0
                else:
                    for i in [i for i in running if clock.on[i]]:
                        clock.stop(i)  # an iteration that decodes only some: everyone off the clock, counted one by one
                    n_dec = len(d.decode)
                    ctx_now = sum(s[i] + clock.gen[i] - 1 for i in d.decode)
                    for i in d.decode:
                        mem.hold(i, (s[i] + clock.gen[i] + bs - 1) // bs)
                if d.reserve:
                    lenders = {h for _, h, _ in d.lend} if d.lend else ()
                    for i, tokens in d.reserve.items():
                        if i in lenders:
                            continue  # held before it lent
                        mem.hold(i, mem.blocks(tokens))
                        self.reserved_ids.add(i)
                        clock.reschedule_growth(i)
                moved = self.moved_out or self.moved_in
                swap_s = (swap_seconds(self.moved_out) + swap_seconds(self.moved_in)) if moved else 0.0
                if not chunks and not n_dec:
                    t += swap_s  # copies take their time even when nothing computes
                    if not (d.preempt or d.swap_in or running or swapped) and nxt < n:
                        t = max(t, a[nxt])  # idle: nothing runs until the next arrival
                        continue
                    no_token += 1
                    if no_token >= self.stall_limit:
                        status = "stalled" if not running else "no_progress"
                        message = (f"policy '{name}' ran no request in {no_token} iterations in a row "
                                   f"(engine.stall_limit={self.stall_limit}) with {len(waiting)} waiting, {len(running)} "
                                   f"running and {len(swapped)} swapped")
                        break
                    continue
                if needs_generated:  # the MC-SF authors' formula: the decodes' produced tokens (prompt not counted)
                    if d.decode_all:
                        gen_sum = ctx_now + n_dec - sum(s[i] for i in running if i not in prefilling)
                    else:
                        gen_sum = sum(clock.gen[i] for i in d.decode) if listed else 0
                    compute = float(iteration_seconds(chunks, n_dec, ctx_now, decode_generated_sum=gen_sum))
                else:
                    compute = float(iteration_seconds(chunks, n_dec, ctx_now))
                dt = max(compute, swap_s) if overlap else compute + swap_s
                end = t + dt
                # tokens: one per decoder, one per prefill whose last chunk ran
                self.decode_ctx += n_dec
                finished = []
                if d.decode_all:
                    finished = clock.tick(end)
                    for i in finished:
                        clock.stop(i)
                elif listed:
                    for i in d.decode:
                        clock.gen[i] += 1
                        self._token(i, end)
                        if clock.gen[i] == o[i]:
                            finished.append(i)
                left_ctx = sum(s[i] + o[i] - 1 for i in finished) if finished else 0
                done_at_prefill, produced, prefill_tokens = 0, n_dec, 0
                for i, chunk in d.prefill:
                    p = prefilled[i] + chunk
                    prefilled[i] = p
                    prefill_tokens += chunk
                    self.prefill_kv += chunk
                    if p == target[i]:
                        prefilling.discard(i)
                        self.prefill_kv -= p
                        produced += 1
                        clock.gen[i] += 1
                        self._token(i, end)
                        if clock.gen[i] == o[i]:
                            finished.append(i)
                            done_at_prefill += p
                        else:
                            self.decode_ctx += p  # = s + generated - 1: it decodes from the next iteration
                if listed:  # back on the clock, all who decode from here on
                    for i in running:
                        if i not in prefilling and state[i] == RUNNING and clock.gen[i] < o[i]:
                            clock.start(i, clock.gen[i])
                else:
                    for i, _ in d.prefill:
                        if i not in prefilling and clock.gen[i] < o[i]:
                            clock.start(i, clock.gen[i])
                # KV held during this iteration (before completions free it), and blocks held beyond it
                reserved = self._reserved_blocks() if prefilling or self.reserved_ids else 0
                log.append((t, dt, len(chunks) + n_dec, prefill_tokens, n_dec,
                            self.decode_ctx + self.prefill_kv + done_at_prefill, mem.capacity_tokens, False,
                            len(d.preempt), mem.used, reserved, num_blocks - mem.used, mem.host_used, swap_s, partial, n_rec,
                            len(d.preempt) - n_rec, len(d.swap_in)))
                self.decode_ctx -= left_ctx
                for i in finished:
                    self.completion[i] = end
                    state[i] = DONE
                    running.remove(i)
                    self._free(i)
                    self.reserved_ids.discard(i)
                completed += len(finished)
                if bar is not None and finished:
                    bar.update(len(finished))  # tqdm redraws at most every mininterval
                no_token = 0 if produced else no_token + 1
                t = end
                view.last_iteration_seconds = dt
                step += 1
                if no_token >= self.stall_limit:
                    status = "no_progress"
                    message = (f"{no_token} iterations in a row produced no token (engine.stall_limit="
                               f"{self.stall_limit}): policy '{name}' keeps preempting or re-prefilling")
                    break
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM turned into it by api.run: keep what is done
            status, message = "interrupted", interrupted_message(step)
        if bar is not None:
            bar.close()
        for i in running:  # a run stopped early: tokens of requests still on the clock
            if clock.on[i]:
                clock.stop(i)
        rejected = int((state == REJECTED).sum())
        if status == "completed" and rejected:
            message = f"{rejected} request(s) rejected (see reject_reason)"
        result = self._result(log, status, message)
        result.clearing_events = clearing
        result.extra["tbt_pooled"] = self._pooled_tbt()
        result.extra["policy_seconds"] = round(policy_s, 4)
        result.extra["policy_us_per_iteration"] = round(1e6 * policy_s / max(1, len(log)), 2)
        return result

    def _pooled_tbt(self) -> dict:
        """Quantiles of every gap between consecutive tokens of every request, pooled (spec B8.11's tail TBT),
        including the tokens a request produced before it was rejected after a preemption (they were streamed)."""
        values, weights = self.clock.pooled_gaps()
        values = np.concatenate([values, np.asarray(self.off_clock_gaps, dtype=float)])
        weights = np.concatenate([weights, np.ones(len(self.off_clock_gaps))])
        keep = weights > 0
        values, weights = values[keep], weights[keep]
        if not len(values):
            return {"count": 0}
        order = np.argsort(values, kind="stable")
        values, cum = values[order], np.cumsum(weights[order])
        total = cum[-1]

        def q(p):  # the smallest gap with at least p of all gaps at or below it (inverted CDF)
            return float(values[min(len(values) - 1, int(np.searchsorted(cum, p * total - 1e-9)))])

        return {"count": int(round(total)), "mean": float((values * weights[order]).sum() / total),
                "p50": q(0.5), "p95": q(0.95), "p99": q(0.99), "max": float(values[-1])}

    def _result(self, log, status, message) -> EngineResult:
        r, mem, state = self.r, self.memory, self.state
        first_sched, first_token, completion, max_gap = self.first_sched, self.first_token, self.completion, self.max_gap
        pre_rec, pre_swap, fallbacks, preempted_s = self.pre_rec, self.pre_swap, self.fallbacks, self.preempted_s
        recomputed, swapped_bytes, reason = self.recomputed, self.swapped_bytes, self.reason
        # one float array, then column by column: much faster than DataFrame.from_records on 10^5+ tuples
        # (every integer column is far below 2^53, so the float round trip is exact)
        table = np.array(log, dtype=float).reshape(len(log), len(ITERATION_COLUMNS))
        iterations = pd.DataFrame({c: table[:, k].astype(kind)
                                   for k, (c, kind) in enumerate(zip(ITERATION_COLUMNS, ITERATION_TYPES))})
        a, o = r.arrival_time, r.output_tokens
        first_token, completion = np.array(first_token), np.array(completion)
        done = state == DONE
        mean_tbt = np.where(done & (o > 1), (completion - first_token) / np.maximum(o - 1, 1), np.nan)
        max_tbt = np.where(done & (o > 1), np.array(max_gap), np.nan)
        pre_rec, pre_swap = np.array(pre_rec, dtype=np.int64), np.array(pre_swap, dtype=np.int64)
        requests = pd.DataFrame({
            "request_id": r.request_id, "arrival_time": a, "prompt_tokens": r.prompt_tokens, "output_tokens": o,
            "predicted_output_tokens": self.pred, "state": STATE_NAMES[state],
            "first_scheduled_time": np.array(first_sched), "first_token_time": first_token,
            "completion_time": completion, "ttft": first_token - a, "e2e_latency": completion - a,
            "mean_tbt": mean_tbt, "max_tbt": max_tbt, "preemptions": pre_rec + pre_swap, "restarts": pre_rec,
            "preemptions_recompute": pre_rec, "preemptions_swap": pre_swap,
            "swap_fallbacks": np.array(fallbacks, dtype=np.int64), "preempted_seconds": np.array(preempted_s),
            "recomputed_tokens": np.array(recomputed, dtype=np.int64),
            "swapped_bytes": np.array(swapped_bytes, dtype=np.int64), "reject_reason": reason,
        }).sort_values("request_id", kind="stable").reset_index(drop=True)
        result = EngineResult(requests, iterations, status, message, 0, mem.capacity_tokens)
        result.extra = {"memory": mem.describe(), "swap": self.swap.describe()}
        return result
