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

from typing import List, Sequence, Tuple


def _sum(x: Sequence[float], lo: int = 0, n: int = None) -> float:
    """numpy's pairwise summation of float64 (``np.add.reduce``), term for term, so that the allocation is the
    same float numpy would give (it decides whole blocks), without numpy's overhead on a handful of numbers."""
    if n is None:
        n = len(x)
    if n < 8:
        res = 0.0
        for k in range(lo, lo + n):
            res += x[k]
        return res
    if n <= 128:
        r = list(x[lo:lo + 8])
        k, stop = 8, n - n % 8
        while k < stop:
            for j in range(8):
                r[j] += x[lo + k + j]
            k += 8
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        while k < n:
            res += x[lo + k]
            k += 1
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _sum(x, lo, n2) + _sum(x, lo + n2, n - n2)


def allocate(want: Sequence[float], base: Sequence[float], slack: Sequence[float], prompt: Sequence[float],
             output: Sequence[float], pool: float, mode: str = "rationale") -> Tuple[List[float], float]:
    """(allocations, leftover) for the chosen requests; allocations are floats (the caller rounds to blocks)."""
    want = [float(v) for v in want]
    base = [min(float(b), v) for b, v in zip(base, want)]
    total = _sum(want)
    if total <= pool:
        return list(want), float(pool - total)
    if _sum(base) >= pool:
        return list(base), 0.0
    if mode == "literal":
        w = [float(r) * float(p) for r, p in zip(slack, prompt)]
        sw = _sum(w)
        return [max(b, pool * x / sw) for b, x in zip(base, w)], 0.0
    if mode != "rationale":
        raise ValueError(f"allocation mode {mode!r}: allowed rationale, literal")
    w = [max(float(r) * float(o), 1e-12) for r, o in zip(slack, output)]
    lo, hi = 0.0, max((v - b) / x for v, b, x in zip(want, base, w))
    terms = list(base)
    for _ in range(200):  # Sum max(base, want - lambda w) decreases in lambda
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi:  # lo and hi are adjacent floats: every further halving would change nothing
            break
        for k in range(len(w)):
            t = want[k] - mid * w[k]
            terms[k] = t if t > base[k] else base[k]
        if _sum(terms) > pool:
            lo = mid
        else:
            hi = mid
    return [max(b, v - hi * x) for b, v, x in zip(base, want, w)], 0.0
