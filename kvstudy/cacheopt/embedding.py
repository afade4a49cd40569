"""CacheOPT's embedding: a waiting request borrows a running request's allocated-but-unused KV (Shen et al.,
Sec. 3.3.1; spec B2.3, B8.6).

A host r_j holds a_j tokens and uses u_j. A guest r_i needs s_p + s_o tokens for s_o iterations, during which the
host grows by s_o. It fits if a_j - (u_j + s_o) - (s_p + s_o) >= b, where b is a buffer (8 tokens). Among the hosts
that fit, the one with the least unused allocation a_j - u_j is taken (best fit). The guest sits at the top of the
host's allocation, [a_j - (s_p + s_o), a_j). The paper's printed start, a_j - (u_j + s_o) - b, is the size of the
free region, not a start (spec B8.6). Conflict: when the host's use plus the buffer reaches the guest's region,
u_j(t) + b >= a_j - (s_p + s_o), the guest is preempted (or moved to free KV if there is any).
"""
from __future__ import annotations

from typing import Optional, Sequence


def feasible(a_j: int, u_j: int, s_p: int, s_o: int, b: int = 8) -> bool:
    return a_j - (u_j + s_o) - (s_p + s_o) >= b


def best_host(allocated: Sequence[int], used: Sequence[int], s_p: int, s_o: int, b: int = 8) -> Optional[int]:
    """Position of the host with the least unused allocation among those that fit, or None."""
    fits = [(a - u, j) for j, (a, u) in enumerate(zip(allocated, used)) if feasible(a, u, s_p, s_o, b)]
    return min(fits)[1] if fits else None


def region(a_j: int, s_p: int, s_o: int) -> tuple:
    """[start, end) of the guest inside the host's allocation: its top."""
    return a_j - (s_p + s_o), a_j


def conflict(u_j_now: int, a_j: int, s_p: int, s_o: int, b: int = 8) -> bool:
    """True when the host's growth reaches the guest's region (the guest must be preempted or moved)."""
    return u_j_now + b >= region(a_j, s_p, s_o)[0]
