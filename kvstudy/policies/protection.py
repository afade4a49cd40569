"""vLLM-style protection baselines of Jaillet et al., Sec. 5.2.

*alpha-protection greedy*: keep every running request; add waiting prompts in arrival order while the KV
use after adding prompt i (its initial memory s_i + 1) stays within (1 - alpha) M; stop at the first
that does not fit. On an overflow all running requests are cleared (sent back unprocessed).

*alpha-protection beta-clearing*: the same admission; on an overflow each running request is cleared
independently with probability beta (possibly none, in which case the overflow repeats next round).

KV use here is the running requests' memory in this round, sum(s + j + 1), as the engine charges it.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from kvstudy.errors import ConfigError
from kvstudy.policies.base import Policy, SchedulerView, fifo_order


class AlphaProtection(Policy):
    name = "alpha_protection"

    def __init__(self, alpha: float = 0.3, beta: Optional[float] = None) -> None:
        if not 0.0 <= alpha < 1.0:
            raise ConfigError(f"policy.alpha={alpha}: allowed 0 <= alpha < 1")
        if beta is not None and not 0.0 < beta <= 1.0:
            raise ConfigError(f"policy.beta={beta}: allowed 0 < beta <= 1 (or null for greedy clearing)")
        self.alpha = float(alpha)
        self.beta = None if beta is None else float(beta)
        self.name = "alpha_greedy" if beta is None else "alpha_beta"

    def order(self, view: SchedulerView) -> np.ndarray:
        return fifo_order(view)

    def admit(self, view: SchedulerView, order: np.ndarray) -> np.ndarray:
        budget = (1.0 - self.alpha) * view.capacity
        used = int((view.running_prompt + view.running_generated + 1).sum())
        need = np.cumsum(view.waiting_prompt[order] + 1) + used
        return order[: int(np.searchsorted(need, budget, side="right"))]

    def on_overflow(self, view: SchedulerView) -> np.ndarray:
        if self.beta is None:
            return np.arange(len(view.running_ids))
        return np.flatnonzero(self._rng.random(len(view.running_ids)) < self.beta)
