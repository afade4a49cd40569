"""CacheOPT's waiting queue in ascending RT order (Sec. 3.3), kept sorted between iterations.

A waiting (or swapped) request's RT is its deadline minus the present: arrival + SLO_tft before its first token,
its last token + SLO_tbt after. The deadline does not move while the request waits, so the order is the same at
every instant and need not be rebuilt in every iteration (sorting every waiting request in every step cost CacheOPT
~400 us per iteration: issue 33, item 6). A request enters when it arrives or is preempted and leaves when it
starts. The entries are held in a blocked sorted list (sortedcontainers), so an entry is added or taken out in
O(log n) at any queue length: a Python list with dead entries left in place cost a memmove of the whole queue per
arrival and a copy of it whenever its dead front was cut, which under overload (a queue of ~10^5 at 10^6 requests)
made CacheOPT's iteration ~3x dearer at 10^6 requests than at 10^4 (issue 59).

The queue is never changed while it is walked (the policy syncs it before its walks: ``_sync_queue``).
"""
from __future__ import annotations

from typing import Dict, Iterable, Iterator, List, Tuple

from sortedcontainers import SortedList


class DeadlineQueue:
    __slots__ = ("_sorted", "_entry")

    def __init__(self) -> None:
        self._sorted = SortedList()  # (deadline, request), one per waiting request; ties by request
        self._entry: Dict[int, Tuple[float, int]] = {}  # request -> its entry

    def __len__(self) -> int:
        return len(self._entry)

    def push(self, deadline: float, i: int) -> None:
        """Request i (re-)enters with ``deadline``; an earlier entry of i goes."""
        old = self._entry.get(i)
        if old is not None:
            self._sorted.remove(old)
        entry = (deadline, i)
        self._entry[i] = entry
        self._sorted.add(entry)

    def drop(self, i: int) -> None:
        """Request i left the queue (it started)."""
        entry = self._entry.pop(i, None)
        if entry is not None:
            self._sorted.remove(entry)

    def rebuild(self, pairs: Iterable[Tuple[float, int]]) -> None:
        """Start over from (deadline, request) pairs."""
        self._entry = {i: (deadline, i) for deadline, i in pairs}
        self._sorted = SortedList(self._entry.values())

    def __iter__(self) -> Iterator[int]:
        """Waiting requests in deadline order."""
        for _, i in self._sorted:
            yield i

    def window(self, lo: float, hi: float) -> List[int]:
        """Waiting requests with lo <= deadline < hi, in order."""
        return [i for _, i in self._sorted.irange((lo,), (hi,), inclusive=(True, False))]
