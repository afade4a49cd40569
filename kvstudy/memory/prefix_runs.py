"""The prefix cache held as runs (issue 59, item 3): the same cache as kvstudy/memory/prefix.py's ``PrefixCache`` (its
docstring gives vLLM's semantics), with the same answers, evictions and eviction order, counted per *chain* of keys
instead of per block. ``PrefixCachingMemory`` runs on it unless a policy asks who holds each block (``track_users``:
MC-SF's prefix-aware eq. (5)), which only the per-block cache keeps.

Why runs are exact. The keys name block j of chain c ``(c << 32) + o_c + j * block_size``: a chain is the blocks
ending inside one segment after a given path (``BlockKeys``) or inside one unbranched stretch of the trace's tree of
segments (``PathKeys``, kvstudy/memory/path_keys.py, which the memory uses); a chain's id is larger than its
parent's, so every request's keys are strictly increasing and a chain's blocks are consecutive in them, from its
first block (o_c is the same for every request). The per-block cache keeps three facts that make each chain's state a few numbers:

1. A request holds a prefix of its keys (a hit is a leading run; ``advance`` registers in order), so it holds a
   prefix ``[base_c, end)`` of each chain it reaches, and a block's holders include the holders of the block after
   it. The blocks in use are ``[base_c, top_c)``, ``top_c`` the largest holder's end; a block's reference count is
   the number of holders whose end is past it.
2. A release puts the request's blocks nobody else holds, a suffix of its keys, into the evictor tail first; a hit
   takes a leading run back; eviction takes the evictor's oldest. By induction a cached block's predecessor is in
   use or newer in the evictor, so each chain's cached blocks are a prefix ``[base_c, cend_c)`` and its evictor part
   ``[top_c, cend_c)`` is split into runs whose age grows with their keys: the oldest run holds the chain's top
   blocks and is evicted from its top, and a hit or a block computed again takes the newest run from its bottom.
3. So the evictor is a queue of runs ``(c, lo, hi)`` in release order (a release appends one per chain it frees,
   last chain first), and its per-block order is each run's keys from ``hi`` down, run after run.

Costs then scale with the chains a request reaches, not its blocks (Mooncake's trace: 512-token segments, 32
blocks of 16 tokens each). The per-block cache stays the reference: tests/memory/test_prefix_runs.py drives both
with the same random operations and compares every answer, count and evicted key.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import OrderedDict
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from kvstudy.memory.prefix import KeyRuns, check_acquire


class RunPrefixCache:
    """``PrefixCache``'s interface (acquire, advance, grow, release, hit, new_blocks, freed_by, release_gain, used,
    free, cached_blocks, evictions, on_evict, on_first, pending) on integer keys from one ``BlockKeys`` of
    ``block_size`` tokens. ``release_gain``'s dropped blocks come back as a set of ``(chain, new top)`` (what ``new_blocks``
    takes); who holds a block is not kept (``users`` None)."""

    users = None
    multi: dict = {}
    multi_version = 0

    def __init__(self, num_blocks: int, block_size: int, per_block=None) -> None:
        """``per_block``: called by ``track_users`` to put the per-block cache in this one's place (the memory's
        ``PrefixCachingMemory._per_block``)."""
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks}: at least 1")
        self.num_blocks, self.bs = int(num_blocks), int(block_size)
        self.base: Dict[int, int] = {}   # chain -> key of its first block (state kept while a block of it is cached)
        self.top: Dict[int, int] = {}    # chain -> end of its blocks in use (base: none)
        self.cend: Dict[int, int] = {}   # chain -> end of its cached blocks (in use or in the evictor)
        self.hold: Dict[int, Dict[int, int]] = {}  # chain -> {request: end of its blocks there}
        # the evictor, in tuples of ints (replaced, never changed: the garbage collector stops tracking such a tuple at
        # its first pass, while a list would be walked by every full collection of a long run)
        # run id -> (chain, lo), least recently released first; a run ends where the chain's next older run starts,
        # the oldest at the chain's cached end (so evicting from the top changes ``cend`` only)
        self.lru: "OrderedDict[int, tuple]" = OrderedDict()
        self.runs: Dict[int, tuple] = {}  # chain -> its run ids in the evictor, oldest (highest keys) first
        self._rid = 0
        self.pending: Dict[int, Sequence[int]] = {}  # request -> keys of all its full blocks
        self.held: Dict[int, int] = {}               # request -> its leading keys registered (cached, referenced)
        self.private: Dict[int, int] = {}            # request -> its blocks without a key reference
        self.used = 0
        self.in_evictor = 0
        self.keyed = 0      # cached blocks, in use or in the evictor
        self.evictions = 0
        self.on_evict = None
        self.on_first = None
        self._per_block = per_block

    def track_users(self) -> None:
        """Runs do not say who holds a block: the memory puts the per-block cache (``PrefixCache``, tracking them) in
        this one's place, which it can only while nothing is cached (a policy asks when it binds, before any start).
        Read the memory's ``cache`` again afterwards."""
        if self._per_block is None:
            raise ValueError("RunPrefixCache does not keep who holds each block (no per-block cache to switch to)")
        if self.used or self.keyed:
            raise ValueError(f"track_users with {self.used} blocks in use and {self.keyed} cached: ask before any "
                             f"request holds blocks")
        self._per_block()

    # --- queries ------------------------------------------------------------------------------------------
    @property
    def free(self) -> int:
        return self.num_blocks - self.used

    @property
    def cached_blocks(self) -> int:
        return self.keyed

    def cached(self, key: int) -> bool:
        """Whether the block of ``key`` is cached (in use or in the evictor)."""
        c = key >> 32
        ce = self.cend.get(c)
        return ce is not None and self.base[c] <= key < ce

    def _chains(self, keys: Sequence[int], start: int, end: int) -> list:
        """(chain, its first key here, that key's position, the position after its last, the key after its last) of
        each chain in ``keys[start:end]``: read from ``KeyRuns``' runs, or found by bisection in a list."""
        if start >= end:
            return []
        if type(keys) is KeyRuns:
            firsts, starts, step = keys.firsts, keys.starts, keys.step
            r0 = bisect_right(starts, start) - 1
            r1 = bisect_left(starts, end, r0 + 1)  # runs r0 .. r1 - 1 meet [start, end)
            out = [(f >> 32, f, s0, e0, f + (e0 - s0) * step)
                   for f, s0, e0 in zip(firsts[r0:r1], starts[r0:r1], starts[r0 + 1:r1 + 1])]
            if out[-1][3] > end:  # the last run cut at end
                c, f, s0, e0, _ = out[-1]
                out[-1] = (c, f, s0, end, f + (end - s0) * step)
            if start > out[0][2]:  # the first run entered at start
                c, f, s0, e0, kend = out[0]
                out[0] = (c, f + (start - s0) * step, start, e0, kend)
            return out
        pos, bs, out = start, self.bs, []
        while pos < end:
            k = keys[pos]
            c = k >> 32
            e = bisect_left(keys, (c + 1) << 32, pos, end)
            out.append((c, k, pos, e, keys[e - 1] + bs))
            pos = e
        return out

    def hit(self, keys: Sequence[int], most: int = None) -> int:
        """As ``PrefixCache.hit``: a chain's cached blocks are a prefix of it (module docstring, 2)."""
        most = len(keys) if most is None else min(most, len(keys))
        cend, bs = self.cend, self.bs
        for c, k, s, e, _ in self._chains(keys, 0, most):
            ce = cend.get(c)
            if ce is None or ce <= k:
                return s
            if s + (ce - k) // bs < e:
                return s + (ce - k) // bs
        return most if most > 0 else 0

    def new_blocks(self, keys: Sequence[int], blocks: int, most: int = None, dropped=()) -> int:
        """As ``PrefixCache.new_blocks``; ``dropped``: ``release_gain``'s second answer ((chain, its top once those
        requests leave) pairs)."""
        n = self.hit(keys, most)
        dropped = dict(dropped) if dropped else None
        top, bs, shared = self.top, self.bs, 0
        for c, k, s, e, _ in self._chains(keys, 0, n):
            t = top[c]
            m = min(e - s, max(0, (t - k) // bs))  # in use from here (k is the chain's first block: in use up to t)
            if dropped and c in dropped:
                shared += min(m, max(0, (dropped[c] - k) // bs))
            else:
                shared += m
            if m < e - s:
                break  # the next is in the evictor: an allocation before this one may evict it
        return blocks - shared

    def _ends(self, i: int) -> List[Tuple[int, int]]:
        """(chain, end) of each chain request i holds blocks of, in key order."""
        keys = self.pending[i]
        return [(c, end) for c, _, _, _, end in self._chains(keys, 0, self.held.get(i, 0))]

    def freed_by(self, i: int) -> int:
        """As ``PrefixCache.freed_by``: per chain, its blocks above every other holder's end."""
        out = self.private.get(i, 0)
        if not self.held.get(i):
            return out
        top, hold, base, bs = self.top, self.hold, self.base, self.bs
        for c, end in self._ends(i):
            if end < top[c]:
                continue
            others = [x for j, x in hold[c].items() if j != i]
            below = max(others) if others else base[c]
            if below < end:
                out += (end - below) // bs
        return out

    def release_gain(self, requests: Iterable[int]) -> Tuple[int, set]:
        """(blocks freed, {chain: its top after}) if all ``requests`` give their blocks back."""
        requests = list(dict.fromkeys(requests))  # each request once
        gone = set(requests)
        gain = sum(self.private.get(i, 0) for i in requests)
        chains = {c for i in requests if self.held.get(i) for c, _ in self._ends(i)}
        top, hold, base, bs, dropped = self.top, self.hold, self.base, self.bs, set()
        for c in sorted(chains):
            rest = [x for j, x in hold[c].items() if j not in gone]
            after = max(rest) if rest else base[c]
            if after < top[c]:
                gain += (top[c] - after) // bs
                dropped.add((c, after))
        return gain, dropped

    # --- changes ----------------------------------------------------------------------------------------
    def _take_back(self, c: int, upto: int) -> None:
        """The chain's evictor blocks below ``upto`` back in use (from its newest runs, the lowest)."""
        ids, lru, bs = self.runs[c], self.lru, self.bs
        while ids:
            rid = ids[-1]
            lo = lru[rid][1]
            hi = lru[ids[-2]][1] if len(ids) > 1 else self.cend[c]
            if hi <= upto:
                self.in_evictor -= (hi - lo) // bs
                del lru[rid]
                ids = ids[:-1]
            else:
                if lo < upto:
                    self.in_evictor -= (upto - lo) // bs
                    lru[rid] = (c, upto)
                break
        if ids:
            self.runs[c] = ids
        else:
            del self.runs[c]

    def acquire(self, i: int, keys: Sequence[int], blocks: int, most: int = None, upto: int = None) -> int:
        """As ``PrefixCache.acquire``."""
        check_acquire(self, i, keys, blocks, most)
        hit = self.hit(keys, most)
        top, bs = self.top, self.bs
        for c, k, s, e, end in self._chains(keys, 0, hit):
            t = top[c]
            if end > t:  # its blocks above the chain's top come back from the evictor
                self._take_back(c, end)
                self.used += (end - t) // bs
                top[c] = end
            self._hold(c, i, end)
        own = blocks - hit
        self._make_room(own)
        self.used += own
        self.pending[i], self.held[i], self.private[i] = keys, hit, own
        self.advance(i, len(keys) if upto is None else upto)
        return hit

    def advance(self, i: int, full_blocks: int) -> None:
        """As ``PrefixCache.advance``: per chain, blocks in use are shared (the request's copy freed), blocks in the
        evictor come back, the rest are cached new."""
        start = self.held[i]
        keys = self.pending[i]
        end = min(full_blocks, len(keys))
        if end <= start:
            return
        if start == 0 and self.on_first is not None:
            self.on_first(i)
        top, cend, base, hold, bs = self.top, self.cend, self.base, self.hold, self.bs
        new = 0
        for c, k, s, e, kend in self._chains(keys, start, end):
            ce = cend.get(c)
            if ce is None:  # the chain's first cached block (k is its base: the request held nothing of it)
                base[c] = k
                top[c] = cend[c] = kend
                hold[c] = {i: kend}
                new += e - s
                continue
            t = top[c]
            if t > k:  # in use by another: shared, the request's copy freed
                self.used -= (min(t, kend) - k) // bs
            if kend > t:
                if ce > t:
                    self._take_back(c, min(ce, kend))  # the cached copy back in use, the request's own freed
                top[c] = kend
                if kend > ce:
                    self.keyed += (kend - ce) // bs
                    cend[c] = kend
            self._hold(c, i, kend)
        self.keyed += new
        self.private[i] -= end - start
        self.held[i] = end

    def _hold(self, c: int, i: int, end: int) -> None:
        """Request i holds chain c's blocks below ``end``."""
        h = self.hold.get(c)
        if h is None:
            self.hold[c] = {i: end}
        else:
            h[i] = end

    def grow(self, i: int, blocks: int = 1) -> None:
        """As ``PrefixCache.grow``."""
        if self.num_blocks - self.used - self.in_evictor < blocks:
            self._make_room(blocks)
        self.used += blocks
        private = self.private
        if i in private:
            private[i] += blocks
        else:
            private[i] = blocks
            self.held[i], self.pending[i] = 0, ()

    def release(self, i: int, full_blocks: Optional[int] = None, keys: Optional[Sequence[int]] = None) -> int:
        """As ``PrefixCache.release``: per chain, last chain first, the blocks above every other holder's end go to
        the evictor as one run."""
        if full_blocks is not None:
            if keys is not None and len(keys) > len(self.pending.get(i, ())):
                self.pending[i] = keys
            self.advance(i, full_blocks)
        n = self.held.get(i, 0)
        ends = self._ends(i) if n else ()
        own = self.private.pop(i, 0)
        self.held.pop(i, None)
        self.pending.pop(i, None)
        if not n:
            self.used -= own
            return own
        top, hold, base, bs, lru, runs = self.top, self.hold, self.base, self.bs, self.lru, self.runs
        freed = 0
        for c, end in reversed(ends):
            h = hold[c]
            del h[i]
            t = top[c]
            if end < t:
                continue
            if h:
                after = max(h.values())
            else:
                after = base[c]
                del hold[c]
            if after < t:
                rid = self._rid = self._rid + 1
                lru[rid] = (c, after)  # up to t: the chain's next older run starts there, or its cached end
                ids = runs.get(c)
                runs[c] = (rid,) if ids is None else ids + (rid,)
                freed += (t - after) // bs
                top[c] = after
        self.in_evictor += freed
        self.used -= freed + own
        return n + own

    def _make_room(self, blocks: int) -> None:
        """Evict the oldest runs, each from its top, until ``blocks`` uncached free blocks exist."""
        short = blocks - (self.num_blocks - self.used - self.in_evictor)
        if short <= 0:
            return
        lru, cend = self.lru, self.cend
        told = self.on_evict is not None  # the evicted keys as runs, falling: KeyRuns of step -bs
        firsts: List[int] = []
        starts: List[int] = [0]
        bs, gone = self.bs, 0
        while gone < short and lru:
            rid = next(iter(lru))
            c, lo = lru[rid]
            hi = cend[c]
            take = min((hi - lo) // bs, short - gone)
            low = cend[c] = hi - take * bs
            if told and take:
                firsts.append(hi - bs)
                starts.append(starts[-1] + take)
            if low == lo:
                self._drop_oldest(rid, c)
            gone += take
        self.in_evictor -= gone
        self.keyed -= gone
        self.evictions += gone
        if told:
            self.on_evict(KeyRuns(firsts, starts, -bs))
        if gone < short:
            raise MemoryError(f"{blocks} blocks needed, {blocks - short + gone} free")

    def _drop_oldest(self, rid: int, c: int) -> None:
        """The evictor's oldest run (of chain c) is evicted whole; with it the chain's state if nothing of it is left
        cached (nor held: its top is at most the run's low end)."""
        del self.lru[rid]
        ids = self.runs[c]
        if len(ids) > 1:
            self.runs[c] = ids[1:]
        else:
            del self.runs[c]
        if self.cend[c] == self.base[c]:
            del self.cend[c], self.base[c], self.top[c]
