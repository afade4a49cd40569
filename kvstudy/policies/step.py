"""The interface of preemptive policies (``memory=paged``), in the spirit of vLLM's V0/V1 scheduler.

Each iteration the :class:`kvstudy.engine.loop.StepEngine` shows the policy a :class:`StepView` and the
policy answers with a :class:`Decision` naming everything that happens in the iteration:

* ``preempt``: running requests to stop, each with a mode: ``recompute`` (KV dropped; on resume the prompt
  plus every token generated so far is prefilled again) or ``swap`` (KV copied to host and back before
  it runs again);
* ``swap_in``: swapped requests to bring back (they decode in this iteration if also named in ``decode``);
* ``prefill``: ``(request, tokens)`` chunks: a waiting request starts (or restarts) its prefill, or a
  running request continues a chunked one. Its first token comes with its last chunk;
* ``decode``: running requests whose prefill is complete that produce one token each; or
  ``decode_all``: every such request (after this decision's preemptions, with its swap-ins), the common
  case, which the engine checks and carries out without a list;
* ``reserve``: optional ``{request: tokens}`` to hold for a request beyond its context (RLP, S3 and
  CacheOPT allocate up front); without it a request holds the blocks its context needs. A running request
  may be named here alone (CacheOPT's top-ups); holdings never shrink;
* ``lend``: ``(guest, host, blocks)``: a waiting request starting its prefill in this decision takes ``blocks``
  of a running host's held-but-unused blocks (CacheOPT's embedding); the host keeps room for its next token.

A decision may be shared between steps (vLLM's ``DECODE_ALL``): the engine never changes one.

The engine, not the policy, owns time and the KV accounting: it validates every decision (states, ids
named once, modes the memory model can do, GPU blocks and host space) and carries it out in the order
preempt, swap in, prefill, decode. The view's containers are the engine's own (no copy per iteration):
a policy reads them and never changes them. Token conventions follow vLLM: a request of output o
produces its first token with its prefill and the other o - 1 in decode iterations.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

RECOMPUTE, SWAP = "recompute", "swap"


@dataclass(slots=True)
class Decision:
    preempt: List[Tuple[int, str]] = field(default_factory=list)
    swap_in: List[int] = field(default_factory=list)
    prefill: List[Tuple[int, int]] = field(default_factory=list)
    decode: List[int] = field(default_factory=list)
    decode_all: bool = False
    reserve: Dict[int, int] = field(default_factory=dict)
    lend: List[Tuple[int, int, int]] = field(default_factory=list)


class StepView:
    """What a preemptive policy sees at the start of one iteration (read-only by contract).

    Requests are named by their index in the run (0..n-1). ``waiting`` holds new requests and recompute
    victims (vLLM puts the victims at the front), ``running`` the requests holding GPU KV in admission
    order, ``swapped`` the requests whose KV is on the host. Per request: ``prompt``, ``predicted``
    (output length as the predictor says; the truth only under ``oracle``), ``arrival``, ``generated``
    (tokens produced so far, kept across preemptions), ``prefilled`` (tokens of the current prefill done)
    and ``prefill_target`` (prompt + generated when the current prefill started).
    """

    def __init__(self, engine, step: int, time: float) -> None:
        st = engine.state  # the run's state (kvstudy/engine/state.py): the view holds its containers, never copies
        self.step, self.time = step, time
        self.memory = engine.memory
        self.waiting, self.running, self.swapped = st.waiting, st.running, st.swapped
        self.prompt, self.predicted, self.arrival = st.prompt, st.predicted, st.arrival
        self.generated, self.prefilled, self.prefill_target = st.generated, st.prefilled, st.prefill_target
        self.request_id = st.request_id
        #: tokens generated, exact for requests off the decode clock (waiting, swapped, in prefill): a plain list
        self.waiting_generated = st.clock.tokens
        self.max_model_len = engine.max_model_len
        #: each request's state (engine codes: 0 future, 1 waiting, 2 running, 3 done, 4 rejected, 5 swapped, 6 elsewhere,
        #: 7 in flight)
        self.state = st.request_state
        #: requests that have arrived so far: engine indices 0 .. num_arrived - 1 (indices are in arrival order)
        self.num_arrived = 0
        #: requests that joined the waiting queue since the last step other than by arriving (a decode replica's
        #: handed-off requests, kvstudy/cluster/disaggregated.py) and that the arrivals a policy takes in next
        #: (indices from the last step's ``num_arrived`` on, those waiting) do not show: a policy keeping its own
        #: queue takes these in as it takes arrivals; the engine empties the list after each step (and each call of an
        #: ``overflow_victims`` hook, which takes them in too)
        self.joined = st.joined
        #: running requests whose prefill is unfinished (Sarathi continues them in chunks)
        self.prefilling = st.prefilling
        #: running requests that need one more block to decode now (their context crosses a block boundary)
        self.growing = st.growing
        #: CacheOPT's deviation-direction classifier per request (1: the prediction is under the truth), or None
        self.direction = engine.direction
        #: how long the latest iteration that ran something took (0 before the first): idle time before an
        #: arrival and steps that only copy KV are not iterations (CacheOPT's T_I^max, Sec. 3.3)
        self.last_iteration_seconds = 0.0
        #: pipeline stages of the replica (kvstudy/engine/pipeline.py): with more than one, up to that many batches
        #: are in flight and a step forms one of them
        self.stages = engine.stages
        self._clock, self._last_token = st.clock, st.last_token
        self._state = st

    @property
    def decode_count(self) -> int:
        """Iterations so far in which every running request past its prefill decoded (``decode_all``): a request
        that decoded in each since it joined at count c with g tokens has g + (count - c) now."""
        return self._clock.ticks

    @property
    def decode_need_tokens(self) -> int:
        """KV tokens the running requests past their prefill need in this iteration: sum(prompt + generated)."""
        st = self._state
        return st.decode_context_tokens + len(st.running) - len(st.prefilling)

    @property
    def in_flight(self) -> int:
        """Requests in batches still in flight under pipeline parallelism (kvstudy/engine/pipeline.py): they hold KV
        (counted in ``memory``) but are not in ``running`` and no decision may name them until their batch ends (as
        Vidur's replica schedulers form a batch from the requests not in flight); 0 without it."""
        return len(self._state.in_flight)

    def last_token_time(self, i: int) -> float:
        """When request i produced its latest token (nan before its first)."""
        clock = self._clock
        if clock.on_clock[i] and clock.ticks > clock.joined_at[i]:
            return clock.ends[clock.ticks - 1]
        return self._last_token[i]

    def held_and_context(self) -> List[Tuple[int, int, int]]:
        """(request, tokens its GPU blocks hold, its context: prompt + generated) of every running request past its
        prefill, in running order: one pass, for policies that weigh each request's allocation (CacheOPT)."""
        gpu, bs = self.memory.gpu, self.memory.block_size
        prompt, prefilled, target = self.prompt, self.prefilled, self.prefill_target
        clock = self._clock  # its ``generated`` inlined (every running request, every CacheOPT step)
        tokens, ticks, joined, on = clock.tokens, clock.ticks, clock.joined_at, clock.on_clock
        return [(j, gpu.get(j, 0) * bs, prompt[j] + (tokens[j] + ticks - joined[j] if on[j] else tokens[j]))
                for j in self.running if prefilled[j] >= target[j]]

    def in_prefill(self, i: int) -> bool:
        return self.prefilled[i] < self.prefill_target[i]

    def decode_blocks_needed(self, i: int) -> int:
        """Blocks request i must add to decode now: its context becomes prompt + generated tokens."""
        return max(0, self.memory.blocks(self.prompt[i] + self.generated[i]) - self.memory.held(i))

    def prefill_blocks(self, i: int) -> int:
        """Blocks a waiting request takes when its prefill starts (vLLM allocates the whole prompt)."""
        return -(-(self.prompt[i] + self.waiting_generated[i]) // self.memory.block_size)


class StepPolicy:
    """Base class of preemptive policies: ``step(view) -> Decision``.

    Optional hook ``overflow_victims(view) -> [request, ...]``: a policy that has it lets the engine detect overflow
    (the running requests' next tokens need more than the memory) before each step and recompute the requests it
    names, as a clearing event (the adapter of admission-only policies, kvstudy/policies/admission.py, has it)."""

    name = "step"
    preemptive = True
    #: True: the policy keeps its own order of the waiting queue and reads only who is in ``view.waiting``, never its
    #: order (nor ``view.waiting[0]``); the engine then keeps the queue as a set, a start or a return O(1) wherever
    #: the request sits (issue 47). The admission adapter and the QueuedVLLM family (kvstudy/policies/rr_sjf.py) do.
    own_queue_order = False
    #: True: the policy reads ``view.waiting.smallest()`` and ``view.waiting.matched()`` (SGLang's dfs_weight order);
    #: the engine then keeps the queue as an :class:`~kvstudy.engine.indexed_queue.IndexedQueue` (issue 59)
    indexed_waiting = False

    def reset(self, seed: int) -> None:
        """Called once before a run; a policy keeps no other state between runs."""
        self._rng = np.random.default_rng(seed)

    def step(self, view: StepView) -> Decision:
        raise NotImplementedError

    def steady_spare(self, view: StepView) -> Optional[int]:
        """The policy's promise that lets the engine advance decode-only iterations without asking it (issue 47):
        None (the default) promises nothing, and ``step`` is asked before every iteration. An integer ``spare``
        promises: after a step whose decision is decode-only (``Decision(decode_all=True)``, nothing else), at every
        later step reached with no arrival, no completion, no preemption or swap and nothing in prefill, where the
        only change is that running requests decoded and took the blocks they grew into, the decision is decode-only
        again as long as ``len(view.growing) + spare <= view.memory.free``; and skipping such steps changes nothing
        the policy keeps. Asked once per run, before the first step."""
        return None
