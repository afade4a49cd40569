"""CacheOPT's KV allocation among the requests chosen for an iteration (Shen et al., Sec. 3.3.2, Table 2; spec
B2.4 step 10, B8.5).

Each request i wants M_i = s_p + s_o tokens and must get at least base_i (s_p + B for a new request, u_i + B for
a running one). The pool holds A' tokens.
* Sum M = A': everyone gets M_i.
* Sum M < A': everyone gets M_i. The caller may add requests while the SLOs allow; ``leftover`` says how much.
* Sum M > A': the excess E = Sum M - A' is cut. The paper's weights, w_i = RT_i * s_p_i, give *larger* allocations
  to larger slack, against its own rationale. The primary mode follows the rationale (spec B8.5): the cuts are
  proportional to w_i = RT_i * s_o_i (looser SLO, longer predicted output: larger cut),
  A_i = max(base_i, M_i - lambda w_i), with lambda chosen so that Sum A_i = A' (water-filling: lambda = E / Sum w
  when no floor binds). The ``literal`` mode is A_i = A' * RT_i s_p_i / Sum(RT s_p), floored at base_i.
If even the floors exceed A', the caller must preempt first (step 6); this function returns the floors.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np


def allocate(want: np.ndarray, base: np.ndarray, slack: np.ndarray, prompt: np.ndarray, output: np.ndarray,
             pool: float, mode: str = "rationale") -> Tuple[np.ndarray, float]:
    """(allocations, leftover) for the chosen requests; allocations are floats (the caller rounds to blocks)."""
    want, base = np.asarray(want, dtype=float), np.asarray(base, dtype=float)
    base = np.minimum(base, want)
    total = want.sum()
    if total <= pool:
        return want.copy(), float(pool - total)
    if base.sum() >= pool:
        return base.copy(), 0.0
    if mode == "literal":
        w = np.asarray(slack, dtype=float) * np.asarray(prompt, dtype=float)
        return np.maximum(base, pool * w / w.sum()), 0.0
    if mode != "rationale":
        raise ValueError(f"allocation mode {mode!r}: allowed rationale, literal")
    w = np.maximum(np.asarray(slack, dtype=float) * np.asarray(output, dtype=float), 1e-12)
    lo, hi = 0.0, float(((want - base) / w).max())
    for _ in range(200):  # Sum max(base, want - lambda w) decreases in lambda
        mid = (lo + hi) / 2
        if np.maximum(base, want - mid * w).sum() > pool:
            lo = mid
        else:
            hi = mid
    return np.maximum(base, want - hi * w), 0.0
