"""vLLM's automatic prefix caching, counted in blocks (issue 36; vLLM's design doc "Automatic Prefix Caching" and its
v1 ``block_pool.py`` / ``kv_cache_manager.py``): the block bookkeeping that ``PagedMemory(prefix_caching=True)``
(kvstudy/memory/paged.py) runs on. Hand-worked tests and the independent count on Mooncake's traces:
tests/memory/test_prefix_cache.py.

* A block is named by a *key* that identifies everything up to its end: two requests share a block only if their
  contents agree up to and including it (vLLM: ``hash(parent hash, block tokens)``). Keys come from the workload's
  ``segments`` (``BlockKeys``); only full blocks have keys.
* A computed full block is cached. Blocks in use are reference-counted: a block shared by k running requests is
  one block of memory. A cached block nobody uses stays in an LRU *evictor*; it counts as free memory and is evicted
  (least recently released first) only when an allocation needs a block and no uncached free block is left.
* ``acquire(i, keys, blocks, most, upto)``: request i starts with its longest prefix of cached keys (``hit``, at most
  ``most`` blocks: a prefill computes at least the prompt's last token), taken back from the evictor or shared with
  their users, plus new blocks for the rest. Its other full blocks are cached as they are scheduled
  (``advance(i, full_blocks)``; vLLM v1 caches a block when the step that fills it is scheduled, so a request
  scheduled later in the same step can hit it); if a block of the same key was cached meanwhile, the request's copy
  is freed and it shares the cached one (vLLM V0's allocator; v1 would keep both). ``release(i)`` drops its
  references: its keyed blocks nobody else uses go to the evictor, tail first (a prefix is evicted after its
  continuation), the others are freed at once. A new block comes from free blocks holding no cached prefix first,
  and only then evicts (vLLM V0's evictor; v1 takes the least recently freed block whatever it holds, so at the same
  capacity v1 keeps fewer prefixes).

Memory: ``used`` = distinct blocks referenced by a request (keyed blocks once, plus each request's own);
``free`` = ``num_blocks - used`` (cached blocks in the evictor included, as vLLM counts them); ``used`` never
exceeds ``num_blocks``. Which of a request's hits come from the evictor and which are shared changes what it costs
in memory (a shared block costs nothing, a block taken back from the evictor one block, as a new one) but never
whether an allocation fits: evictor blocks are free blocks.
"""
from __future__ import annotations

from collections import Counter, deque
from itertools import repeat
from typing import Dict, Hashable, Iterable, Iterator, List, Optional, Sequence, Tuple


class LruKeys:
    """Keys in the order they were added, first added first out, with O(1) membership and removal and insertion in
    bulk (C loops): the evictor's order. ``order`` is the sequence of additions; ``where`` maps each present key to
    its latest position in it, so an entry whose key was removed or added again later is stale and skipped."""

    __slots__ = ("order", "where", "head", "base")

    def __init__(self) -> None:
        self.order: list = []
        self.where: Dict[Hashable, int] = {}
        self.head = 0  # order[:head] is consumed
        self.base = 0  # the absolute position of order[0]

    def __len__(self) -> int:
        return len(self.where)

    def __contains__(self, key) -> bool:
        return key in self.where

    def __iter__(self) -> Iterator:
        where = self.where
        for pos, key in enumerate(self.order[self.head:], self.base + self.head):
            if where.get(key) == pos:
                yield key

    def keys(self):
        return self.where.keys()

    def _compact(self) -> None:
        """Rebuild ``order`` from the present keys when stale entries outnumber them (keys taken back by hits leave
        stale entries that only eviction would otherwise consume)."""
        live = list(self)
        self.order, self.head, self.base = live, 0, 0
        self.where = dict(zip(live, range(len(live))))

    def extend(self, keys: Sequence[Hashable]) -> None:
        """Add ``keys`` at the end, in their order (the first of them leaves first)."""
        if len(self.order) - self.head > 4096 + 2 * len(self.where):
            self._compact()
        start = self.base + len(self.order)
        self.order.extend(keys)
        self.where.update(zip(keys, range(start, start + len(keys))))

    def remove(self, key: Hashable) -> None:
        del self.where[key]

    def pop_first(self, count: int, out: Optional[list] = None) -> int:
        """Remove the ``count`` keys added first (fewer if fewer are present); returns how many went, and appends them
        to ``out`` in that order if given."""
        where, order, gone = self.where, self.order, 0
        while gone < count and self.head < len(order):
            batch = order[self.head:self.head + count - gone]
            first = self.base + self.head
            self.head += len(batch)
            live = [key for pos, key in enumerate(batch, first) if where.get(key) == pos]
            deque(map(where.__delitem__, live), maxlen=0)
            if out is not None:
                out.extend(live)
            gone += len(live)
        if self.head > 4096 and 2 * self.head > len(order):  # drop the consumed part now and then
            del order[:self.head]
            self.base += self.head
            self.head = 0
        return gone


