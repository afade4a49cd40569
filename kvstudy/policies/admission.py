"""Admission-only policies (``order`` + ``admit``) on paged memory: the engine's adapter (issue 34, item 2).

An admission-only policy (MC-SF, MC-Benchmark, alpha-protection, ``fcfs_watermark``, a new idea written as a
:class:`~kvstudy.policies.base.Policy`) says which waiting requests start; it preempts only when memory overflows.
:class:`Admission` makes it a step policy of the preemptive loop (kvstudy/step_engine.py), so it runs on
``memory=paged`` beside vLLM, Sarathi, the RR-SJF family and CacheOPT, on the same requests and token convention:

* every step, every running request decodes (``decode_all``) and the requests the policy admits start their prefill
  whole (prompt plus the tokens generated before a preemption, as a recompute does);
* overflow: when the running requests' next tokens need more blocks than the cache has (possible only when a
  policy over-commits: protection heuristics, under-predictions), the engine calls :meth:`Admission.overflow`,
  which asks the policy's ``on_overflow`` for victims; the engine recomputes them (the paper's clearing) and
  charges the event as ``engine.overflow_cost`` says (``batch``: the overflowing batch's latency, no token).

What the policy sees is a :class:`SchedulerView` in the MC-SF paper's frame (Sec. 2), so eq. (5) keeps its form
under vLLM's token convention (the first token comes with the prefill, o - 1 decodes follow):

* a running request with g tokens generated has completed ``running_generated`` = g - 1 decode rounds and holds
  prompt + g tokens in this iteration; its ``running_predicted`` is predicted - 1 decode rounds;
* a waiting request is what its next prefill will be: ``waiting_prompt`` = prompt + g (g > 0 after a recompute
  preemption), ``waiting_predicted`` = max(0, predicted - 1 - g) decode rounds after it;
* ``capacity`` is the cache's blocks x ``block_size`` tokens, ``running_kv_tokens`` the blocks the running requests
  need in this iteration (their next tokens included), in tokens; a policy counts a request's KV in whole blocks
  with ``view.kv_need`` (MC-SF's eq. (5): :class:`~kvstudy.policies.memory_check.BlockFutureMemory`).

The waiting arrays are in arrival order (request index); a recompute victim regains its arrival position (the
paper's "returned to the queue"), whatever the engine's own queue order is. No watermark: the policy's own budget
is the rule (``fcfs_watermark``'s ``watermark`` is its threshold).
"""
from __future__ import annotations

import bisect
from itertools import islice
from typing import List

import numpy as np

from kvstudy.errors import ConfigError
from kvstudy.policies.base import Policy, SchedulerView
from kvstudy.policies.step import Decision, StepPolicy

DECODE_ALL = Decision(decode_all=True)
WAITING = 1  # the engine's state code (kvstudy/engine.py)


class _View(SchedulerView):
    """A ``SchedulerView`` of the step engine's state, its arrays built on first read (see module docstring)."""

    def __init__(self, adapter: "Admission", sv) -> None:
        mem = sv.memory
        self.round, self.time = sv.step, sv.time
        self.block_size = mem.block_size
        self.capacity = mem.num_blocks * mem.block_size
        self.running_kv_tokens = (mem.used + len(sv.growing)) * mem.block_size
        self._a, self._sv = adapter, sv

    @property
    def num_waiting(self) -> int:
        return len(self._a._waiting)

    def _waiting_arrays(self) -> dict:
        sv, idx = self._sv, self._a._waiting
        gen = sv.waiting_generated
        g = np.fromiter((gen[i] for i in idx), dtype=np.int64, count=len(idx))
        ids = np.asarray(idx, dtype=np.int64)
        return {"waiting_ids": self._a._ids[ids],
                "waiting_prompt": self._a._prompt[ids] + g,
                "waiting_predicted": np.maximum(self._a._pred[ids] - 1 - g, 0),
                "waiting_arrival": self._a._arrival[ids]}

    def _running_arrays(self) -> dict:
        sv = self._sv
        run = np.asarray(sv.running, dtype=np.int64)
        g = np.fromiter((sv.generated[i] for i in sv.running), dtype=np.int64, count=len(run))
        return {"running_ids": self._a._ids[run], "running_prompt": self._a._prompt[run],
                "running_generated": g - 1, "running_predicted": self._a._pred[run] - 1,
                "running_arrival": self._a._arrival[run]}

    def __getattr__(self, name: str):
        if name not in SchedulerView.ARRAYS:
            raise AttributeError(name)
        self.__dict__.update(self._waiting_arrays() if name.startswith("waiting") else self._running_arrays())
        return self.__dict__[name]

    def head_prompts(self, k: int) -> np.ndarray:
        gen, prompt = self._sv.waiting_generated, self._sv.prompt
        return np.array([prompt[i] + gen[i] for i in islice(self._a._waiting, k)], dtype=np.int64)

    def ordered_waiting(self, by: str):
        """Served from the adapter's own orders (arrival; eq. (6)'s shortest predicted first), lazily: a policy that
        stops at the first request that does not fit reads only the head (as the paper loop's view)."""
        a, sv = self._a, self._sv
        gen, prompt, waiting = sv.waiting_generated, sv.prompt, a._waiting
        if by == "arrival":
            for pos, i in enumerate(waiting):
                yield pos, prompt[i] + gen[i], max(0, a._pred_list[i] - 1 - gen[i])
        elif by == "predicted" and a._by_pred is not None:
            n = a._n
            for key in a._by_pred:
                i = key % n
                yield bisect.bisect_left(waiting, i), prompt[i] + gen[i], key // n
        else:
            yield from super().ordered_waiting(by)


