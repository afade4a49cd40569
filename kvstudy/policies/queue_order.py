"""The waiting order of the policies that keep vLLM V0's queue (FCFS, RR, SJF, RR-SJF; kvstudy/policies/rr_sjf.py),
held as three parts: a front deque, a sorted middle and a back deque (issue 59).

vLLM keeps the waiting queue as one deque and SJF and RR-SJF sort all of it in every step that admits nothing: O(n log
n) per step, 2 ms per iteration with 10^5 requests waiting. Between two sorts requests join only at the front
(preemption victims, the routine's head) or at the back (arrivals, round-robin victims) and leave from the walked
front (admission). So the queue is always front + sorted middle + back, and a sort merges the front and the back into
the middle: O((|front| + |back|) log n).

The merge is the stable sort vLLM runs. SJF's key (prediction, arrival, index) is a total order. RR-SJF's (longest
waiting, shortest prediction) is not, and a stable sort keeps tied requests in list order. A sequence number taken at
joining (rising at the back, falling at the front) is that order: of two tied requests, the one ahead in the list
always has the smaller number (a stable sort keeps their relative order; a request joining the back is behind all and
gets the largest number, one joining the front the smallest; leaving changes no pair). Sorting by (key, number) is
therefore the stable sort by key.
"""
from __future__ import annotations

from collections import deque
from itertools import chain
from typing import Callable, Iterable, Iterator, Tuple

from sortedcontainers import SortedList


class QueueOrder:
    """A queue of request indices with ``append``, ``appendleft``, ``popleft``, iteration in order and ``sort(key)``.
    The middle holds ``key(i) + (number, i)`` tuples."""

    __slots__ = ("front", "mid", "back", "number", "entry", "lo", "hi")

    def __init__(self, items: Iterable[int] = ()) -> None:
        self.front: deque = deque()
        self.mid = SortedList()
        self.back: deque = deque()
        self.number = {}  # i -> its sequence number (list order among equal keys)
        self.entry = {}  # i -> its tuple in the middle
        self.lo = self.hi = 0
        for i in items:
            self.append(i)

    def __len__(self) -> int:
        return len(self.front) + len(self.mid) + len(self.back)

    def __bool__(self) -> bool:
        return bool(self.front) or bool(self.mid) or bool(self.back)

    def __iter__(self) -> Iterator[int]:
        return chain(self.front, (t[-1] for t in self.mid), self.back)

    def append(self, i: int) -> None:
        self.hi += 1
        self.number[i] = self.hi
        self.back.append(i)

    def appendleft(self, i: int) -> None:
        self.lo -= 1
        self.number[i] = self.lo
        self.front.appendleft(i)

    def first(self) -> int:
        if self.front:
            return self.front[0]
        return self.mid[0][-1] if self.mid else self.back[0]

    def popleft(self) -> int:
        if self.front:
            i = self.front.popleft()
        elif self.mid:
            i = self.mid.pop(0)[-1]
            del self.entry[i]
        else:
            i = self.back.popleft()
        del self.number[i]
        return i

    def sort(self, key: Callable[[int], Tuple]) -> None:
        """vLLM's stable ``sorted(queue, key=key)``; ``key(i)`` must not change while i waits."""
        number, entry = self.number, self.entry
        new = []
        for i in chain(self.front, self.back):
            t = key(i) + (number[i], i)
            entry[i] = t
            new.append(t)
        self.front.clear()
        self.back.clear()
        self.mid.update(new)

    def take(self, walked: int, started: Iterable[int]) -> None:
        """Remove ``started``, all among the first ``walked`` requests in order (an admission walk's)."""
        taken = set(started)
        nf = min(walked, len(self.front))
        nb = min(max(walked - nf - len(self.mid), 0), len(self.back))
        for part, n in ((self.front, nf), (self.back, nb)):
            if n:
                head = [part.popleft() for _ in range(n)]
                part.extendleft(reversed([i for i in head if i not in taken]))
        entry = self.entry
        for i in taken:
            t = entry.pop(i, None)
            if t is not None:
                self.mid.remove(t)
            del self.number[i]

    def keep(self, wanted: Callable[[int], bool]) -> None:
        """Drop the requests ``wanted`` refuses (they left the queue without an admission), order otherwise kept."""
        for i in [i for i in self if not wanted(i)]:
            t = self.entry.pop(i, None)
            if t is not None:
                self.mid.remove(t)
            del self.number[i]
        self.front = deque(i for i in self.front if i in self.number)
        self.back = deque(i for i in self.back if i in self.number)