def check_acquire(cache, i: int, keys: Sequence[Hashable], blocks: int, most: Optional[int]) -> None:
    """A cache's ``acquire`` refused: request i holds blocks already, has more full blocks than blocks, or its new
    blocks do not fit (``new_blocks`` against ``free``)."""
    if i in cache.private:
        raise ValueError(f"request {i} holds blocks already")
    if len(keys) > blocks:
        raise ValueError(f"{len(keys)} full blocks of a request of {blocks} blocks")
    need = cache.new_blocks(keys, blocks, most)
    if need > cache.free:
        raise MemoryError(f"request {i} needs {need} blocks, {cache.free} free")


class NoPrefixIndex:
    """"No cache" (kvstudy/memory/base.py's ``PrefixIndex``; SGLang's ``ChunkCache``): nothing cached, nobody
    shares."""

    users = None
    multi: dict = {}
    multi_version = 0
    on_first = None

    def hit(self, keys, most=None) -> int:
        return 0

    def track_users(self) -> None:
        raise ValueError("no prefix cache: nothing is shared (memory.prefix_caching=false)")


class PrefixCache:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks}: at least 1")
        self.num_blocks = int(num_blocks)
        self.ref: Dict[Hashable, int] = {}                    # keyed block in use -> its users
        self.evictor = LruKeys()  # cached, unused: least recently released first
        self.keys: Dict[int, list] = {}                       # request -> keys of the cached blocks it holds, by
        #                                                       position: its full blocks registered so far
        self.pending: Dict[int, Sequence[Hashable]] = {}      # request -> keys of all its full blocks (by position)
        self.private: Dict[int, int] = {}                     # request -> its blocks without a key reference
        self.used = 0
        self.evictions = 0
        #: with ``track_users()``: keyed block in use -> the requests holding it, and the keys two or more hold
        self.users: Optional[Dict[Hashable, list]] = None
        self.multi: Optional[Dict[Hashable, None]] = None
        self.multi_version = 0  # changes whenever a block two or more requests hold gains or loses one
        #: ``keys -> None``: told the keys of every cached block evicted (an offload tier writes them; None: nobody)
        self.on_evict = None
        #: ``i -> None``: told when request i's first block is cached (kvstudy/engine/indexed_queue.py; None: nobody)
        self.on_first = None

    def track_users(self) -> None:
        """Keep who holds each keyed block (a policy weighing shared blocks by their holders asks for it: MC-SF's
        prefix-aware eq. (5)); off, the cache pays nothing for it. Call before any request holds blocks."""
        self.users, self.multi = {}, {}

    def _hold(self, key: Hashable, i: int) -> None:
        us = self.users.setdefault(key, [])
        us.append(i)
        if len(us) >= 2:
            self.multi[key] = None
            self.multi_version += 1

    def _drop(self, key: Hashable, i: int) -> None:
        us = self.users[key]
        us.remove(i)
        if not us:
            del self.users[key]
        elif len(us) == 1:
            self.multi.pop(key, None)
            self.multi_version += 1
        else:
            self.multi_version += 1

    # --- queries ------------------------------------------------------------------------------------------
    @property
    def free(self) -> int:
        return self.num_blocks - self.used

    @property
    def cached_blocks(self) -> int:
        """Blocks holding a cached (keyed) prefix: in use or in the evictor."""
        return len(self.ref) + len(self.evictor)

    def cached(self, key: Hashable) -> bool:
        """Whether the block of ``key`` is cached (in use or in the evictor)."""
        return key in self.ref or key in self.evictor

    def hit(self, keys: Sequence[Hashable], most: int = None) -> int:
        """The number of leading ``keys`` (at most ``most``) whose blocks are cached (in use or in the evictor)."""
        n, most = 0, len(keys) if most is None else min(most, len(keys))
        ref, evictor = self.ref, self.evictor
        while n < most and (keys[n] in ref or keys[n] in evictor):
            n += 1
        return n

    def new_blocks(self, keys: Sequence[Hashable], blocks: int, most: int = None, dropped=()) -> int:
        """Blocks of free memory a request of ``blocks`` blocks whose full blocks are ``keys`` would take now (its
        hit at most ``most`` blocks): every block it does not share with a running request (a hit in the evictor
        leaves the free pool too). ``dropped``: keys whose users all leave first (they are not shared then). Shared
        blocks count only up to the first hit in the evictor: an allocation made before this one in the same step may
        evict that block, and the hit ends there (so this is an upper bound whatever happens first)."""
        n = self.hit(keys, most)
        ref, shared = self.ref, 0
        for key in keys[:n]:
            if key not in ref:
                break  # in the evictor: an allocation before this one may evict it, ending the hit here
            if key not in dropped:
                shared += 1
        return blocks - shared

    def freed_by(self, i: int) -> int:
        """Blocks that become free if request i alone gives its blocks back (shared ones stay in use)."""
        ref = self.ref
        return self.private.get(i, 0) + sum(1 for key in self.keys.get(i, ()) if ref[key] == 1)

    def release_gain(self, requests: Iterable[int]) -> Tuple[int, set]:
        """(blocks freed, keys no longer in use) if all ``requests`` give their blocks back."""
        count = Counter(key for i in requests for key in self.keys.get(i, ()))
        ref = self.ref
        dropped = {key for key, n in count.items() if ref[key] == n}
        return sum(self.private.get(i, 0) for i in requests) + len(dropped), dropped

    # --- changes ----------------------------------------------------------------------------------------
    def acquire(self, i: int, keys: Sequence[Hashable], blocks: int, most: int = None, upto: int = None) -> int:
        """Request i takes ``blocks`` blocks, the first ``len(keys)`` full; returns how many leading keyed blocks
        were cached (its prefill skips them), at most ``most`` (vLLM: a prefill computes at least the prompt's last
        token, so a prompt of p tokens reuses at most (p - 1) // block_size blocks). Its full blocks below ``upto``
        (default: all) are cached now, the others by ``advance``. Raises MemoryError if free memory cannot hold
        them (check ``new_blocks`` first)."""
        check_acquire(self, i, keys, blocks, most)
        hit = self.hit(keys, most)
        ref, evictor = self.ref, self.evictor
        taken = []
        for key in keys[:hit]:
            if key in ref:
                ref[key] += 1  # shared with a running request: no new block
            else:
                evictor.remove(key)  # cached, unused: back in use
                ref[key] = 1
                self.used += 1
            taken.append(key)
        if self.users is not None:
            for key in taken:
                self._hold(key, i)
        own = blocks - hit
        self._make_room(own)
        self.used += own
        self.keys[i], self.pending[i], self.private[i] = taken, keys, own
        self.advance(i, len(keys) if upto is None else upto)
        return hit

    def advance(self, i: int, full_blocks: int) -> None:
        """Request i's blocks below ``full_blocks`` are computed (or scheduled): each with a key is cached under it;
        if that key is cached already (another request computed the same block meanwhile), the request's copy is
        freed and it shares the cached block (vLLM V0's ``promote_to_immutable_block``)."""
        taken = self.keys[i]  # every full block registered so far, one key each (a copy of a cached one shares it)
        start = len(taken)
        end = min(full_blocks, len(self.pending[i]))
        if end <= start:
            return
        if start == 0 and self.on_first is not None:
            self.on_first(i)
        new = self.pending[i][start:end]
        ref, evictor = self.ref, self.evictor
        if ref.keys().isdisjoint(new) and evictor.keys().isdisjoint(new):  # the usual case, in bulk
            ref.update(dict.fromkeys(new, 1))
            taken.extend(new)
            if self.users is not None:
                self.users.update(zip(new, map(list, zip(repeat(i, len(new))))))
        else:  # some are cached already: vLLM V0 frees the request's copy and shares the cached block
            for key in new:
                if key in ref:
                    ref[key] += 1
                    self.used -= 1  # its own copy is freed
                    if self.users is not None:
                        self._hold(key, i)
                else:
                    if key in evictor:
                        evictor.remove(key)  # the cached copy back in use, the request's own freed: used unchanged
                    ref[key] = 1
                    if self.users is not None:
                        self.users[key] = [i]
                taken.append(key)
        self.private[i] -= len(new)

    def grow(self, i: int, blocks: int = 1) -> None:
        """Request i takes ``blocks`` more blocks of its own (a decode crossing a block boundary, a swap-in)."""
        if self.num_blocks - self.used - len(self.evictor) < blocks:
            self._make_room(blocks)
        self.private[i] = self.private.get(i, 0) + blocks
        self.used += blocks
        if i not in self.keys:
            self.keys[i], self.pending[i] = [], ()

    def release(self, i: int, full_blocks: Optional[int] = None, keys: Optional[Sequence[Hashable]] = None) -> int:
        """Request i gives its blocks back: keyed blocks nobody else uses go to the evictor (tail first, so its
        prefix is evicted last, as vLLM frees a request's blocks), its own are freed. ``full_blocks``: its blocks
        below this are computed and cached first (``keys``: their keys, when they reach beyond those it started
        with: blocks its decode filled). Returns the blocks it held."""
        if full_blocks is not None:
            if keys is not None and len(keys) > len(self.pending.get(i, ())):
                self.pending[i] = keys
            self.advance(i, full_blocks)
        taken, own = self.keys.pop(i, []), self.private.pop(i, 0)
        self.pending.pop(i, None)
        if not taken:  # nothing cached: its own blocks are freed
            self.used -= own
            return own
        ref, evictor, users = self.ref, self.evictor, self.users
        if users is not None:
            for key in taken:
                self._drop(key, i)
        counts = list(map(ref.__getitem__, taken))
        if counts and max(counts) > 1:  # blocks others hold too stay in use, one user fewer
            for key, n in zip(taken, counts):
                if n > 1:
                    ref[key] = n - 1
            taken = [key for key, n in zip(taken, counts) if n == 1]
        # the rest, in bulk (C loops): out of use, into the evictor tail first
        deque(map(ref.__delitem__, taken), maxlen=0)
        evictor.extend(taken[::-1])
        freed = len(taken)
        self.used -= freed + own
        return len(counts) + own

    def _make_room(self, blocks: int) -> None:
        """Evict least recently released cached blocks until ``blocks`` uncached free blocks exist."""
        short = blocks - (self.free - len(self.evictor))
        if short <= 0:
            return
        if self.on_evict is None:
            gone = self.evictor.pop_first(short)
        else:
            evicted: list = []
            gone = self.evictor.pop_first(short, evicted)
            self.on_evict(evicted)
        self.evictions += gone
        if gone < short:
            raise MemoryError(f"{blocks} blocks needed, {blocks - short + gone} free")


