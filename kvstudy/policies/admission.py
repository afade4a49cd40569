"""Admission-only policies (``order`` + ``admit``) in the one loop, on either memory model: the engine's adapter
(issue 34, items 1 and 2). On the paper's memory it reproduces the old paper loop's view and decisions exactly; on
paged memory it is what lets MC-SF and its family run beside the vLLM family.

An admission-only policy (MC-SF, MC-Benchmark, alpha-protection, ``fcfs_watermark``, a new idea written as a
:class:`~kvstudy.policies.base.Policy`) says which waiting requests start; it preempts only when memory overflows.
:class:`Admission` makes it a step policy of the one loop (kvstudy/engine/loop.py), so it runs on
``memory=paged`` beside vLLM, Sarathi, the RR-SJF family and CacheOPT, on the same requests and token convention:

* every step, every running request decodes (``decode_all``) and the requests the policy admits start their prefill
  whole (prompt plus the tokens generated before a preemption, as a recompute does);
* overflow: when the running requests' next tokens need more blocks than the cache has (possible only when a
  policy over-commits: protection heuristics, under-predictions), the engine calls :meth:`Admission.overflow_victims`,
  which asks the policy's ``on_overflow`` for victims; the engine recomputes them (the paper's clearing) and
  charges the event as ``engine.overflow_cost`` says (``batch``: the overflowing batch's latency, no token).

What the policy sees is a :class:`SchedulerView` in the MC-SF paper's frame (Sec. 2). On the paper's memory that is
the memory's own convention (predictions are decode rounds; capacity and KV in tokens, the admission round free). On
paged memory eq. (5) keeps its form under vLLM's token convention (the first token comes with the prefill, o - 1
decodes follow):

* a running request with g tokens generated has completed ``running_generated`` = g - 1 decode rounds and holds
  prompt + g tokens in this iteration; its ``running_predicted`` is predicted - 1 decode rounds;
* a waiting request is what its next prefill will be: ``waiting_prompt`` = prompt + g (g > 0 after a recompute
  preemption), ``waiting_predicted`` = max(0, predicted - 1 - g) decode rounds after it;
* ``capacity`` is the cache's blocks x ``block_size`` tokens, ``running_kv_tokens`` the blocks the running requests'
  contexts need in this iteration (prompt + generated tokens each, rounded up to blocks), in tokens; a policy counts
  a request's KV in whole blocks
  with ``view.kv_need`` (MC-SF's eq. (5): :class:`~kvstudy.policies.memory_check.BlockFutureMemory`).

The waiting arrays are in arrival order (request index); a recompute victim regains its arrival position (the
paper's "returned to the queue"), whatever the engine's own queue order is. No watermark: the policy's own budget
is the rule (``fcfs_watermark``'s ``watermark`` is its threshold), and a request is rejected only when it cannot fit
the whole cache (vLLM's watermark rule for rejecting a prompt is the vLLM family's).
"""
from __future__ import annotations

from itertools import islice
from typing import List

import numpy as np
from sortedcontainers import SortedList

from kvstudy.errors import ConfigError
from kvstudy.policies.base import Policy, SchedulerView
from kvstudy.policies.step import Decision, StepPolicy
from kvstudy.policies.request_states import WAITING, PolicyError

DECODE_ALL = Decision(decode_all=True)


