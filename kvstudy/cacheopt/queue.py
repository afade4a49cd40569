"""CacheOPT's waiting queue in ascending RT order (Sec. 3.3), kept sorted between iterations.

A waiting (or swapped) request's RT is its deadline minus the present: arrival + SLO_tft before its first token,
its last token + SLO_tbt after. The deadline does not move while the request waits, so the order is the same at
every instant and need not be rebuilt in every iteration (sorting every waiting request in every step cost CacheOPT
~400 us per iteration: issue 33, item 6). A request enters when it arrives or is preempted and leaves when it
starts; a left request's entry stays in the list, dead, until dead entries outnumber the live ones. The earliest
deadlines start first, so dead entries gather at the front: ``_head`` marks where the live ones may begin, and a walk
of the queue starts there instead of stepping over every dead entry in every iteration (under overload the dead
front held ~10^4 entries: issue 47).
"""
from __future__ import annotations

import bisect
from typing import Iterable, Iterator, List, Tuple


class DeadlineQueue:
    __slots__ = ("_items", "_version", "_live", "_head")

    def __init__(self) -> None:
        self._items: List[Tuple[float, int, int]] = []  # (deadline, request, version), sorted; ties by request
        self._version: dict = {}  # request -> version of its live entry (a dead entry has an older one)
        self._live: set = set()
        self._head = 0  # every entry before it is dead

    def __len__(self) -> int:
        return len(self._live)

    def push(self, deadline: float, i: int) -> None:
        """Request i (re-)enters with ``deadline``; an earlier entry of i is dead."""
        v = self._version.get(i, 0) + 1
        self._version[i] = v
        entry = (deadline, i, v)
        at = bisect.bisect_right(self._items, entry)  # where bisect.insort puts it
        self._items.insert(at, entry)
        if at < self._head:  # a live entry ahead of the dead front
            self._head = at
        self._live.add(i)

    def drop(self, i: int) -> None:
        """Request i left the queue (it started)."""
        if i in self._live:
            self._live.discard(i)
            self._version[i] += 1
        if len(self._items) > 2 * len(self._live) + 64:
            version = self._version
            self._items = [e for e in self._items if version[e[1]] == e[2]]
            self._head = 0

    def rebuild(self, pairs: Iterable[Tuple[float, int]]) -> None:
        """Start over from (deadline, request) pairs."""
        self._items, self._version, self._live, self._head = [], {}, set(), 0
        for deadline, i in pairs:
            self._version[i] = 1
            self._items.append((deadline, i, 1))
            self._live.add(i)
        self._items.sort()

    def __iter__(self) -> Iterator[int]:
        """Live requests in deadline order. Walked by index from ``_head``, as a ``for`` loop over the list walks it
        (a push during the walk is seen the same way)."""
        items, version = self._items, self._version
        k = self._head
        while k < len(items) and version[items[k][1]] != items[k][2]:
            k += 1
        if k > 64:  # a long dead front goes (a new list: a walk already under way keeps the old one): a request that
            # re-enters ahead of it would otherwise send every later walk over it again
            self._items = items = items[k:]
            k = 0
        self._head = k
        while k < len(items):
            _, i, v = items[k]
            k += 1
            if version[i] == v:
                yield i

    def window(self, lo: float, hi: float) -> List[int]:
        """Live requests with lo <= deadline < hi, in order."""
        items, version = self._items, self._version
        out = []
        for k in range(bisect.bisect_left(items, (lo,)), len(items)):
            deadline, i, v = items[k]
            if deadline >= hi:
                break
            if version[i] == v:
                out.append(i)
        return out