Segment = Tuple[Hashable, int]


class KeyRuns:
    """A request's block keys as ``BlockKeys`` makes them: one arithmetic run per chain (``firsts[r]``, then every
    ``step`` up, at positions ``starts[r]`` to ``starts[r + 1]``). A read-only sequence of the keys; the run cache
    (kvstudy/memory/prefix_runs.py) reads the runs, and anything reading single keys gets them listed once (the list is
    kept: what needs per-block detail pays for it, once). Not a ``collections.abc.Sequence`` subclass: an ABC's
    isinstance checks would cost more than the reads."""

    __slots__ = ("firsts", "starts", "step", "_list")

    def __init__(self, firsts: List[int], starts: List[int], step: int) -> None:
        self.firsts, self.starts, self.step, self._list = firsts, starts, step, None

    def items(self) -> List[int]:
        """The keys, listed (once)."""
        if self._list is None:
            out: List[int] = []
            step, starts = self.step, self.starts
            for r, first in enumerate(self.firsts):
                out.extend(range(first, first + (starts[r + 1] - starts[r]) * step, step))
            self._list = out
        return self._list

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, index):
        return self.items()[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self.items())

    def __eq__(self, other) -> bool:
        return list(self) == list(other) if isinstance(other, (list, KeyRuns)) else NotImplemented

    def __repr__(self) -> str:
        return f"KeyRuns({self.items()!r})"

    @staticmethod
    def joined(batches: Sequence[Sequence[Hashable]]) -> Sequence[Hashable]:
        """Batches of keys one after another: ``KeyRuns`` of one step stay runs; anything else is listed."""
        if len(batches) == 1:
            return batches[0]
        if batches and all(type(b) is KeyRuns and b.step == batches[0].step for b in batches):
            firsts, starts = [], [0]
            for b in batches:
                firsts += b.firsts
                starts += [starts[-1] + n for n in b.starts[1:]]
            return KeyRuns(firsts, starts, batches[0].step)
        return [key for b in batches for key in b]


