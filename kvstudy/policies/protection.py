"""vLLM-style protection baselines of Jaillet et al., Sec. 5.2.

*alpha-protection greedy*: keep every running request; add waiting prompts in arrival order while the KV
use after adding prompt i (its initial memory s_i + 1) stays within (1 - alpha) M; stop at the first
that does not fit. On an overflow all running requests are cleared (sent back unprocessed).

*alpha-protection beta-clearing*: the same admission; on an overflow each running request is cleared
independently with probability beta (possibly none, in which case the overflow repeats next round).

KV use here is the running requests' memory in this round, sum(s + j + 1), as the engine charges it; on paged memory
(kvstudy/policies/admission.py) each term is rounded up to whole blocks (``view.kv_need``) and a prompt's need
s + 1 is charged in blocks as well.

``admission=authors_code`` runs what the authors' scripts (``alpha-greedy.py``, ``alpha-beta.py``) run instead of
Sec. 5.2's text: when the running requests' KV is at most (1 - alpha) M, *every* waiting prompt is admitted in
arrival order, none checked (up to their batch cap ``B``, undefined in the files: no cap unless ``engine.max_batch``
is set); and a beta-clearing pass draws one
uniform per running request in ascending request id (the scripts draw from an unseeded ``random`` over a set).
docs/authors_code.md.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from kvstudy.config.validate import check_group
from kvstudy.policies.base import Policy, SchedulerView, fifo_order


class AlphaProtection(Policy):
    name = "alpha_protection"

    def __init__(self, alpha: float = 0.3, beta: Optional[float] = None, admission: str = "paper") -> None:
        # every value against its declaration in kvstudy/config/schema.py (beta: null is greedy clearing)
        check_group("policy", {"_target_": "kvstudy.policies.protection.AlphaProtection", "alpha": alpha,
                               "admission": admission, "beta": beta})
        self.admission = admission
        self.alpha = float(alpha)
        self.beta = None if beta is None else float(beta)
        self.name = "alpha_greedy" if beta is None else "alpha_beta"

    def order(self, view: SchedulerView) -> np.ndarray:
        return fifo_order(view)

    def schedule(self, view: SchedulerView) -> np.ndarray:
        """Same decision as ``admit(view, order(view))`` (a test pins this), computed the fast way: under
        FCFS only the head of the queue matters, so it is read in growing prefixes, not whole."""
        if self.admission == "authors_code":
            return np.arange(view.num_waiting if self._authors_open(view) else 0)
        budget = (1.0 - self.alpha) * view.capacity - view.running_kv_tokens
        k, total = 8, view.num_waiting
        if total == 0 or view.kv_need(view.head_prompts(1)[0] + 1) > budget:  # the common case under load: nothing fits
            return np.empty(0, dtype=np.int64)
        while True:
            need = np.cumsum(view.kv_need(view.head_prompts(k) + 1))
            taken = int(np.searchsorted(need, budget, side="right"))
            if taken < len(need) or k >= total:
                return np.arange(taken)
            k *= 4

    def admit(self, view: SchedulerView, order: np.ndarray) -> np.ndarray:
        if self.admission == "authors_code":
            return order if self._authors_open(view) else order[:0]
        budget = (1.0 - self.alpha) * view.capacity - view.running_kv_tokens
        need = np.cumsum(view.kv_need(view.waiting_prompt[order] + 1))
        return order[: int(np.searchsorted(need, budget, side="right"))]

    def _authors_open(self, view: SchedulerView) -> bool:
        """The scripts' admission test: the whole queue may start when the running KV is within (1 - alpha) M
        (their expression, M * (1 - alpha), for the same float)."""
        return view.running_kv_tokens <= view.capacity * (1 - self.alpha)

    def on_overflow(self, view: SchedulerView) -> np.ndarray:
        if self.beta is None:
            return np.arange(len(view.running_ids))
        if self.admission == "authors_code":  # one draw per running request, in ascending request id
            by_id = np.argsort(view.running_ids, kind="stable")
            return np.sort(by_id[self._rng.random(len(by_id)) < self.beta])
        return np.flatnonzero(self._rng.random(len(view.running_ids)) < self.beta)


class FCFSWatermark(AlphaProtection):
    """vLLM-like: FCFS admission while KV use stays below (1 - watermark) M, and on an overflow recompute
    preemption of the most recently arrived running requests until the rest fit (vLLM's default preemption
    order; Kwon et al. 2023, Sec. 4.5). kvstudy's closest equivalent of Vidur's vLLM replica scheduler."""

    name = "fcfs_watermark"

    def __init__(self, watermark: float = 0.01) -> None:
        # named as the watermark, before AlphaProtection reads it as its alpha
        check_group("policy", {"_target_": "kvstudy.policies.protection.FCFSWatermark", "watermark": watermark})
        super().__init__(alpha=watermark)
        self.name = "fcfs_watermark"

    def on_overflow(self, view: SchedulerView) -> np.ndarray:
        need = view.kv_need(view.running_prompt + view.running_generated + 1)
        newest_first = np.lexsort((-view.running_ids, -view.running_arrival))
        freed = np.cumsum(need[newest_first])
        excess = int(need.sum()) - view.capacity
        return newest_first[: int(np.searchsorted(freed, excess, side="left")) + 1]
