"""kvstudy's one iteration loop (issue 34): arrivals, the iteration, its time, token stamps and the run's records,
for every policy on every memory model it can run on. The engine owns time and KV accounting; the policy decides.

Pieces the loop calls (each with one job):

* the memory model (``memory`` group): :class:`~kvstudy.memory.paper.PaperMemory` (the MC-SF paper's constraint (3):
  tokens counted in aggregate, the admission round free, over-commitment possible) or
  :class:`~kvstudy.memory.paged.PagedMemory` (vLLM's blocks, watermark, reservations, host swap space). It fixes
  the token convention (``memory.convention``): ``paper``, o decode rounds after the prompt's round and an eviction
  restarts the request; ``vllm``, o tokens with the first from the prefill and a recompute keeps them;
* the policy: a step policy (kvstudy/policies/step.py: ``step(view) -> Decision``), or an admission-only one
  (kvstudy/policies/base.py: ``order`` + ``admit``) that the loop adapts itself (kvstudy/policies/admission.py);
* the latency model: the iteration's seconds for its exact batch; the swap model: seconds of KV copies;
* the decode clock (kvstudy/decode_clock.py): the requests decoding every iteration, counted in O(1);
* the records (kvstudy/records.py): the tables in the memory model's convention.

One iteration:

1. Requests that have arrived by the clock join the waiting queue (``arrivals=authors_code``: the MC-SF authors'
   event order on ties, memory=paper only). Idle, the clock jumps to the next arrival.
2. Overflow (a policy with an ``overflow`` hook, i.e. an adapted admission policy): when the running requests' need
   for this iteration exceeds the memory, the policy names victims, the engine evicts them by recompute and records a
   clearing event at ``overflow_cost`` (kvstudy/engine.py's docstring: the paper's conventions).
3. The policy returns a :class:`~kvstudy.policies.step.Decision`; ``_check`` validates all of it before changing
   anything (on paged memory: blocks after the decision within capacity), then it is carried out in the order
   preempt, swap in, prefill, decode: a recompute victim drops its KV and goes to the front of the waiting queue
   (vLLM's ``extendleft``), a swap victim's blocks move to host space (or, when that is full, it is recomputed
   instead and ``swap_fallbacks`` counts it).
4. Its time is the latency model's prediction for that exact batch (each prefill chunk with the context before
   it, each decode with its cached context; a recompute is a prefill of prompt + generated tokens) plus the swap
   model's seconds for the blocks moved (or the longer of the two when ``swap.overlap``).
5. Tokens are stamped with the iteration's end (with its start under ``latency=unit`` on the paper's memory: the
   round's index). A prefill's last chunk produces a request's next token; a decode produces one.

Rejected up front, each with ``reject_reason``: a request the memory model can never serve (``memory.rejection``);
on paged memory also, when preempted, a request whose recompute (prompt + generated tokens) can_allocate calls
NEVER (vLLM ignores such a prompt). ``stall_limit`` iterations in a row without a token (a chunk that takes a prefill
further than it ever got counts as progress), or clearing events in a row
without a completed request, end the run ``no_progress``; a policy that runs nothing on an idle engine with nothing
left to arrive ends ``stalled``.
"""
from __future__ import annotations

import math
from time import perf_counter
from collections import deque

import numpy as np

from kvstudy import records
from kvstudy.decode_clock import DecodeClock
from kvstudy.events import EventLog
from kvstudy.latency.models import VidurLatency
from kvstudy.errors import ConfigError, KvStudyError
from kvstudy.states import (DONE, FUTURE, REJECTED, RUNNING, SWAPPED, WAITING, EngineResult, PolicyError,
                            interrupted_message)
from kvstudy.memory.paged import NEVER
from kvstudy.policies.admission import Admission
from kvstudy.policies.step import RECOMPUTE, SWAP, Decision, StepPolicy, StepView
from kvstudy.swap_models import SwapModel, kv_bytes_per_gpu
from kvstudy.workloads.requests import Requests

STATE_NAMES, ITERATION_COLUMNS, ITERATION_TYPES = records.STATE_NAMES, records.ITERATION_COLUMNS, records.ITERATION_TYPES
NO_CHUNKS: tuple = ()  # a decode-only iteration's prefill chunks
IDLE = math.inf  # what the loop yields in a cluster when it waits for a request to be routed to it


class _Generated:
    """``view.generated[i]``: tokens request i has produced, read through the decode clock."""

    def __init__(self, clock: DecodeClock) -> None:
        self._clock = clock

    def __getitem__(self, i: int) -> int:
        return self._clock.generated(i)


class _WaitingSet(dict):
    """The waiting requests as a set (a dict of None), for a policy that keeps its own queue orders
    (kvstudy/policies/admission.py): removing a request from anywhere costs O(1), not a deque's O(position), and
    returning victims costs O(victims). Its order is never read."""

    def append(self, i: int) -> None:
        self[i] = None

    def remove(self, i: int) -> None:
        del self[i]

    def extendleft(self, items) -> None:
        self.update(dict.fromkeys(items))