class BlockKeys:
    """Keys of a request's full blocks (engine blocks of ``block_size`` tokens) from its ``segments``: ``(key,
    length)`` pairs whose concatenation is the start of its token sequence (equal keys: equal content and length;
    the workload interface, kvstudy/workloads/requests.py). Block k (tokens [k*b, (k+1)*b)) ends inside segment s;
    its key names the chain of segments up to and including s and the block's end offset in s, so two blocks have
    one key exactly when everything up to their ends agrees. Blocks past the segments have no key (the request's
    own). Chains are numbered as first seen (one table per run, growing with distinct segment prefixes, not blocks):
    a key is one int, ``chain << 32 | offset``. A chain is numbered after its parent, so a request's keys increase.
    Returned as ``KeyRuns`` (one run per chain, the keys listed only when read one by one)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = int(block_size)
        self._chains: dict = {}

    def __call__(self, segments: Sequence[Segment], tokens: int) -> KeyRuns:
        bs = self.block_size
        full, chains = int(tokens) // bs, self._chains
        firsts: List[int] = []
        starts: List[int] = [0]
        n = 0
        chain, start, end_k = -1, 0, bs  # end_k: the end (exclusive) of the next block
        for segment in segments:
            if n >= full:
                break
            link = (chain, segment[0], segment[1])
            chain = chains.get(link)
            if chain is None:
                chain = chains[link] = len(chains)
            end = start + segment[1]
            last = min(end, full * bs)  # the end of the last full block inside this segment (if any)
            if end_k <= last:
                # offsets end_k - start, end_k + bs - start, ...: an arithmetic run (chain << 32 | offset = + offset)
                stop = last - (last - end_k) % bs
                firsts.append((chain << 32) + end_k - start)
                n += (stop - end_k) // bs + 1
                starts.append(n)
                end_k = stop + bs
            start = end
        return KeyRuns(firsts, starts, bs)


def lru_hit_rate(hash_ids_list: Sequence[Sequence[int]], prompts: Sequence[int], outputs: Sequence[int],
                 num_blocks: int, block_size: int = 16, trace_block: int = 512) -> float:
    """The cache alone, before any scheduler: the share of prompt tokens an LRU block cache of ``num_blocks`` blocks
    serves if the requests run one at a time in their order, each holding its blocks (prompt + output) only while it
    runs (bench/prefix_hits.py, notebook 05)."""
    from kvstudy.workloads.trace import mooncake_segments  # a trace's ids as segments (the workload's reading)

    cache, make, hit, total = PrefixCache(num_blocks), BlockKeys(block_size), 0, 0
    for i, (ids, prompt, output) in enumerate(zip(hash_ids_list, prompts, outputs)):
        blocks = min(-(-(prompt + output) // block_size), num_blocks)
        keys = make(mooncake_segments(ids, prompt, trace_block), prompt)[:blocks]
        hit += cache.acquire(i, keys, blocks, most=(prompt - 1) // block_size) * block_size
        total += prompt
        cache.release(i)
    return hit / total if total else 0.0


def reusable_tokens(hash_ids_list: Sequence[Sequence[int]], prompts: Sequence[int], trace_block: int = 512,
                    block_size: int = 16) -> list:
    """The independent count (issue 36's acceptance): with unlimited memory, request j could reuse the longest run of
    its leading trace blocks seen in any earlier prompt, times ``trace_block``, in whole engine blocks, at most
    prompt - 1 tokens."""
    seen = set()
    out = []
    for ids, prompt in zip(hash_ids_list, prompts):
        n = 0
        while n < len(ids) and tuple(ids[:n + 1]) in seen:
            n += 1
        out.append(min(n * trace_block, (prompt - 1) // block_size * block_size))
        for m in range(1, len(ids) + 1):
            seen.add(tuple(ids[:m]))
    return out
