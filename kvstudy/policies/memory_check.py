"""Incremental check of the MC-SF feasibility inequality, eq. (5).

At round t every request in S (running) or U (being added) holds, at a future round t + tau,
``w_i + tau`` KV tokens while ``tau <= d_i`` and nothing after, where

* a running request that has completed j decode rounds: w = s + j + 1, d = o~ - j - 1;
* a new request started in round t: w = s, d = o~.

Eq. (5) asks memory(tau) = sum_{d_i >= tau} (w_i + tau) <= M for tau in [1, max d]. Memory is linear
between completion points and drops after them, so it suffices to check tau in {d_j} (the paper's
argument after eq. (6)). ``FutureMemory`` keeps the memory at every check point; adding one candidate
costs O(K) vector work for K check points, so a round is O(K * |U|) rather than the O(M^2) bound of
Prop. 4.2. Running requests past their predicted end (d < 1) drop out, exactly as the indicator in
eq. (5) does.
"""
from __future__ import annotations

import numpy as np


class FutureMemory:
    def __init__(self, capacity: int, running_w: np.ndarray, running_d: np.ndarray) -> None:
        self.capacity = capacity
        keep = running_d >= 1
        self.w = running_w[keep].astype(np.int64)
        self.d = running_d[keep].astype(np.int64)
        if len(self.d):
            order = np.argsort(self.d)
            d_sorted, w_sorted = self.d[order], self.w[order]
            # the distinct check points, as np.unique gives them, from the sort done anyway (np.unique costs a
            # second sort per round; this loop runs every iteration)
            distinct = np.empty(len(d_sorted), dtype=bool)
            distinct[0] = True
            np.not_equal(d_sorted[1:], d_sorted[:-1], out=distinct[1:])
            pts = d_sorted[distinct]
            # Suffix sums over requests with d >= tau for each check point tau.
            suffix_w = np.concatenate((np.cumsum(w_sorted[::-1])[::-1], [0]))
            first = np.searchsorted(d_sorted, pts, side="left")
            count = len(d_sorted) - first
            self.mem = suffix_w[first] + pts * count
        else:
            pts = np.empty(0, dtype=np.int64)
            self.mem = np.empty(0, dtype=np.int64)
        self.pts = pts

    def fits(self) -> bool:
        return bool(len(self.mem) == 0 or self.mem.max() <= self.capacity)

    def try_add(self, w: int, d: int) -> bool:
        """Add a request starting now with prompt w and predicted output d if eq. (5) still holds."""
        at_pts = self.mem + np.where(self.pts <= d, w + self.pts, 0)
        if len(at_pts) and at_pts.max() > self.capacity:
            return False
        idx = np.searchsorted(self.pts, d)
        if idx < len(self.pts) and self.pts[idx] == d:
            self.mem = at_pts
        else:
            mask = self.d >= d
            at_d = int(self.w[mask].sum()) + d * int(mask.sum()) + w + d
            if at_d > self.capacity:
                return False
            self.mem = np.insert(at_pts, idx, at_d)
            self.pts = np.insert(self.pts, idx, d)
        self.w = np.append(self.w, w)
        self.d = np.append(self.d, d)
        return True


def running_terms(view) -> tuple:
    """(w, d) of eq. (5) for the running requests of a ``SchedulerView``."""
    w = view.running_prompt + view.running_generated + 1
    d = view.running_predicted - view.running_generated - 1
    return w, d
