"""An offload tier's LRU held as runs of keys (issue 59, item 3): what kvstudy/memory/offload.py's tiers hold, with the
order, touches and evictions of a per-key LRU (least recently written or loaded first out; a key added again moves to
the end), counted per run of consecutive keys instead of per key.

Why runs. Every batch a tier receives is runs of consecutive keys of one chain each, in falling order: the GPU's prefix
cache evicts a chain from its top (kvstudy/memory/prefix_runs.py), a load touches a prefix tail first, and a tier
demotes in the order it evicts. Keys are ``BlockKeys``' ints: a chain's keys are one lattice of step ``block_size``
(``(chain << 32) + offset``), so a run is ``[lo, hi)``, its keys ``hi - step, hi - 2 step, ..., lo`` in the order
they came. An *entry* is one run as added, at its place in the LRU; touching part of it (adding those keys again, or
moving them to another tier) cuts them out, and what is left keeps the entry's place (upper piece first, as its keys
leave first). Eviction takes the oldest entry's first piece from its top. Per chain a sorted list of the pieces
``(lo, hi, entry)`` answers which keys are held.

The per-key tier this replaces is the reference: tests/memory/test_offload_runs.py drives both with the same random
batches and compares every tier's keys in order, and every count.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import OrderedDict
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from kvstudy.memory.prefix import KeyRuns

_TOP = 1 << 80  # above every key and entry id: (key, _TOP) sorts after every piece starting at key

Run = Tuple[int, int]  # [lo, hi): keys hi - step, ..., lo, in that order


def _last_from(pieces: list, key: int) -> int:
    """The index of the last piece starting at or below ``key`` (-1: none)."""
    return bisect_right(pieces, (key, _TOP)) - 1


def _int_key(key) -> None:
    if type(key) is not int:
        raise TypeError(f"offload tiers: key {key!r} is not a block key (an int, as the prefix cache names blocks: "
                        f"kvstudy/memory/path_keys.py)")


def falling_runs(keys: Sequence[int], step: int) -> List[Run]:
    """``keys`` (in their order) as runs: consecutive keys of one chain, each ``step`` below the one before. Read from
    ``KeyRuns`` of step ``-step`` directly; a plain list is grouped key by key (a key alone is a run of one)."""
    if type(keys) is KeyRuns and keys.step == -step:
        starts, firsts = keys.starts, keys.firsts
        if len(firsts) == 1:  # one run (the usual: a GPU evicting a decode's block), without the loop
            n = starts[1] - starts[0]
            return [(firsts[0] - (n - 1) * step, firsts[0] + step)] if n > 0 else []
        return [(first - (starts[r + 1] - starts[r] - 1) * step, first + step)
                for r, first in enumerate(keys.firsts) if starts[r + 1] > starts[r]]
    out: List[Run] = []
    for key in keys:
        _int_key(key)
        if out and out[-1][0] == key + step and (key >> 32) == (out[-1][0] >> 32):
            out[-1] = (key, out[-1][1])
        else:
            out.append((key, key + step))
    return out


def rising_runs(keys: Sequence[int], start: int, end: int, step: int) -> List[Run]:
    """``keys[start:end]`` as runs of consecutive keys of one chain, each ``step`` above the one before (a request's
    keys: ``KeyRuns`` of step ``step`` read directly, a list grouped key by key), in their order."""
    if start >= end:
        return []
    if type(keys) is KeyRuns and keys.step == step:
        firsts, starts = keys.firsts, keys.starts
        r = bisect_right(starts, start) - 1
        out = []
        while starts[r] < end:
            s0, first = starts[r], firsts[r]
            s, e = max(start, s0), min(end, starts[r + 1])
            out.append((first + (s - s0) * step, first + (e - s0) * step))
            r += 1
        return out
    out = []
    for key in keys[start:end]:
        _int_key(key)
        if out and out[-1][1] == key and (key >> 32) == ((key - step) >> 32):
            out[-1] = (out[-1][0], key + step)
        else:
            out.append((key, key + step))
    return out


class RunLru:
    """One tier's keys, least recently used first, as runs (module docstring). ``add``, ``pop_first``, ``cut`` and
    the lookups take and give runs; ``len`` and iteration are per key (iteration lists them oldest first)."""

    __slots__ = ("step", "entries", "index", "n", "_eid")

    def __init__(self, step: int) -> None:
        self.step = int(step)
        self.entries: "OrderedDict[int, tuple]" = OrderedDict()  # entry -> its pieces (lo, hi), the next to leave first
        self.index: Dict[int, list] = {}  # chain -> its pieces (lo, hi, entry), sorted
        self.n = 0
        self._eid = 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        step = self.step
        for pieces in self.entries.values():
            for lo, hi in pieces:
                yield from range(hi - step, lo - step, -step)

    def find(self, key: int) -> Optional[tuple]:
        """The piece ``(lo, hi, entry)`` holding ``key``, or None."""
        pieces = self.index.get(key >> 32)
        if not pieces:
            return None
        j = _last_from(pieces, key)
        if j >= 0 and pieces[j][1] > key:
            return pieces[j]
        return None

    def __contains__(self, key: int) -> bool:
        return self.find(key) is not None

    def holds_any(self, lo: int, hi: int) -> bool:
        """Whether some key of ``[lo, hi)`` (one chain) is held."""
        pieces = self.index.get(lo >> 32)
        if not pieces:
            return False
        j = _last_from(pieces, lo)
        if j >= 0 and pieces[j][1] > lo:
            return True
        return j + 1 < len(pieces) and pieces[j + 1][0] < hi

    def held_from(self, key: int) -> int:
        """The end of the keys held from ``key`` on without a gap (within its chain); ``key``: it is not held."""
        pieces = self.index.get(key >> 32)
        if not pieces:
            return key
        j = _last_from(pieces, key)
        if j < 0 or pieces[j][1] <= key:
            return key
        end = pieces[j][1]
        for j in range(j + 1, len(pieces)):
            if pieces[j][0] != end:
                break
            end = pieces[j][1]
        return end

    def gaps(self, lo: int, hi: int) -> List[Run]:
        """The parts of ``[lo, hi)`` (one chain) not held, rising."""
        pieces = self.index.get(lo >> 32)
        if not pieces:
            return [(lo, hi)]
        out, at = [], lo
        j = max(0, _last_from(pieces, lo))
        while j < len(pieces) and pieces[j][0] < hi:
            a, b, _ = pieces[j]
            if b > at:
                if a > at:
                    out.append((at, a))
                at = b
            j += 1
        if at < hi:
            out.append((at, hi))
        return out

    def cut(self, lo: int, hi: int) -> int:
        """Keys ``[lo, hi)`` (one chain) leave, wherever they are; what is left of each entry keeps its place.
        Returns how many were held."""
        c = lo >> 32
        pieces = self.index.get(c)
        if not pieces:
            return 0
        step, entries = self.step, self.entries
        j = _last_from(pieces, lo)
        if j < 0 or pieces[j][1] <= lo:
            j += 1
        removed = 0
        while j < len(pieces) and pieces[j][0] < hi:
            a, b, e = pieces[j]
            left = []  # what stays of [a, b), rising
            if a < lo:
                left.append((a, lo))
            if hi < b:
                left.append((hi, b))
            removed += (min(b, hi) - max(a, lo)) // step
            pieces[j:j + 1] = [(p, q, e) for p, q in left]
            j += len(left)
            own = entries[e]
            k = own.index((a, b))
            own = own[:k] + tuple(left[::-1]) + own[k + 1:]  # the upper piece leaves first
            if own:
                entries[e] = own
            else:
                del entries[e]
        if not pieces:
            del self.index[c]
        self.n -= removed
        return removed

    def add(self, lo: int, hi: int) -> int:
        """Keys ``hi - step, ..., lo`` (one chain) join at the end, in that order (held ones move there: touched).
        Returns how many were not held."""
        held = self.cut(lo, hi)
        count = (hi - lo) // self.step
        entries = self.entries
        if entries:  # the tier's last keys continue down into these (a GPU evicting a run block by block): one piece
            e = next(reversed(entries))
            own = entries[e]
            a, b = own[-1]
            if a == hi:  # (one chain: a key is its chain << 32 plus an offset below 2^32)
                entries[e] = own[:-1] + ((lo, b),)
                pieces = self.index[lo >> 32]
                pieces[bisect_left(pieces, (a, b, e))] = (lo, b, e)  # nothing held lies between: its place stays
                self.n += count
                return count - held
        e = self._eid = self._eid + 1
        self.entries[e] = ((lo, hi),)
        pieces = self.index.get(lo >> 32)
        if pieces is None:
            self.index[lo >> 32] = [(lo, hi, e)]
        else:
            insort(pieces, (lo, hi, e))
        self.n += count
        return count - held

    def pop_first(self, count: int) -> List[Run]:
        """The ``count`` least recently used keys leave (fewer if fewer are held); returns them as runs, in order."""
        step, entries, index = self.step, self.entries, self.index
        out: List[Run] = []
        gone = 0
        while gone < count and entries:
            e = next(iter(entries))
            own = entries[e]
            lo, hi = own[0]
            take = min((hi - lo) // step, count - gone)
            low = hi - take * step
            out.append((low, hi))
            pieces = index[lo >> 32]
            j = bisect_left(pieces, (lo, hi, e))
            if low == lo:
                del pieces[j]
                if not pieces:
                    del index[lo >> 32]
                if len(own) > 1:
                    entries[e] = own[1:]
                else:
                    del entries[e]
            else:
                pieces[j] = (lo, low, e)
                entries[e] = ((lo, low),) + own[1:]
            gone += take
        self.n -= gone
        return out


def run_keys(runs: Sequence[Run], step: int) -> List[int]:
    """The keys of falling ``runs``, in order."""
    out: List[int] = []
    for lo, hi in runs:
        out.extend(range(hi - step, lo - step, -step))
    return out