class StepEngine:
    """The one loop (module docstring). ``memory`` fixes the KV accounting and the token convention
    (kvstudy/memory/paper.py, paged.py). The settings ``arrivals``, ``max_batch``, ``raise_prediction_on_eviction``
    and ``overflow_cost=authors_code`` reproduce the MC-SF paper's and its authors' loop (memory=paper only)."""

    def __init__(self, requests: Requests, predicted: np.ndarray, policy: StepPolicy, latency,
                 memory, swap: SwapModel, arch, hardware, stall_limit: int = 100,
                 max_iterations: int = 50_000_000, progress: bool = False, direction=None,
                 overflow_cost: str = "batch", arrivals: str = "paper", max_batch=None,
                 raise_prediction_on_eviction: bool = False, record_events: bool = False) -> None:
        paper = memory.convention == "paper"
        if not isinstance(raise_prediction_on_eviction, bool):
            raise KvStudyError(f"engine.raise_prediction_on_eviction={raise_prediction_on_eviction!r}: allowed true, "
                               f"false")
        if overflow_cost not in ("batch", "free", "authors_code"):
            raise KvStudyError(f"engine.overflow_cost={overflow_cost!r}: allowed batch, free, authors_code")
        if arrivals not in ("paper", "authors_code"):
            raise KvStudyError(f"engine.arrivals={arrivals!r}: allowed paper, authors_code")
        if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1):
            raise KvStudyError(f"engine.max_batch={max_batch!r}: allowed null (no cap) or a whole number >= 1")
        name = getattr(policy, "name", type(policy).__name__)
        if paper and getattr(policy, "preemptive", False):
            raise ConfigError(f"policy '{name}' preempts and needs memory=paged (memory=paper is the MC-SF paper's "
                              f"admission-only model)")
        if not paper:  # the MC-SF authors' loop settings: the paper's memory only, refused in one line elsewhere
            if max_batch is not None:
                raise ConfigError(f"engine.max_batch={max_batch} applies to memory=paper (the MC-SF authors' batch "
                                  f"cap); on memory={memory.name} a policy caps its own batch (policy.max_num_seqs)")
            for key, value in (("arrivals", arrivals), ("overflow_cost", overflow_cost)):
                if value == "authors_code":
                    raise ConfigError(f"engine.{key}=authors_code (set by regime=authors) reproduces the MC-SF "
                                      f"authors' scripts on memory=paper; on memory={memory.name} choose "
                                      f"latency=mcsf_authors alone for their batch-time formula")
            if raise_prediction_on_eviction:
                raise ConfigError(f"engine.raise_prediction_on_eviction=true is the paper loop's Fig. 5 remedy "
                                  f"(memory=paper); memory={memory.name} keeps a recomputed request's tokens, so it "
                                  f"has no such cycle")
        if getattr(policy, "preemptive", False):
            if not callable(getattr(policy, "step", None)):
                raise PolicyError(f"policy '{name}' is preemptive but has no step(view) method (kvstudy/policies/step.py)")
            if max_batch is not None or raise_prediction_on_eviction:
                raise ConfigError(f"engine.max_batch and engine.raise_prediction_on_eviction apply to admission-only "
                                  f"policies; policy '{name}' decides its own batch")
        elif callable(getattr(policy, "schedule", None)):  # order + admit: the engine adapts it (reset by the caller)
            policy = Admission(policy, max_batch=max_batch, raise_on_eviction=raise_prediction_on_eviction)
        else:
            raise PolicyError(f"policy '{name}' ({type(policy).__name__}) is neither a step policy (preemptive = True "
                              f"and step(view): kvstudy/policies/step.py) nor an admission policy (order + admit: "
                              f"kvstudy/policies/base.py)")
        if getattr(memory, "prefix_caching", False) and getattr(policy, "embedding", False):
            raise ConfigError(f"policy '{name}' embeds requests in others' blocks (policy.embedding=true), which "
                              f"memory.prefix_caching=true does not model; set policy.embedding=false")
        self.overflow_cost, self.arrivals = overflow_cost, arrivals
        #: an admission-only policy through the adapter: no vLLM watermark rule, its own queue orders
        self.adapted = isinstance(policy, Admission)
        self.r, self.policy, self.latency, self.memory, self.swap = requests, policy, latency, memory, swap
        self.pred = np.asarray(predicted, dtype=np.int64)
        self.direction = None if direction is None else np.asarray(direction, dtype=np.int8).tolist()
        self.arch, self.hw = arch, hardware
        self.max_model_len = int(arch.max_model_len) if arch is not None else 0  # none: the paper's memory alone
        self.stall_limit, self.max_iterations, self.progress = stall_limit, max_iterations, progress
        self.record_events = bool(record_events)  # record.events: kvstudy/events.py (None when off: no extra work)
        self.events = None
        #: the paper's convention: o decode rounds after the prompt's round (o + 1 tokens), an eviction restarts the
        #: request; under latency=unit a round's tokens are stamped with its start (the round's index)
        self.paper = paper
        self.at_start = paper and bool(getattr(latency, "stamps_at_start", False))
        self.needs_generated = bool(getattr(latency, "needs_generated", False))
        self.seconds = self._timer(latency, self.needs_generated)

    @staticmethod
    def _timer(latency, needs_generated: bool):
        """``seconds(chunks, decodes, their cached context, their produced tokens)``: the latency model's time of one
        iteration (the produced tokens only for a model that reads them: the MC-SF authors' formula)."""
        call = latency.tables.iteration_ms if type(latency) is VidurLatency else latency.iteration_seconds
        if needs_generated:
            return lambda chunks, n, ctx, gen: float(call(chunks, n, ctx, decode_generated_sum=gen))
        return lambda chunks, n, ctx, gen: float(call(chunks, n, ctx))

    # --- the policy's decision --------------------------------------------------------------------------
    def _check(self, d: Decision, name: str) -> None:
        """Every id named once, in the state its list needs, in a mode the memory model can do; the blocks
        the decision needs fit. Raises PolicyError naming the first problem; changes nothing."""
        if not isinstance(d, Decision):
            raise PolicyError(f"policy '{name}' returned {type(d).__name__}, not a Decision")
        state, mem = self.state, self.memory
        if not (d.preempt or d.swap_in or d.prefill or d.decode or d.reserve or d.lend):  # the common decode-only step
            if d.decode_all and mem.tracks_blocks and mem.used + len(self.growing) > mem.num_blocks:
                raise PolicyError(f"policy '{name}' decodes every running request, which needs "
                                  f"{mem.used + len(self.growing)} KV blocks, more than the {mem.num_blocks} the "
                                  f"cache has")
            return
        if d.decode_all and not (d.preempt or d.swap_in or d.decode or d.reserve or d.lend) and self._admissions_ok(d):
            return  # the next most common step: waiting requests start whole prefills, everyone decodes
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
        if not mem.tracks_blocks:  # the paper's memory: admissions are not checked (an overflow is, next round)
            return
        # Blocks after the decision, counted before any change (the engine's own arithmetic).
        cache = self.cache
        freed = sum(mem.held(i) for i in preempted)
        need = 0
        for i in d.swap_in:
            need += mem.swap_in_blocks(i, self.s_list[i] + self.generated[i])
        starts = [i for i, _ in d.prefill if state[i] == WAITING and i not in guests]
        for i in starts:
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
        if cache is not None and (preempted or (starts and mem.used - freed + need > mem.num_blocks)):
            # prefix caching: count shared blocks once (without victims the plain count above is an upper bound; a
            # victim's held blocks may be shared, so with victims always): a victim frees what no one else uses; a
            # start takes what it does not share (one sharing a block another start of this decision caches is
            # counted in full)
            gain, dropped = cache.release_gain(preempted)
            need -= sum(mem.blocks(self.s_list[i] + self.generated[i])
                        - mem.start_blocks(i, self.s_list[i] + self.generated[i], dropped) for i in starts)
            freed = gain
        if mem.used - freed + need > mem.num_blocks:
            if self.adapted:  # a user's order + admit policy never wrote a "decision"
                raise PolicyError(f"policy '{name}' admits requests whose prefills need {mem.used - freed + need} KV "
                                  f"blocks with the running requests', more than the {mem.num_blocks} the cache has "
                                  f"(memory={mem.name} charges a prefill in its own iteration: keep "
                                  f"view.running_kv_tokens + view.kv_need(prompt) within view.capacity)")
            raise PolicyError(f"policy '{name}' needs {mem.used - freed + need} KV blocks after its decision, more "
                              f"than the {mem.num_blocks} the cache has (it starts "
                              f"{self._ids(i for i, _ in d.prefill if state[i] == WAITING)}, swaps in "
                              f"{self._ids(d.swap_in)}, preempts {self._ids(i for i, _ in d.preempt)})")

    def _ids(self, indices, most: int = 8) -> str:
        """Request ids for a message: ``[3, 17, 21]``, ``none``, or the first ``most`` and how many more."""
        ids = [self.id_list[i] for i in indices]
        if not ids:
            return "none"
        more = f" and {len(ids) - most} more" if len(ids) > most else ""
        return f"request(s) {', '.join(map(str, ids[:most]))}{more}"

    def _located(self, exc: PolicyError, step: int, t: float) -> PolicyError:
        """A refused decision, named with where the run was: the iteration, its time, who waits, runs, is swapped
        out, and the blocks in use."""
        mem = self.memory
        blocks = f", {mem.used}/{mem.num_blocks} KV blocks in use" if mem.tracks_blocks else ""
        return PolicyError(f"iteration {step} (time {t:.6g}): {exc}; {len(self.waiting)} waiting, running "
                           f"{self._ids(self.running)}, {len(self.swapped)} swapped out{blocks}")

    def _admissions_ok(self, d: Decision) -> bool:
        """A decision of whole prefills of distinct waiting requests plus ``decode_all``, checked the short way (the
        same rules as the full check); False: the full check runs and names the problem, if any."""
        state, gen, s, mem = self.state, self.clock.gen, self.s_list, self.memory
        n, seen, need = len(s), set(), 0
        for item in d.prefill:
            if type(item) is not tuple or len(item) != 2:
                return False
            i, chunk = item
            if type(i) is not int or not 0 <= i < n or i in seen or state[i] != WAITING or type(chunk) is not int \
                    or not 0 < chunk <= s[i] + gen[i]:
                return False
            seen.add(i)
            need += mem.blocks(s[i] + gen[i])
        return not mem.tracks_blocks or mem.used + need + len(self.growing) <= mem.num_blocks

    def _clear(self, victims, t: float, log: list, name: str) -> float:
        """A clearing event (the running requests' need for this iteration exceeds the memory): recompute the policy's
        victims (on the paper's memory: restart them), record the event as an ``overflow`` iteration and return its
        cost in seconds (``overflow_cost``: ``batch``, the latency of the batch that overflowed, which produces no
        token; ``free``, nothing; ``authors_code``, nothing when the eviction brings the KV within capacity, else one
        idle second whose end arrivals join at). Survivors make no progress in it: on the paper's memory their
        schedules move one round later (kvstudy/records.py)."""
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
            dt = self.seconds(NO_CHUNKS, n_dec, ctx, ctx + n_dec - self.decode_prompts)
        used = mem.used
        if len(victims) > 8:  # a clearing of many (alpha-greedy clears all): one pass over the running list
            gone = set(victims)
            running[:] = [i for i in running if i not in gone]
            for i in victims:
                self._preempt(i, RECOMPUTE, t, listed=False, kind="evict")
        else:
            for i in victims:
                self._preempt(i, RECOMPUTE, t, kind="evict")
        if self.events is not None:
            self.events.add(t, -1, "clear", tokens=len(victims))
        self.waiting.extendleft(i for i in victims if state[i] == WAITING)
        if self.overflow_cost == "authors_code" and self.decode_ctx + len(running) > mem.capacity_tokens:
            dt, self.idled = 1.0, True  # the scripts idle one second before clearing again
        if self.paper:
            p_round = self.p_round
            for i in running:
                p_round[i] += 1
        row = (t, dt, n_dec, 0, 0, ctx + n_dec, mem.capacity_tokens, True, len(victims))
        log.append(row if self.paper else row + (used, 0, mem.num_blocks - used, mem.host_used, 0.0, 0, len(victims), 0,
                                                 0))
        if self.cache is not None:
            self.cache_rows.append((self.cache.cached_blocks, self.cache.evictions))
        return dt

    # --- per-request events (few per iteration) -------------------------------------------------------------
    def _preempt(self, i: int, mode: str, t: float, listed: bool = True, kind: str = "preempt") -> str:
        """Stop running request i: its KV goes to host space (swap) or is dropped (recompute). ``listed``: remove it
        from the running list (a caller evicting many removes them in one pass); ``kind``: its event (evict: a
        clearing event's victim)."""
        mem, s, ev = self.memory, self.s_list, self.events
        if listed:
            self.running.remove(i)
        self.preempted_at[i] = t
        if i in self.prefilling:
            g = self.clock.gen[i]
        else:
            g = self.clock.stop(i) if self.clock.on[i] else self.clock.gen[i]
            self.decode_ctx -= s[i] + g - 1
            self.decode_prompts -= s[i]
        held = mem.held(i)
        # swap only if the request can come back: host room, and can_swap_in (its blocks + 1 above the watermark)
        # not NEVER-like on an empty cache; else it is recomputed (vLLM would keep it swapped out forever)
        if mode == SWAP and mem.host_has_room(held) and mem.num_blocks - (held + 1) >= mem.watermark_blocks:
            blocks = self._free(i, swap=True, computed=s[i] + g - 1)
            self.moved_out += blocks
            self.swapped_bytes[i] += blocks * self.block_bytes_all
            self.state[i] = SWAPPED
            self.swapped.append(i)
            self.pre_swap[i] += 1
            if ev is not None:
                ev.add(t, i, kind, SWAP, s[i] + g - 1)
            return SWAP
        if mode == SWAP:
            self.fallbacks[i] += 1
        dropped = self.prefilled[i] if i in self.prefilling else s[i] + g - 1
        self.recomputed[i] += dropped
        if i in self.prefilling:
            self.prefill_kv -= self.prefilled[i]
            self.prefilling.discard(i)
        if ev is not None:
            ev.add(t, i, kind, "recompute_fallback" if mode == SWAP else RECOMPUTE, dropped)
        self._free(i, computed=dropped)
        if self.paper:  # the paper's eviction: KV and progress lost, the request restarts from its prompt
            g = self.clock.gen[i] = 0
        self.prefilled[i] = 0
        self.target[i] = s[i] + g
        self.state[i] = WAITING
        self.pre_rec[i] += 1
        # vLLM ignores such a prompt (an admission policy's request always fits: _setup rejected any whose prompt +
        # output cannot, and no watermark applies to it)
        if mem.tracks_blocks and not self.adapted and mem.can_allocate(mem.blocks(s[i] + g)) == NEVER:
            self.state[i] = REJECTED
            self.reason[i] = (f"recompute after preemption needs {mem.blocks(s[i] + g)} blocks for prompt + "
                              f"generated = {s[i] + g} tokens; the watermark leaves "
                              f"{mem.num_blocks - mem.watermark_blocks}")
            if ev is not None:
                ev.add(t, i, "reject")
        return RECOMPUTE

    def _free(self, i: int, swap: bool = False, computed: int = 0) -> int:
        """Release request i's GPU blocks (to host space with ``swap``); a loan it held goes back to its host, whose
        next block boundary then moves. ``computed``: its context tokens whose KV is computed (prefix caching keeps
        their full blocks). Returns the blocks it held."""
        mem = self.memory
        host = mem.loans[i][0] if mem.loans and i in mem.loans else None
        if self.cache is not None:
            return mem.swap_out(i, computed) if swap else mem.release(i, computed)
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
        self.decode_prompts += self.s_list[i]
        if self.events is not None:
            self.events.add(t, i, "swap_in", tokens=self.s_list[i] + g - 1)

    def _start_prefill(self, i: int, t: float) -> None:
        mem = self.memory
        self.waiting.remove(i)  # usually the head: deque.remove is O(position)
        self.state[i] = RUNNING
        self.running.append(i)
        self.prefilling.add(i)
        self.target[i] = target = self.s_list[i] + self.clock.gen[i]
        self.prefilled[i] = 0
        if self.cache is not None:  # prefix caching: the prefill starts past its cached prefix
            hit = self.prefilled[i] = mem.start(i, target)
            self.prefill_kv += hit
            if self.first_sched[i] != self.first_sched[i]:
                self.prefix_first[i] = hit
            else:
                self.prefix_again[i] += hit
        elif mem.tracks_blocks:
            mem.hold(i, mem.blocks(target))
        if self.first_sched[i] != self.first_sched[i]:
            self.first_sched[i] = t
        elif self.preempted_at[i] == self.preempted_at[i]:  # back after a preemption
            self._resumed(i, t)
        if self.events is not None:
            self.events.add(t, i, "admit", tokens=target)

    def _token(self, i: int, end: float) -> None:
        """Request i (off the clock) produced a token at ``end``."""
        if self.first_token[i] != self.first_token[i]:
            self.first_token[i] = end
            if self.events is not None:
                self.events.add(end, i, "first_token")
        else:
            gap = end - self.last_token[i]
            self.off_clock_gaps.append(gap)
            if gap > self.max_gap[i]:
                self.max_gap[i] = gap
        self.last_token[i] = end

    def _finish(self, finished, stamp: float, step: int) -> None:
        """The requests in ``finished`` produced their last token in iteration ``step``, stamped ``stamp``."""
        state, running, tracks, ev = self.state, self.running, self.memory.tracks_blocks, self.events
        for i in finished:
            if ev is not None:
                ev.add(stamp, i, "finish")
            self.completion[i] = stamp
            self.done_round[i] = step
            state[i] = DONE
            running.remove(i)
            if tracks:  # the paper's memory holds nothing per request
                self._free(i, computed=self.s_list[i] + self.o_list[i] - 1)
            self.reserved_ids.discard(i)

    def _in_flight(self, end: float, kv: int) -> None:
        """In a cluster, an iteration that finishes requests: the load it ran with (outstanding requests, KV in use),
        which a router sees until ``end`` (the loop pauses after applying the finishes; kvstudy/cluster/driver.py)."""
        self.inflight = (end, len(self.waiting) + len(self.running) + len(self.swapped), kv)

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
        if self.paper:  # the paper's o decode rounds after the prompt's round: o + 1 tokens in this loop's count
            self.o_list = o = [x + 1 for x in o]
        self.a_list = r.arrival_time.tolist()
        self.pred_list = self.pred.tolist()
        self.id_list = r.request_id.tolist()
        if self.arch is not None:  # host space and copy sizes (the paper's memory needs neither)
            mem.bind(kv_bytes_per_gpu(self.arch, self.hw))
            self.swap.bind(self.arch, self.hw, mem.block_size)
            self.block_bytes_all = mem.block_size * self.arch.kv_bytes_per_token(1)
        elif mem.tracks_blocks:
            raise KvStudyError(f"memory={mem.name} needs the model and hardware (host space, copy sizes)")
        #: prefix caching's bookkeeping (kvstudy/memory/prefix.py), None when off: every branch on it is skipped
        self.cache = getattr(mem, "cache", None) if mem.tracks_blocks else None
        self.prefix_first, self.prefix_again = [0] * n, [0] * n  # tokens served from the cache: first / later prefills
        self.cache_rows = None
        if self.cache is not None:
            mem.set_segments(r.segments)
            self.cache_rows = []  # per iteration: cached blocks, evictions so far
        self.state = state = np.full(n, FUTURE, dtype=np.int8)
        self.first_sched, self.first_token, self.completion = [math.nan] * n, [math.nan] * n, [math.nan] * n
        self.last_token, self.max_gap = [math.nan] * n, [0.0] * n
        self.off_clock_gaps = []  # gaps between tokens produced off the decode clock (pooled TBT)
        self.clock = DecodeClock(n, s, o, mem.block_size if mem.tracks_blocks else 0, mem.gpu, self.last_token,
                                 self.max_gap, gaps=not self.paper)
        self.generated = _Generated(self.clock)
        self.prefilled, self.target = [0] * n, list(s)
        self.waiting, self.running, self.swapped = deque(), [], deque()
        self.prefilling, self.growing, self.reserved_ids = set(), set(), set()
        self.pre_rec, self.pre_swap, self.fallbacks = [0] * n, [0] * n, [0] * n
        self.preempted_at, self.preempted_s = [math.nan] * n, [0.0] * n
        self.recomputed, self.swapped_bytes = [0] * n, [0] * n
        self.decode_ctx = 0  # sum of s + generated - 1 over running requests past their prefill (cached contexts)
        self.decode_prompts = 0  # sum of s over the same requests (decode_ctx + their count - this: their tokens)
        self.prefill_kv = 0  # KV tokens of running requests still in their prefill
        #: the furthest each request's prefill has got in any life: a chunk beyond it is progress (engine.stall_limit
        #: counts iterations without a token, but a prompt longer than stall_limit chunks takes more than that)
        self.furthest = [0] * n
        self.reason = [""] * n
        #: in a cluster, (end, outstanding, KV in use) of the iteration in flight when it finishes requests: what a
        #: router sees before that end (the loop pauses after applying it; kvstudy/cluster/driver.py ReplicaView)
        self.inflight = None
        out = r.output_tokens.tolist()
        adapted = self.adapted
        if adapted:
            self.policy.forget()  # a second run of this engine starts from nothing, as the first
        self.events = ev = EventLog() if self.record_events else None
        for i in range(n):
            why = mem.rejection(s[i], out[i], watermark=not adapted)
            if why:
                state[i], self.reason[i] = REJECTED, why
                if ev is not None:
                    ev.add(self.a_list[i], i, "reject", step=-1)
        # the paper's records (kvstudy/records.py): each request's admission round and first token of the life that
        # completes it (an overflow round moves its survivors' schedules one round later), and its last round
        self.p_round, self.admit_stamp, self.done_round = [-1] * n, [math.nan] * n, [-1] * n
        if adapted:  # it keeps its own queue orders: the engine's needs O(1) removal
            self.waiting = _WaitingSet()

    def run(self) -> EngineResult:
        """Run every request to its end (or the run's stop) and return the run's records."""
        loop = self.loop(cluster=False)
        try:
            next(loop)  # alone on its clock the loop never pauses: it returns at once
        except StopIteration as stop:
            return stop.value
        raise KvStudyError("the engine paused outside a cluster")  # a bug: never reached

    def loop(self, cluster: bool = True):
        """The loop as a generator. Alone (``run``) it never pauses. In a cluster (kvstudy/cluster/driver.py) it
        pauses before a decision at a clock at or past its *horizon* (the next arrival, which the driver must route
        first), yielding that clock, and is sent its next horizon; decisions before the horizon run without a pause
        (replicas do not interact between arrivals). Idle with nothing to do it yields ``IDLE`` and is sent the
        arrival time of the next request routed to it (None: none will come), then pauses at that clock. Its
        requests routed to other replicas are marked ``ELSEWHERE`` by the driver; it returns the run's records
        (``StopIteration.value``)."""
        self._setup()
        n, mem, clock = len(self.r), self.memory, self.clock
        name = getattr(self.policy, "name", type(self.policy).__name__)
        s, o, a = self.s_list, self.o_list, self.a_list
        state, waiting, running, swapped = self.state, self.waiting, self.running, self.swapped
        prefilling, growing, prefilled, target = self.prefilling, self.growing, self.prefilled, self.target
        bs, num_blocks, capacity, paper, tracks = (mem.block_size, mem.num_blocks, mem.capacity_tokens, self.paper,
                                                   mem.tracks_blocks)
        view = StepView(self, 0, 0.0)  # its containers are the engine's own: one view serves every step
        cache, cache_rows = self.cache, self.cache_rows
        ev = self.events
        first_token, last_token = self.first_token, self.last_token
        log = []
        seconds = self.seconds
        swap_seconds, overlap = self.swap.seconds, self.swap.overlap
        needs_generated = self.needs_generated
        t, step, nxt, no_token, completed, clearing = 0.0, 0, 0, 0, 0, 0
        overflow = getattr(self.policy, "overflow_victims", None)  # the engine detects overflow for this policy
        # what the engine checks of a decision: everything, except the adapter's on the paper's memory, which holds
        # just the positions the adapter validated (kvstudy/policies/admission.py ``positions``) and has no capacity
        # to check (constraint (3): admissions are not charged; an overflow is caught at the next round)
        check = not (paper and self.adapted)
        policy_s = 0.0  # wall time inside policy.step (the scheduling overhead CacheOPT's Sec. 5.3 compares)
        status, message = "completed", ""
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=n, desc=name, unit="req", leave=False)
        # arrivals: ``paper``, every request arrived by the clock joins before a decision; ``authors_code`` (the MC-SF
        # authors' event order, memory=paper): an arrival at the instant a batch ends joins after the next batch is
        # formed, and an idle engine wakes for one arrival alone (later ones at that instant wait for its batch)
        strict = self.arrivals == "authors_code"
        self.idled = False  # authors_code: the last step was an idle second, whose end arrivals join at (inclusive)
        at_start = self.at_start
        since_completion = 0  # clearing events since a request last completed (engine.stall_limit)

        def wake():
            """The next arrival, which an idle engine jumps to (None: nothing left to arrive; the caller rounds it up to a
            whole round under latency=unit on the paper's memory); under authors_code that request joins the queue at
            once, alone."""
            nonlocal nxt
            if strict:
                while nxt < n and state[nxt] != FUTURE:  # rejected requests never arrive
                    nxt += 1
                if nxt >= n:
                    return None
                state[nxt] = WAITING
                waiting.append(nxt)
                nxt += 1
                return a[nxt - 1]
            return a[nxt] if nxt < n else None

        try:
            horizon = -math.inf  # in a cluster: the next arrival; decisions before it need no routing first
            while True:
                if cluster and t >= horizon:  # the driver routes the requests arriving by t before this one decides
                    horizon = yield t
                inclusive = not strict or self.idled
                while nxt < n and (a[nxt] <= t if inclusive else a[nxt] < t):
                    if state[nxt] == FUTURE:
                        state[nxt] = WAITING
                        waiting.append(nxt)
                    nxt += 1
                self.idled = False
                if not waiting and not running and not swapped:
                    woke = (yield IDLE) if cluster else wake()
                    if woke is None:
                        break
                    t = float(math.ceil(woke)) if at_start else woke
                    horizon = -math.inf  # woken: first others arriving at that instant are routed
                    continue
                if step >= self.max_iterations:
                    status, message = "max_iterations", f"stopped after {step} iterations (engine.max_iterations)"
                    break
                if growing:
                    growing.clear()
                if clock.grow_at.get(clock.D):
                    growing.update(clock.growing())
                view.step, view.time, view.num_arrived = step, t, nxt
                if ev is not None:
                    ev.step = step
                if overflow is not None and mem.overflows(self.decode_ctx + len(running), len(growing)):
                    # an over-committing admission policy (kvstudy/policies/admission.py): a clearing event
                    t0 = perf_counter()
                    try:
                        victims = overflow(view)
                        policy_s += perf_counter() - t0
                        dt = self._clear(victims, t, log, name)
                    except PolicyError as exc:
                        raise self._located(exc, step, t) from None
                    t += dt
                    step += 1
                    clearing += 1
                    since_completion += 1
                    if since_completion >= self.stall_limit:
                        status = "no_progress"
                        message = (f"{since_completion} clearing events in a row without a completed request "
                                   f"(engine.stall_limit={self.stall_limit}); the policy keeps overflowing memory")
                        break
                    continue
                t0 = perf_counter()
                try:  # a refused decision (the adapter's, or _check's) names where the run was
                    d = self.policy.step(view)
                    policy_s += perf_counter() - t0
                    # every running request decodes, nothing else: what _check's first test passes, checked here
                    decode_only = d.__class__ is Decision and d.decode_all and not (
                        d.preempt or d.swap_in or d.prefill or d.decode or d.reserve or d.lend)
                    if check and not (decode_only and (not tracks or mem.used + len(growing) <= num_blocks)):
                        self._check(d, name)
                except PolicyError as exc:
                    raise self._located(exc, step, t) from None
                if decode_only and not (prefilling or self.reserved_ids) and running:
                    # the most common step, the general path's arithmetic without its empty branches: every running
                    # request decodes, nothing else happens
                    n_dec, ctx_now = len(running), self.decode_ctx
                    if growing or clock.D in clock.grow_at:
                        grew = [i for i in growing if clock.on[i]]
                        for i in grew:
                            mem.hold(i, (s[i] + clock.generated(i) + bs - 1) // bs)
                        clock.grown(grew)
                    if ev is not None:
                        ev.decoded(running)
                    compute = seconds(NO_CHUNKS, n_dec, ctx_now, ctx_now + n_dec - self.decode_prompts)
                    dt = max(compute, 0.0) if overlap else compute + 0.0
                    end = t + dt
                    stamp = t if at_start else end
                    finished = clock.tick(stamp)
                    left_ctx = left_prompts = 0
                    for i in finished:
                        clock.stop(i)
                        left_ctx += s[i] + o[i] - 1
                        left_prompts += s[i]
                    if paper:
                        log.append((t, dt, n_dec, 0, n_dec, ctx_now + n_dec, capacity, False, 0))
                    else:
                        log.append((t, dt, n_dec, 0, n_dec, ctx_now + n_dec, capacity, False, 0, mem.used, 0,
                                    num_blocks - mem.used, mem.host_used, 0.0, 0, 0, 0, 0))
                        if cache is not None:
                            cache_rows.append((len(cache.ref) + len(cache.evictor), cache.evictions))
                    self.decode_ctx = ctx_now + n_dec - left_ctx
                    self.decode_prompts -= left_prompts
                    if finished:
                        if cluster:
                            self._in_flight(end, mem.used if tracks else ctx_now + n_dec)
                        since_completion = 0
                        self._finish(finished, stamp, step)
                        completed += len(finished)
                        if bar is not None:
                            bar.update(len(finished))
                    no_token = 0
                    t = end
                    view.last_iteration_seconds = dt
                    step += 1
                    continue
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
                prefills = d.prefill
                if cache is not None:  # a prefill skips its cached prefix: a chunk runs past it, capped at the rest
                    prefills = []
                    for i, chunk in d.prefill:
                        if state[i] == WAITING:
                            self._start_prefill(i, t)
                        chunk = min(chunk, target[i] - prefilled[i])
                        mem.advance(i, prefilled[i] + chunk)  # its blocks filled in this step are cached now
                        prefills.append((i, chunk))
                for i, chunk in prefills:
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
                    if growing or clock.D in clock.grow_at:  # (never on the paper's memory: no blocks)
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
                    if not (d.preempt or d.swap_in or running or swapped):
                        woke = (yield IDLE) if cluster else wake()
                        if woke is not None:
                            if at_start:
                                woke = float(math.ceil(woke))
                            t = max(t, woke)  # idle: nothing runs until the next arrival
                            horizon = -math.inf
                            continue
                        if overflow is not None:  # an admission policy that admits nothing now never will
                            first = min(waiting)  # the first in arrival order
                            prediction = getattr(self.policy, "prediction", None)  # as the policy sees it
                            status = "stalled"
                            message = (f"policy '{name}' admits none of {len(waiting)} waiting request(s) on an idle "
                                       f"engine (first: request {self.id_list[first]}, prompt {s[first]}, predicted "
                                       f"output {prediction(first) if prediction else self.pred_list[first]}, "
                                       f"capacity {mem.capacity_tokens})")
                            break
                    no_token += 1
                    if no_token >= self.stall_limit:
                        status = "stalled" if not running else "no_progress"
                        message = (f"policy '{name}' ran no request in {no_token} iterations in a row "
                                   f"(engine.stall_limit={self.stall_limit}) with {len(waiting)} waiting, {len(running)} "
                                   f"running and {len(swapped)} swapped")
                        break
                    continue
                if ev is not None:
                    ev.prefilled(prefills)
                    ev.decoded([i for i in running if i not in prefilling] if d.decode_all else d.decode)
                if d.decode_all:  # the decodes' produced tokens (the MC-SF authors' formula counts them)
                    gen_sum = ctx_now + n_dec - self.decode_prompts
                else:
                    gen_sum = sum(clock.gen[i] for i in d.decode) if listed and needs_generated else 0
                compute = seconds(chunks, n_dec, ctx_now, gen_sum)
                dt = max(compute, swap_s) if overlap else compute + swap_s
                end = t + dt
                stamp = t if at_start else end  # when this iteration's tokens are stamped
                # tokens: one per decoder, one per prefill whose last chunk ran
                self.decode_ctx += n_dec
                finished = []
                if d.decode_all:
                    finished = clock.tick(stamp)
                    for i in finished:
                        clock.stop(i)
                elif listed:
                    for i in d.decode:
                        clock.gen[i] += 1
                        self._token(i, stamp)
                        if clock.gen[i] == o[i]:
                            finished.append(i)
                left_ctx = left_prompts = 0
                for i in finished:
                    left_ctx += s[i] + o[i] - 1
                    left_prompts += s[i]
                done_at_prefill, produced, prefill_tokens, advanced = 0, n_dec, 0, False
                furthest = self.furthest
                for i, chunk in prefills:
                    p = prefilled[i] + chunk
                    if p > furthest[i]:  # a chunk past where this request's prefill ever got: progress, no token yet
                        furthest[i] = p
                        advanced = True
                    prefilled[i] = p
                    prefill_tokens += chunk
                    self.prefill_kv += chunk
                    if p == target[i]:
                        prefilling.discard(i)
                        self.prefill_kv -= p
                        produced += 1
                        clock.gen[i] += 1
                        if first_token[i] != first_token[i]:  # its first token (NaN before): no gap to count
                            first_token[i] = last_token[i] = stamp
                            if ev is not None:
                                ev.add(stamp, i, "first_token")
                        else:
                            self._token(i, stamp)
                        if paper:  # the paper's records: this life's admission round and first token
                            self.p_round[i], self.admit_stamp[i] = step, stamp
                        if clock.gen[i] == o[i]:
                            finished.append(i)
                            done_at_prefill += p
                        else:
                            self.decode_ctx += p  # = s + generated - 1: it decodes from the next iteration
                            self.decode_prompts += s[i]
                if listed:  # back on the clock, all who decode from here on
                    for i in running:
                        if i not in prefilling and state[i] == RUNNING and clock.gen[i] < o[i]:
                            clock.start(i, clock.gen[i])
                else:
                    for i, _ in prefills:
                        if i not in prefilling and clock.gen[i] < o[i]:
                            clock.start(i, clock.gen[i])
                # KV held during this iteration (before completions free it), and blocks held beyond it
                reserved = self._reserved_blocks() if prefilling or self.reserved_ids else 0
                if paper:  # the paper's nine columns: its round's decoders, sum(s + j + 1), not the prompts it admits
                    log.append((t, dt, len(chunks) + n_dec, prefill_tokens, n_dec, ctx_now + n_dec, capacity, False, 0))
                else:
                    log.append((t, dt, len(chunks) + n_dec, prefill_tokens, n_dec,
                                self.decode_ctx + self.prefill_kv + done_at_prefill, capacity, False, len(d.preempt),
                                mem.used, reserved, num_blocks - mem.used, mem.host_used, swap_s, partial, n_rec,
                                len(d.preempt) - n_rec, len(d.swap_in)))
                    if cache is not None:
                        cache_rows.append((len(cache.ref) + len(cache.evictor), cache.evictions))
                self.decode_ctx -= left_ctx
                self.decode_prompts -= left_prompts
                if finished:
                    if cluster:
                        self._in_flight(end, mem.used if tracks else ctx_now + n_dec)
                    since_completion = 0
                    self._finish(finished, stamp, step)
                completed += len(finished)
                if bar is not None and finished:
                    bar.update(len(finished))  # tqdm redraws at most every mininterval
                no_token = 0 if produced or advanced else no_token + 1
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
        finally:
            if bar is not None:  # cleared before anything is printed: an error never lands on the bar's line
                bar.close()
        for i in running:  # a run stopped early: tokens of requests still on the clock
            if clock.on[i]:
                clock.stop(i)
        if status == "completed" and n and not cluster and not (state == DONE).any():  # every request rejected
            first = int(np.flatnonzero(state == REJECTED)[0]) if (state == REJECTED).any() else 0
            status = "nothing_served"
            message = (f"no request was served: all {n} were rejected (request {self.id_list[first]}: "
                       f"{self.reason[first] or 'see reject_reason'})")
        if self.paper:  # the paper's memory: the tables the old paper loop wrote, column for column
            result = records.paper_result(self, log, status, message, clearing)
        else:
            rejected = int((state == REJECTED).sum())
            if status == "completed" and rejected:
                message = f"{rejected} request(s) rejected (see reject_reason)"
            result = records.paged_result(self, log, status, message, clearing)
            if not cluster:  # a cluster pools every replica's gaps once (kvstudy/cluster/driver.py)
                result.extra["tbt_pooled"] = records.pooled_tbt(self)
            result.extra["policy_seconds"] = round(policy_s, 4)
            result.extra["policy_us_per_iteration"] = round(1e6 * policy_s / max(1, len(log)), 2)
        if ev is not None:
            result.events, result.batches = ev.tables(self.r.request_id)
        return result
