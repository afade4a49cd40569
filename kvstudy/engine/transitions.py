"""The state transitions of one request: preempt (swap or recompute), free its blocks, resume, swap in, start a
prefill, stamp a token off the decode clock, finish.

Each changes the run's state (state.py), the memory model (kvstudy/memory/base.py) and the decode clock together, so
the three always agree; the engine's phases (loop.py) call them after the decision check (check.py) has passed. They
act on what a :class:`Transitions` is given (the run's state, the memory, the event log, the run's conventions), not
on the engine, so each can be tried on a hand-built state (tests/engine/test_transitions.py). What an iteration moves
(blocks swapped out and in) is returned to the caller, which keeps it with the iteration.
"""
from __future__ import annotations

import math

from kvstudy.engine.states import DONE, REJECTED, RUNNING, SWAPPED, WAITING
from kvstudy.memory.base import NEVER
from kvstudy.policies.step import RECOMPUTE, SWAP


class Transitions:
    """The transitions of one run. ``state``: its RunState; ``memory``: its memory model; ``events``: the event log
    or None; ``paper``: the MC-SF paper's convention (an eviction restarts the request from its prompt);
    ``adapted``: an admission-only policy through the adapter (no vLLM rejection of a recompute that can never fit);
    ``block_bytes``: one block's KV bytes over all GPUs (a swap's bytes)."""

    def __init__(self, state, memory, events=None, paper: bool = False, adapted: bool = False,
                 block_bytes: int = 0) -> None:
        self.state, self.memory, self.events = state, memory, events
        self.paper, self.adapted, self.block_bytes = paper, adapted, block_bytes
        #: ``pull(request, time, tokens)``: a handed-off request's KV starts moving here (kvstudy/cluster/handoff.py)
        self.pull = None

    def preempt(self, i: int, mode: str, t: float, listed: bool = True, kind: str = "preempt"):
        """Stop running request i: its KV goes to host space (swap) or is dropped (recompute). ``listed``: remove it
        from the running list (a caller evicting many removes them in one pass); ``kind``: its event (evict: a
        clearing event's victim). Returns (the mode carried out: a swap without host room is a recompute, the blocks
        swapped out)."""
        st, mem, ev, clock = self.state, self.memory, self.events, self.state.clock
        s = st.prompt
        if listed:
            st.running.remove(i)
        st.preempted_at[i] = t
        prefilling = i in st.prefilling
        if prefilling:
            g = clock.tokens[i]
        else:
            g = clock.stop(i) if clock.on_clock[i] else clock.tokens[i]
            st.decode_context_tokens -= s[i] + g - 1
            st.decode_prompt_tokens -= s[i]
        held = mem.held(i)
        # swap only if the request can come back: host room, and can_swap_in (its blocks + 1 above the watermark)
        # not NEVER-like on an empty cache; else it is recomputed (vLLM would keep it swapped out forever)
        if mode == SWAP and mem.host_has_room(held) and mem.num_blocks - (held + 1) >= mem.watermark_blocks:
            blocks = self.free(i, swap=True, computed=s[i] + g - 1)
            st.swapped_bytes[i] += blocks * self.block_bytes
            st.request_state[i] = SWAPPED
            st.swapped.append(i)
            st.preemptions_swap[i] += 1
            if ev is not None:
                ev.add(t, i, kind, SWAP, s[i] + g - 1)
            return SWAP, blocks
        if mode == SWAP:
            st.swap_fallbacks[i] += 1
        dropped = st.prefilled[i] if prefilling else s[i] + g - 1
        st.recomputed_tokens[i] += dropped
        if prefilling:
            st.prefill_kv_tokens -= st.prefilled[i]
            st.prefilling.discard(i)
        if ev is not None:
            ev.add(t, i, kind, "recompute_fallback" if mode == SWAP else RECOMPUTE, dropped)
        self.free(i, computed=dropped)
        if self.paper:  # the paper's eviction: KV and progress lost, the request restarts from its prompt
            g = clock.tokens[i] = 0
        st.prefilled[i] = 0
        st.prefill_target[i] = s[i] + g
        st.request_state[i] = WAITING
        st.preemptions_recompute[i] += 1
        # vLLM ignores such a prompt (an admission policy's request always fits: the set-up rejected any whose prompt +
        # output cannot, and no watermark applies to it)
        if mem.tracks_blocks and not self.adapted and mem.can_allocate(mem.blocks(s[i] + g)) == NEVER:
            st.request_state[i] = REJECTED
            st.reject_reason[i] = (f"recompute after preemption needs {mem.blocks(s[i] + g)} blocks for prompt + "
                                   f"generated = {s[i] + g} tokens; the watermark leaves "
                                   f"{mem.num_blocks - mem.watermark_blocks}")
            if ev is not None:
                ev.add(t, i, "reject")
        return RECOMPUTE, 0


    def free(self, i: int, swap: bool = False, computed: int = 0) -> int:
        """Release request i's GPU blocks (to host space with ``swap``); a loan it held goes back to its host, whose
        next block boundary then moves. ``computed``: its context tokens whose KV is computed (prefix caching keeps
        their full blocks). Returns the blocks it held."""
        mem = self.memory
        host = mem.loans[i][0] if mem.loans and i in mem.loans else None
        blocks = mem.swap_out(i, computed) if swap else mem.release(i, computed)
        if host is not None:
            self.state.clock.reschedule_growth(host)
        return blocks


    @staticmethod
    def resumed(st, i: int, t: float) -> None:
        """Request i runs again at ``t``: the time since its preemption counts as preempted."""
        if st.preempted_at[i] == st.preempted_at[i]:
            st.preempted_seconds[i] += t - st.preempted_at[i]
            st.preempted_at[i] = math.nan


    def swap_in(self, i: int, t: float) -> int:
        """Swapped-out request i comes back to decode: its blocks (and the one its next token needs) on the GPU. Returns
        the blocks swapped in."""
        st, mem = self.state, self.memory
        g = st.clock.tokens[i]
        st.swapped.remove(i)
        blocks = mem.swap_in(i)
        st.swapped_bytes[i] += blocks * self.block_bytes
        mem.hold(i, mem.blocks(st.prompt[i] + g))  # the block its next token needs, if any
        self.resumed(st, i, t)
        st.request_state[i] = RUNNING
        st.running.append(i)
        st.decode_context_tokens += st.prompt[i] + g - 1
        st.decode_prompt_tokens += st.prompt[i]
        if self.events is not None:
            self.events.add(t, i, "swap_in", tokens=st.prompt[i] + g - 1)
        return blocks


    def start_prefill(self, i: int, t: float) -> None:
        """Waiting request i starts (or restarts) its prefill of prompt + generated tokens; with prefix caching it starts
        past its cached prefix."""
        st = self.state
        st.waiting.remove(i)  # usually the head: deque.remove is O(position)
        st.request_state[i] = RUNNING
        st.running.append(i)
        st.prefilling.add(i)
        st.prefill_target[i] = target = st.prompt[i] + st.clock.tokens[i]
        hit = self.memory.start(i, target)  # tokens it skips (its cached prefix; 0 without a cache)
        skip = hit
        if st.supplied and i in st.supplied:  # a handed-off request (disaggregation): the rest of its prompt's KV
            handed = st.supplied.pop(i)  # moves from the prefill replica now, into the blocks just allocated (what is
            self.pull(i, t, max(0, handed - hit))  # cached stays; all of it cached: nothing moves, the hold is freed)
            skip = max(handed, hit)
        st.prefilled[i] = skip
        st.prefill_kv_tokens += skip
        if st.first_scheduled[i] != st.first_scheduled[i]:
            st.prefix_cached_first[i] = hit
            st.first_scheduled[i] = t
        else:
            st.prefix_cached_later[i] += hit
            if st.preempted_at[i] == st.preempted_at[i]:  # back after a preemption
                self.resumed(st, i, t)
        if self.events is not None:
            self.events.add(t, i, "admit", tokens=target)


    def token(self, i: int, end: float) -> None:
        """Request i (off the clock) produced a token at ``end``."""
        st = self.state
        if st.first_token[i] != st.first_token[i]:
            st.first_token[i] = end
            if self.events is not None:
                self.events.add(end, i, "first_token")
        else:
            gap = end - st.last_token[i]
            st.off_clock_gaps.append(gap)
            if gap > st.max_gap[i]:
                st.max_gap[i] = gap
        st.last_token[i] = end


    def finish(self, finished, stamp: float, step: int) -> None:
        """The requests in ``finished`` produced their last token in iteration ``step``, stamped ``stamp``."""
        st, ev = self.state, self.events
        state, running, tracks, s, o = st.request_state, st.running, self.memory.tracks_blocks, st.prompt, st.output
        completion, last_round, reserved = st.completion, st.last_round, st.reserved
        many = len(finished) > 4  # list.remove is O(running) each: many leave in one pass (the order of the rest kept)
        for i in finished:
            if ev is not None:
                ev.add(stamp, i, "finish")
            completion[i] = stamp
            last_round[i] = step
            state[i] = DONE
            if not many:
                running.remove(i)
            if tracks:  # the paper's memory holds nothing per request
                if st.hold is not None and i in st.hold:  # a prefill replica's: kept until its KV has moved
                    st.handed.append((stamp, i))
                else:
                    self.free(i, computed=s[i] + o[i] - 1)
            reserved.discard(i)
        if many:
            gone = set(finished)
            running[:] = [i for i in running if i not in gone]