class _View(SchedulerView):
    """A ``SchedulerView`` of the step engine's state, its arrays built on first read (see module docstring)."""

    def __init__(self, adapter: "Admission", sv) -> None:
        mem = sv.memory
        self.round, self.time = sv.step, sv.time
        if mem.tracks_blocks:
            self.block_size = mem.block_size
            self.capacity = mem.num_blocks * mem.block_size
            self.running_kv_tokens = (mem.used + len(sv.growing)) * mem.block_size
        else:  # the paper's memory: tokens, constraint (3)
            self.capacity = mem.capacity_tokens
            self.running_kv_tokens = sv.decode_need_tokens
        self._a, self._sv = adapter, sv

    @property
    def num_waiting(self) -> int:
        return len(self._a._waiting)

    def _waiting_arrays(self) -> dict:
        sv, idx = self._sv, list(self._a._waiting)
        gen = sv.waiting_generated
        g = np.fromiter((gen[i] for i in idx), dtype=np.int64, count=len(idx))
        ids = np.asarray(idx, dtype=np.int64)
        return {"waiting_ids": self._a._ids[ids],
                "waiting_prompt": self._a._prompt[ids] + g,
                "waiting_predicted": np.maximum(self._a._pred[ids] - self._a._shift - g, 0),
                "waiting_arrival": self._a._arrival[ids]}

    def _running_arrays(self) -> dict:
        sv = self._sv
        run = np.asarray(sv.running, dtype=np.int64)
        g = sv.decode_count - self._a._off[run]  # every running request decodes in every counted iteration
        return {"running_ids": self._a._ids[run], "running_prompt": self._a._prompt[run],
                "running_generated": g - 1, "running_predicted": self._a._pred[run] - self._a._shift,
                "running_arrival": self._a._arrival[run]}

    def running_signature(self):
        """Requests join the running set only by this adapter's admissions; an eviction (counted in ``_evictions``)
        changes the key, and so does another run (its token). Every running request decodes in every counted
        iteration (an overflow event counts none, and evicts), so the decode count is the rounds; members are engine
        indices."""
        a, sv = self._a, self._sv
        return (a._run, a._evictions), sv.decode_count, sv.running

    def waiting_member(self, pos: int) -> int:
        return self._a._waiting[pos]

    def sharing_version(self) -> int:
        """Changes whenever a block two or more requests hold gains or loses a holder (the prefix cache's
        ``multi_version``): until it does, ``duplicate_blocks`` charges the same requests (a policy keeping what it
        computed from them, MC-SF's prefix-aware eq. (5), may reuse it)."""
        return self._sv.memory.cache.multi_version

    def __getattr__(self, name: str):
        if name not in SchedulerView.ARRAYS:
            raise AttributeError(name)
        self.__dict__.update(self._waiting_arrays() if name.startswith("waiting") else self._running_arrays())
        return self.__dict__[name]

    # --- prefix caching (memory.prefix_caching=true; MC-SF's prefix_aware eq. (5), kvstudy/policies/mcsf.py) ----------
    def duplicate_blocks(self, d: np.ndarray) -> np.ndarray:
        """Per running request (the running arrays' order), the blocks it holds that another running request also
        holds and is predicted to hold longer (``d``: decode rounds left; ties: the earlier admitted is charged): a
        shared block charged once, to its longest-lived holder."""
        cache, running = self._sv.memory.cache, self._sv.running
        if not cache.multi:
            return np.zeros(len(running), dtype=np.int64)
        # the owners change only when who holds a shared block changes, or the running list does (every running
        # request decodes each step, so the order of their d does not change): reuse the last answer until then
        memo = self._a._duplicates
        if memo is not None and memo[0] == cache.multi_version and memo[1] == running:
            return memo[2]
        dup = np.zeros(len(running), dtype=np.int64)
        where = {i: k for k, i in enumerate(running)}
        rank = {i: (-d[k], k) for i, k in where.items()}
        users = cache.users
        for key in cache.multi:
            us = users[key]
            owner = min(us, key=rank.__getitem__)
            for i in us:
                if i != owner:
                    dup[where[i]] += 1
        self._a._duplicates = (cache.multi_version, list(running), dup)
        return dup

    def shared_tokens(self, pos: int, predicted: int) -> int:
        """Tokens of waiting request ``pos``'s next prefill held now by running requests predicted to hold them for
        at least its ``predicted`` decode rounds: its leading blocks, up to the first that is not (at most
        prompt - 1 tokens, as the prefill computes its last token)."""
        sv, a = self._sv, self._a
        mem = sv.memory
        users = mem.cache.users
        i = a._waiting[pos]
        tokens = sv.prompt[i] + sv.waiting_generated[i]
        keys = mem.keys(i, tokens)
        if users and "_left" not in self.__dict__:  # once per view: each running request's decode rounds left
            left = (self.running_predicted - self.running_generated - 1).tolist()
            self._left = dict(zip(sv.running, left))
        left = self.__dict__.get("_left")
        n, most = 0, min(len(keys), (tokens - 1) // mem.block_size)
        while n < most:
            us = users.get(keys[n])
            if not us or max(left[j] for j in us) < predicted:
                break
            n += 1
        return n * mem.block_size

    def head_prompts(self, k: int) -> np.ndarray:
        gen, prompt = self._sv.waiting_generated, self._sv.prompt
        return np.array([prompt[i] + gen[i] for i in islice(self._a._waiting, k)], dtype=np.int64)

    def ordered_waiting(self, by: str):
        """Served from the adapter's own orders (arrival; eq. (6)'s shortest predicted first), lazily: a policy that
        stops at the first request that does not fit reads only the head (as the old paper loop's view did)."""
        a, sv = self._a, self._sv
        gen, prompt, waiting = sv.waiting_generated, sv.prompt, a._waiting
        if by == "arrival":
            for pos, i in enumerate(waiting):
                yield pos, prompt[i] + gen[i], max(0, a._pred_list[i] - a._shift - gen[i])
        elif by == "predicted" and a._by_pred is not None:
            n = a._n
            for key in a._by_pred:
                i = key % n
                yield waiting.bisect_left(i), prompt[i] + gen[i], key // n
        else:
            yield from super().ordered_waiting(by)


def positions(returned, size: int, what: str, name: str) -> np.ndarray:
    """A policy's answer (positions into the waiting or the running arrays) checked: an integer sequence or array,
    each in 0..size - 1, none twice; else one line naming the policy and the problem."""
    if type(returned) is np.ndarray and returned.dtype == np.int64 and returned.ndim == 1:  # the usual answer
        arr = returned
        if len(arr) == 0:
            return arr
        if arr[0] >= 0 and arr.max() < size and (len(arr) == 1 or arr.min() >= 0):
            if len(arr) == 1 or len(set(arr.tolist())) == len(arr):
                return arr
    if returned is None or isinstance(returned, (dict, str, bytes, set)):
        raise PolicyError(f"policy '{name}' returned {type(returned).__name__} for its {what}s; expected an array or "
                          f"list of positions (whole numbers 0..{size - 1})")
    arr = np.asarray(returned)
    if arr.size and (arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer)):
        kind = "a boolean mask" if arr.dtype == bool else f"values of type {arr.dtype}"
        raise PolicyError(f"policy '{name}' returned {kind} for its {what}s; expected positions (whole numbers "
                          f"0..{size - 1}), e.g. np.flatnonzero(mask)")
    arr = arr.astype(np.int64, copy=False).ravel()
    if len(arr) == 0:
        return arr
    if arr.min() < 0 or arr.max() >= size:
        bad = int(arr[(arr < 0) | (arr >= size)][0])
        raise PolicyError(f"policy '{name}' returned {what} position {bad}, outside 0..{size - 1}")
    if len(arr) > 1 and len(set(arr.tolist())) != len(arr):
        raise PolicyError(f"policy '{name}' returned a {what} position twice")
    return arr


