"""The engine's waiting queue with two indexes a cache-aware order reads (issue 59), for a policy that asks for them
(``StepPolicy.indexed_waiting``: vLLM and Sarathi with SGLang's ``dfs_weight`` order, kvstudy/policies/cache_orders.py).

SGLang's ``dfs_weight`` builds a tree of every waiting request's cached prefix at every admission (2 ms per iteration
with 10^4 requests waiting, and vLLM's "could the smallest start" test is a pass over the queue too). Only requests
whose *first* block is cached have a prefix in that tree; the rest follow it in queue order. So the queue keeps:

* ``smallest()``: the fewest tokens a waiting request's prefill takes (prompt + tokens generated, fixed while it
  waits), from a sorted list of them;
* ``matched()``: the waiting requests whose first block is cached now, in queue order. The requests are grouped by
  their first block's name (the memory's ``first_block``); a group is *hot* once its block was found cached (when a
  request joins, or when the prefix cache caches some request's first block: ``told_cached``), and a hot group whose
  block was evicted since is dropped when read. A first block can only equal another request's first block (a block's
  key names everything up to its end), so no other cached block can make a group matched.

Queue order is a number taken at joining, rising at the back (``append``) and falling at the front (``extendleft``,
the last item first, as ``deque.extendleft`` puts it): leaving changes no other pair's order.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Hashable, List, Optional

from sortedcontainers import SortedList


class IndexedQueue(deque):
    """A ``deque`` of waiting requests (the engine appends arrivals, puts victims at the front and removes starts) that
    keeps ``smallest()`` and ``matched()`` (module docstring). ``size(i)``: the tokens request i's prefill takes;
    ``first_block(i, tokens)``: a name of its first full block within those tokens, or None, and ``cached(name)``:
    whether that block is cached now (the memory's ``first_block`` / ``first_block_cached``: None and False without
    prefix caching)."""

    def __init__(self, size: Callable[[int], int], first_block: Callable[[int, int], Optional[Hashable]],
                 cached: Callable[[Hashable], bool]) -> None:
        super().__init__()
        self._size, self._first_block, self._cached = size, first_block, cached
        self.number: dict = {}  # i -> its place in queue order
        self.lo = self.hi = 0
        self.sizes = SortedList()  # (tokens, i) of every waiting request
        self.size_of: dict = {}
        self.first: dict = {}  # i -> its first block's name (requests with one)
        self.groups: dict = {}  # name -> {i: None} of the waiting requests whose first block it is
        self.hot: set = set()  # names found cached since (checked when read)

    def append(self, i: int) -> None:
        deque.append(self, i)
        self.hi += 1
        self._join(i, self.hi)

    def extendleft(self, items) -> None:
        items = list(items)
        deque.extendleft(self, items)
        for i in items:
            self.lo -= 1
            self._join(i, self.lo)

    def remove(self, i: int) -> None:
        deque.remove(self, i)
        self._leave(i)

    def _join(self, i: int, number: int) -> None:
        self.number[i] = number
        size = self.size_of[i] = self._size(i)
        self.sizes.add((size, i))
        name = self._first_block(i, size)
        if name is None:
            return
        self.first[i] = name
        group = self.groups.get(name)
        if group is None:
            group = self.groups[name] = {}
        group[i] = None
        if self._cached(name):
            self.hot.add(name)

    def _leave(self, i: int) -> None:
        del self.number[i]
        self.sizes.remove((self.size_of.pop(i), i))
        name = self.first.pop(i, None)
        if name is not None:
            group = self.groups[name]
            del group[i]
            if not group:
                del self.groups[name]
                self.hot.discard(name)

    # --- what the policies read ----------------------------------------------------------------------------------
    def smallest(self) -> int:
        """The fewest tokens a waiting request's prefill takes (the queue must not be empty)."""
        return self.sizes[0][0]

    def told_cached(self, i: int) -> None:
        """The prefix cache cached request i's first block (``PrefixCache.on_first``)."""
        name = self._first_block(i, self._size(i))
        if name is not None and name in self.groups:
            self.hot.add(name)

    def matched(self) -> List[int]:
        """The waiting requests whose first block is cached now, in queue order."""
        cached = self._cached
        gone = [name for name in self.hot if not cached(name)]
        self.hot.difference_update(gone)
        out = [i for name in self.hot for i in self.groups[name]]
        out.sort(key=self.number.__getitem__)
        return out