class Admission(StepPolicy):
    """An admission-only :class:`Policy` as a step policy of the preemptive loop (module docstring)."""

    preemptive = True

    def __init__(self, policy: Policy) -> None:
        if getattr(policy, "admission", "paper") == "authors_code":
            raise ConfigError(f"policy '{policy.name}': policy.admission=authors_code checks memory in tokens as the "
                              f"MC-SF authors' scripts do; memory=paged counts blocks: use admission=paper there")
        self.policy, self.name = policy, policy.name
        self._clear()

    def reset(self, seed: int) -> None:
        self.policy.reset(seed)
        self._clear()

    def _clear(self) -> None:
        self._waiting: List[int] = []  # waiting requests, sorted by index (= arrival order, ties by id)
        self._by_pred = [] if getattr(self.policy, "waiting_order", None) == "predicted" else None
        self._arrived = 0
        self._returned: List[int] = []  # overflow victims, to re-enter the orders at the next step
        self._n = 0
        self._prompt = None

    def _bind(self, sv) -> None:
        """First step of a run: the per-request arrays (requests never change during a run)."""
        self._n = len(sv.state)
        self._prompt = np.asarray(sv.prompt, dtype=np.int64)
        self._pred_list = list(sv.predicted)
        self._pred = np.asarray(sv.predicted, dtype=np.int64)
        self._arrival = np.asarray(sv.arrival, dtype=float)
        self._ids = np.asarray(sv.request_id, dtype=np.int64)
        if self._n > 1:
            a, ids = self._arrival, self._ids
            if not np.all((np.diff(a) > 0) | ((np.diff(a) == 0) & (np.diff(ids) > 0))):
                self._by_pred = None  # index order is not arrival order: eq. (6)'s order from the arrays instead

    def _key(self, i: int, gen) -> int:
        return max(0, self._pred_list[i] - 1 - gen[i]) * self._n + i

    def _sync(self, sv) -> None:
        """Bring the adapter's queue orders up to date: new arrivals, returned overflow victims."""
        state, gen = sv.state, sv.waiting_generated
        by_pred = self._by_pred
        for i in range(self._arrived, sv.num_arrived):
            if state[i] == WAITING:
                self._waiting.append(i)
                if by_pred is not None:
                    bisect.insort(by_pred, self._key(i, gen))
        self._arrived = max(self._arrived, sv.num_arrived)
        for i in self._returned:
            if state[i] == WAITING:  # not rejected after its preemption (its recompute can never fit)
                bisect.insort(self._waiting, i)
                if by_pred is not None:
                    bisect.insort(by_pred, self._key(i, gen))
        self._returned = []

    def step(self, sv) -> Decision:
        if self._prompt is None:
            self._bind(sv)
        self._sync(sv)
        if not self._waiting:
            return DECODE_ALL
        view = _View(self, sv)
        chosen = np.asarray(self.policy.schedule(view), dtype=np.int64).ravel()
        if not len(chosen):
            return DECODE_ALL
        waiting = self._waiting
        if chosen.min() < 0 or chosen.max() >= len(waiting) or len(set(chosen.tolist())) != len(chosen):
            from kvstudy.engine import PolicyError

            raise PolicyError(f"policy '{self.name}' returned admission positions outside 0..{len(waiting) - 1} or "
                              f"one twice")
        admitted = [waiting[k] for k in chosen.tolist()]
        gen, prompt = sv.waiting_generated, sv.prompt
        if self._by_pred is not None:
            for i in admitted:
                del self._by_pred[bisect.bisect_left(self._by_pred, self._key(i, gen))]
        if chosen.max() == len(chosen) - 1:
            del waiting[: len(chosen)]
        else:
            for k in sorted(chosen.tolist(), reverse=True):
                del waiting[k]
        return Decision(prefill=[(i, prompt[i] + gen[i]) for i in admitted], decode_all=True)

    def overflow(self, sv) -> List[int]:
        """The engine found that the running requests' next tokens do not fit: the policy's ``on_overflow`` names
        the victims (positions of the running arrays), returned as request indices for the engine to recompute."""
        if self._prompt is None:
            self._bind(sv)
        self._sync(sv)
        view = _View(self, sv)
        run = sv.running
        chosen = np.asarray(self.policy.on_overflow(view), dtype=np.int64).ravel()
        if len(chosen) and (chosen.min() < 0 or chosen.max() >= len(run) or len(set(chosen.tolist())) != len(chosen)):
            from kvstudy.engine import PolicyError

            raise PolicyError(f"policy '{self.name}' returned eviction positions outside 0..{len(run) - 1} or one "
                              f"twice")
        victims = [run[k] for k in chosen.tolist()]
        self._returned = list(victims)
        return victims