class Admission(StepPolicy):
    """An admission-only :class:`Policy` as a step policy of the one loop (module docstring)."""

    preemptive = True

    def __init__(self, policy: Policy, max_batch=None, raise_on_eviction: bool = False) -> None:
        """``max_batch``: at most that many requests run (decodes first; admissions cut in the policy's order to the
        slots left: the authors' alpha scripts' B). ``raise_on_eviction``: an evicted request's prediction, as the
        policy sees it, rises to at least one more than the tokens it had produced (the Fig. 5 remedy)."""
        self.policy, self.name = policy, policy.name
        self.max_batch, self.raise_on_eviction = max_batch, raise_on_eviction
        self.forget()

    def reset(self, seed: int) -> None:
        self.policy.reset(seed)
        self.forget()

    def forget(self) -> None:
        """Drop what the adapter kept of a run (the engine calls this when a run starts)."""
        # waiting requests sorted by index (= arrival order, ties by id), and eq. (6)'s keys: blocked sorted lists, so
        # joining, leaving and reading a position cost O(log n) at any queue length (a Python list's deletes move
        # O(n) pointers: alpha-greedy 21 -> 44 us per iteration from 10^5 to 10^6 requests, issue 59)
        self._waiting = SortedList()
        self._by_pred = SortedList() if getattr(self.policy, "waiting_order", None) == "predicted" else None
        self._arrived = 0
        self._returned: List[int] = []  # overflow victims, to re-enter the orders at the next step
        self._duplicates = None  # MC-SF's prefix-aware eq. (5): the last duplicate_blocks answer and when it was made
        self._n = 0
        self._prompt = None
        self._run = object()  # this run, for running_signature: a key of another run never equals one of this
        self._evictions = 0  # overflow events so far (running_signature)

    def _bind(self, sv) -> None:
        """First step of a run: the per-request arrays (requests never change during a run)."""
        if sv.memory.tracks_blocks and getattr(self.policy, "admission", "paper") == "authors_code":
            raise ConfigError(f"policy '{self.name}': policy.admission=authors_code checks memory in tokens as the "
                              f"MC-SF authors' scripts do; memory=paged counts blocks: use admission=paper there")
        if getattr(self.policy, "prefix_aware", False):
            if not sv.memory.prefix_caching:
                raise ConfigError(f"policy '{self.name}': policy.prefix_aware=true weighs shared prefix blocks; it needs "
                                  f"memory.prefix_caching=true (memory=paged_prefix)")
            if sv.memory.cache.users is None:
                sv.memory.cache.track_users()
        # predictions in decode rounds: vLLM's convention counts the prefill's token among the predicted output
        self._shift = 0 if sv.memory.convention == "paper" else 1
        self._n = len(sv.state)
        self._prompt = np.asarray(sv.prompt, dtype=np.int64)
        self._pred_list = list(sv.predicted)
        self._pred = np.asarray(sv.predicted, dtype=np.int64)
        # tokens of a running request = the engine's decode count - _off[i]: it starts its prefill (with g tokens)
        # in an iteration that counts (every decision of this adapter decodes all), so it holds g + 1 tokens when
        # the count has risen by one, and one more per count after (an overflow event counts nothing)
        self._off = np.zeros(self._n, dtype=np.int64)
        self._arrival = np.asarray(sv.arrival, dtype=float)
        self._ids = np.asarray(sv.request_id, dtype=np.int64)
        if self._n > 1:
            a, ids = self._arrival, self._ids
            if not np.all((np.diff(a) > 0) | ((np.diff(a) == 0) & (np.diff(ids) > 0))):
                self._by_pred = None  # index order is not arrival order: eq. (6)'s order from the arrays instead

    def prediction(self, i: int) -> int:
        """Request i's predicted output as the policy sees it (raised after an eviction under ``raise_on_eviction``)."""
        return self._pred_list[i] if self._prompt is not None else 0

    def _key(self, i: int, gen) -> int:
        return max(0, self._pred_list[i] - self._shift - gen[i]) * self._n + i

    def _sync(self, sv) -> None:
        """Bring the adapter's queue orders up to date: new arrivals, returned overflow victims."""
        if sv.num_arrived == self._arrived and not self._returned and not sv.joined:
            return
        state, gen = sv.state, sv.waiting_generated
        by_pred = self._by_pred
        waiting = self._waiting
        for i in sv.joined:  # handed off to this replica (disaggregation): in the orders by their arrival
            waiting.add(i)
            if by_pred is not None:
                by_pred.add(self._key(i, gen))
        if sv.num_arrived > self._arrived:
            new = [i for i in range(self._arrived, sv.num_arrived) if state[i] == WAITING]
            waiting.update(new)
            if by_pred is not None:
                by_pred.update([self._key(i, gen) for i in new])
            self._arrived = sv.num_arrived
        if not self._returned:
            return
        back = [i for i in self._returned if state[i] == WAITING]  # not rejected after a preemption
        waiting.update(back)
        if by_pred is not None:
            by_pred.update([self._key(i, gen) for i in back])
        self._returned = []

    def step(self, sv) -> Decision:
        if self._prompt is None:
            self._bind(sv)
        self._sync(sv)
        if not self._waiting:
            return DECODE_ALL
        view = _View(self, sv)
        waiting = self._waiting
        chosen = positions(self.policy.schedule(view), len(waiting), "admission", self.name)
        if not len(chosen):
            return DECODE_ALL
        cap = self.max_batch
        if cap is not None and len(chosen) > cap - len(sv.running):
            chosen = chosen[: max(0, cap - len(sv.running))]  # decodes first, prompts fill the rest
            if not len(chosen):
                return DECODE_ALL
        admitted = [waiting[k] for k in chosen.tolist()]
        gen, prompt = sv.waiting_generated, sv.prompt
        by_pred = self._by_pred
        if by_pred is not None:
            for i in admitted:
                by_pred.remove(self._key(i, gen))
        if chosen.max() == len(chosen) - 1:  # a prefix of the queue (FCFS policies)
            del waiting[: len(chosen)]
        else:
            for i in admitted:
                waiting.remove(i)
        count, off = sv.decode_count, self._off
        for i in admitted:
            off[i] = count - gen[i]
        return Decision(prefill=[(i, prompt[i] + gen[i]) for i in admitted], decode_all=True)

    def overflow_victims(self, sv) -> List[int]:
        """The engine found that the running requests' next tokens do not fit: the policy's ``on_overflow`` names
        the victims (positions of the running arrays), returned as request indices for the engine to recompute."""
        if self._prompt is None:
            self._bind(sv)
        self._sync(sv)
        view = _View(self, sv)
        run = sv.running
        chosen = positions(self.policy.on_overflow(view), len(run), "eviction", self.name)
        victims = [run[k] for k in chosen.tolist()]
        self._evictions += 1
        if self.raise_on_eviction and victims:
            # the paper's memory only (the engine refuses the setting elsewhere): the paper loop's rule, an evicted
            # request's prediction rises to at least one more than the tokens it had produced (g, its prompt round's
            # token included; it was still running, so its length is larger)
            for i in victims:
                raised = max(self._pred_list[i], sv.generated[i] + 1)
                self._pred_list[i] = raised
                self._pred[i] = raised
        self._returned = list(victims)
        return victims
