"""vLLM's automatic prefix caching, counted in blocks (issue 36; vLLM's design doc "Automatic Prefix Caching" and
its v1 ``block_pool.py``): the block bookkeeping alone. Not yet used by the engine: ``memory.prefix_caching`` on
``PagedMemory`` is to build on it (issue 36's memory item); its hand-worked tests and the independent count on
Mooncake's traces are in tests/test_prefix_cache.py.

* A block is named by a *key* that chains everything before it: two requests share a block only if their contents
  agree up to and including it (vLLM: ``hash(parent hash, block tokens)``). Keys come from the workload
  (``BlockKeys``: a trace's ``hash_ids`` mapped onto the engine's blocks); only full blocks have keys.
* A computed full block is cached. Blocks in use are reference-counted: a block shared by k running requests is
  one block of memory. A cached block nobody uses stays in an LRU *evictor*; it counts as free memory and is evicted
  (least recently released first) only when an allocation needs a block and no uncached free block is left.
* ``acquire(i, keys, blocks, most)``: request i starts with its longest prefix of cached keys (``hit``, at most
  ``most`` blocks: a prefill computes at least the prompt's last token), taken back from the evictor or shared with
  their users, plus new blocks for the rest; ``release(i)`` drops its references (its keyed
  blocks go to the evictor, newest last; private blocks are freed at once).

Memory: ``used`` = distinct blocks referenced by a request; ``free`` = ``num_blocks - used`` (cached blocks in the
evictor included, as vLLM counts them); ``used`` never exceeds ``num_blocks``.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Dict, Hashable, List, Sequence


class PrefixCache:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks}: at least 1")
        self.num_blocks = int(num_blocks)
        self.ref: Dict[Hashable, int] = {}                    # keyed block in use -> its users
        self.evictor: "OrderedDict[Hashable, None]" = OrderedDict()  # cached, unused: least recently released first
        self.keys: Dict[int, List[Hashable]] = {}             # request -> the keyed blocks it references
        self.private: Dict[int, int] = {}                     # request -> its blocks without a key
        self.used = 0
        self.evictions = 0

    # --- queries ------------------------------------------------------------------------------------------
    @property
    def free(self) -> int:
        return self.num_blocks - self.used

    def cached(self, key: Hashable) -> bool:
        return key in self.ref or key in self.evictor

    def hit(self, keys: Sequence[Hashable], most: int = None) -> int:
        """The number of leading ``keys`` (at most ``most``) whose blocks are cached (in use or in the evictor)."""
        n, most = 0, len(keys) if most is None else min(most, len(keys))
        while n < most and (keys[n] in self.ref or keys[n] in self.evictor):
            n += 1
        return n

    def new_blocks(self, keys: Sequence[Hashable], blocks: int, most: int = None) -> int:
        """Blocks of free memory a request of ``blocks`` blocks whose full blocks are ``keys`` would take now (its
        hit at most ``most`` blocks): every block it does not share with a running request (a hit in the evictor
        leaves the free pool too)."""
        n = self.hit(keys, most)
        return blocks - sum(1 for key in keys[:n] if key in self.ref)

    # --- changes ----------------------------------------------------------------------------------------
    def acquire(self, i: int, keys: Sequence[Hashable], blocks: int, most: int = None) -> int:
        """Request i takes ``blocks`` blocks, the first ``len(keys)`` full; returns how many leading keyed blocks
        were cached (its prefill skips them), at most ``most`` (vLLM: a prefill computes at least the prompt's last
        token, so a prompt of p tokens reuses at most (p - 1) // block_size blocks). Its other full blocks are
        computed and cached under their keys, unless a block of the same key is cached already (then this copy is
        the request's own). Raises MemoryError if free memory cannot hold them (check ``new_blocks`` first)."""
        if i in self.keys or i in self.private:
            raise ValueError(f"request {i} holds blocks already")
        if len(keys) > blocks:
            raise ValueError(f"{len(keys)} full blocks of a request of {blocks} blocks")
        need = self.new_blocks(keys, blocks, most)
        if need > self.free:
            raise MemoryError(f"request {i} needs {need} blocks, {self.free} free")
        hit = self.hit(keys, most)
        taken, own = [], blocks - len(keys)
        for k, key in enumerate(keys):
            if k < hit:
                if key in self.ref:
                    self.ref[key] += 1  # shared with a running request: no new block
                    taken.append(key)
                    continue
                del self.evictor[key]  # cached, unused: back in use
            elif self.cached(key):
                own += 1  # computed again beside a cached copy: the request's own block
                continue
            else:
                self._make_room(1)
            self.ref[key] = 1
            self.used += 1
            taken.append(key)
        self._make_room(own)
        self.used += own
        self.keys[i], self.private[i] = taken, own
        return hit

    def grow(self, i: int, blocks: int = 1) -> None:
        """Request i takes ``blocks`` more private blocks (a decode crossing a block boundary)."""
        self._make_room(blocks)
        self.private[i] = self.private.get(i, 0) + blocks
        self.used += blocks

    def release(self, i: int) -> int:
        """Request i gives its blocks back: keyed blocks nobody else uses go to the evictor (most recently released
        last, so evicted last), private ones are freed. Returns the blocks it held."""
        keys, own = self.keys.pop(i, []), self.private.pop(i, 0)
        for key in reversed(keys):  # vLLM frees a request's blocks tail first: its prefix is evicted last
            self.ref[key] -= 1
            if not self.ref[key]:
                del self.ref[key]
                self.evictor[key] = None
                self.used -= 1
        self.used -= own
        return len(keys) + own

    def _make_room(self, blocks: int, keep=()) -> None:
        """Evict least recently released cached blocks until ``blocks`` uncached free blocks exist."""
        uncached = self.free - len(self.evictor)
        while uncached < blocks and self.evictor:
            self.evictor.popitem(last=False)
            self.evictions += 1
            uncached += 1
        if uncached < blocks:
            raise MemoryError(f"{blocks} blocks needed, {uncached} free")


class BlockKeys:
    """Keys of requests' full prompt blocks (engine blocks of ``block_size``) from a trace's per-block hashes
    (Mooncake: ``hash_ids`` of the prompt's ``trace_block``-token blocks, chained as a prefix). Engine block k
    (tokens [k*b, (k+1)*b)) lies in trace block t = k*b // trace_block; its key is (the trace's chain up to t, k's
    offset in t). A partial last trace block is chained with its length, so it is never shared with a longer one.
    Chains are numbered as they are first seen (one table per run), so a key is two small ints."""

    def __init__(self, trace_block: int, block_size: int) -> None:
        if trace_block % block_size:
            raise ValueError(f"trace block {trace_block} is not a multiple of block_size {block_size}")
        self.trace_block, self.block_size = trace_block, block_size
        self._chains: dict = {}

    def __call__(self, hash_ids: Sequence[int], prompt_tokens: int) -> list:
        tb, bs = self.trace_block, self.block_size
        per, full = tb // bs, prompt_tokens // bs
        keys, chain = [], -1
        for t, h in enumerate(hash_ids):
            first = t * per
            if first >= full:
                break
            length = min(tb, prompt_tokens - t * tb)
            link = (chain, h, length if length < tb else 0)
            chain = self._chains.setdefault(link, len(self._chains))
            keys.extend((chain, j) for j in range(min(per, full - first)))
        return keys


def engine_block_keys(hash_ids: Sequence[int], prompt_tokens: int, trace_block: int, block_size: int) -> list:
    """``BlockKeys`` for one request alone (chains numbered afresh: compare keys of one call only)."""
    return BlockKeys(trace_block, block_size)(hash_ids, prompt_tokens)


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
