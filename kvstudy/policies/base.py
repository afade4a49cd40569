"""The policy interface: what a scheduler sees each iteration and what it may return.

A policy is two small pieces, as in vLLM's v1 scheduler and SGLang's ``schedule_policy.py``:

* ``order(view)``: a permutation of the waiting queue (which request to consider first);
* ``admit(view, order)``: the waiting requests to start in this iteration, in that order.

The engine owns time and KV-cache accounting (kvstudy/engine/loop.py, through the adapter
kvstudy/policies/admission.py). It builds the ``SchedulerView``, checks every decision (positions of waiting requests,
distinct; on paged memory the prefills must fit now; on the paper's memory admissions are not charged in their own
round, constraint (3)), and handles overflows through ``on_overflow``. A view never holds true output lengths: only predictions (equal to the truth only
under the ``oracle`` predictor).
"""
from __future__ import annotations

from typing import Iterator, Optional, Tuple

import numpy as np


class SchedulerView:
    """Read-only snapshot at the start of one iteration (round). Waiting arrays are in arrival order.

    ``running_generated`` is the number of decode rounds a running request has completed; in this
    round it runs decode ``generated + 1`` and holds ``prompt + generated + 1`` KV tokens (Sec. 2);
    ``running_kv_tokens`` is their sum, the KV in use this round (on paged memory each term rounded up to whole
    blocks: ``block_size`` is set and ``kv_need`` rounds). The engine builds the arrays lazily:
    a policy pays only for the fields it reads (``head_prompts(k)`` reads just the head of the queue).
    """

    #: None: the MC-SF paper's token-granular memory (constraint (3): an admission round is not charged). A number:
    #: paged memory in blocks of that many tokens (the engine's adapter, kvstudy/policies/admission.py): a request's
    #: KV is charged in whole blocks (``kv_need``), its prefill iteration included
    block_size: Optional[int] = None

    ARRAYS = ("waiting_ids", "waiting_prompt", "waiting_predicted", "waiting_arrival", "running_ids",
              "running_prompt", "running_generated", "running_predicted", "running_arrival")

    def __init__(self, round: int, time: float, capacity: int, running_kv_tokens: Optional[int] = None,
                 **arrays) -> None:
        self.round, self.time, self.capacity = round, time, capacity
        unknown = set(arrays) - set(self.ARRAYS)
        if unknown:
            raise TypeError(f"unknown view field(s) {sorted(unknown)}")
        self.__dict__.update(arrays)
        if running_kv_tokens is None:
            running_kv_tokens = int((self.running_prompt + self.running_generated + 1).sum())
        self.running_kv_tokens = int(running_kv_tokens)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting_ids)

    def running_signature(self):
        """``(key, rounds, members)`` or None when unknown (this class: arrays given). ``members``: the running
        requests, named as ``waiting_member`` names waiting ones (in the running arrays' order). Between two views of
        one run with equal ``key``, a request joins the running set only by this policy's admissions, and every
        request running in both has completed exactly the difference of their ``rounds`` more decode rounds. A policy
        may keep what it computed from the running arrays and bring it up to date instead (MC-SF's eq. (5),
        kvstudy/policies/mcsf.py)."""
        return None

    def waiting_member(self, pos: int):
        """The name ``running_signature`` gives the waiting request at ``pos`` once it runs."""
        raise NotImplementedError

    def kv_need(self, tokens):
        """The KV ``tokens`` of context occupy: themselves on the paper's memory, whole blocks on paged memory."""
        bs = self.block_size
        return tokens if bs is None or bs == 1 else -(-tokens // bs) * bs

    def head_prompts(self, k: int) -> np.ndarray:
        """Prompt lengths of the first ``k`` waiting requests (arrival order), without building the rest."""
        return self.waiting_prompt[:k]

    def ordered_waiting(self, by: str) -> Iterator[Tuple[int, int, int]]:
        """(position, prompt, predicted output) of each waiting request, lazily, in arrival order (``by="arrival"``,
        ``fifo_order``) or shortest predicted output first (``by="predicted"``, ``shortest_predicted_order``: eq. (6)
        of Jaillet et al., ties by arrival, then id). A policy that stops at the first request that does not fit
        pays only for the requests it reads: the engine's view serves this from an order it keeps as requests
        join and leave the queue, so a decision costs the same at any queue length (issue 27)."""
        order = fifo_order(self) if by == "arrival" else shortest_predicted_order(self)
        prompts, predicted = self.waiting_prompt, self.waiting_predicted
        for pos in order.tolist():
            yield pos, int(prompts[pos]), int(predicted[pos])


class Policy:
    """Base class: subclasses implement ``order`` and ``admit``; ``on_overflow`` defaults to clearing all."""

    name = "base"

    def reset(self, seed: int) -> None:
        """Called once before a run; a policy keeps no other state between runs."""
        self._rng = np.random.default_rng(seed)

    def order(self, view: SchedulerView) -> np.ndarray:
        """Positions into the waiting arrays, first-considered first."""
        raise NotImplementedError

    def admit(self, view: SchedulerView, order: np.ndarray) -> np.ndarray:
        """Positions (a subset of ``order``) of the waiting requests to start now."""
        raise NotImplementedError

    #: "arrival" or "predicted" if the policy reads the queue only through ``view.ordered_waiting`` in that order:
    #: the engine then keeps that order as requests join and leave (None: it keeps nothing extra)
    waiting_order: Optional[str] = None

    def schedule(self, view: SchedulerView) -> np.ndarray:
        if view.num_waiting == 0:
            return np.empty(0, dtype=np.int64)
        return self.admit(view, self.order(view))

    def on_overflow(self, view: SchedulerView) -> np.ndarray:
        """The true KV need of this round exceeds capacity: positions of running requests to evict
        (back to the queue: on the paper's memory they restart from their prompt; on paged memory they are recomputed,
        keeping their tokens). Default: all of them (alpha-protection greedy, Sec. 5.2)."""
        return np.arange(len(view.running_ids))


def fifo_order(view: SchedulerView) -> np.ndarray:
    """Arrival order; ties by input order (waiting arrays are already in that order)."""
    return np.arange(len(view.waiting_ids))


def shortest_predicted_order(view: SchedulerView) -> np.ndarray:
    """Non-decreasing predicted output length; ties by arrival time, then input order (Alg. 1)."""
    return np.lexsort((view.waiting_ids, view.waiting_arrival, view.waiting_predicted))
