"""vLLM's paged KV cache (Kwon et al., SOSP 2023; vLLM V0 ``core/block_manager.py``), counted in blocks.

* Capacity: ``num_blocks = capacity_tokens // block_size`` GPU blocks; a request whose context is c tokens
  needs ``ceil(c / block_size)`` of them.
* Admission watermark (``can_allocate``): ``watermark_blocks = int(watermark * num_blocks)``; a new prefill
  needing b blocks is OK if ``free - b >= watermark_blocks``, LATER if not, NEVER if
  ``num_blocks - b < watermark_blocks`` (vLLM rejects such a prompt).
* Growth: a decoding request takes one more block when its context crosses a block boundary
  (``can_append_slots``: one free block, no watermark).
* Reservations: a policy may hold more blocks than a request's context needs (RLP, S3 and CacheOPT
  allocate up front); the difference is reported as *reserved* blocks. Growth beyond what is held needs
  a new allocation.
* Host swap space: ``swap_space_gb`` GiB per GPU (vLLM's default 4), in blocks of one GPU's shard
  (``block_size * kv_bytes_per_token / tensor_parallel`` bytes). When it is full a swap-out is not possible;
  the engine then recomputes instead and counts it (``swap_fallbacks``), as it does for a request too large
  to ever pass ``can_swap_in`` again.
* Loans (CacheOPT's embedding, Shen et al. Sec. 3.3.1): a running *host* may lend blocks it holds but does not use
  to a *guest*; the blocks change hands, ``used`` does not change. They go back to the host when the guest
  finishes or is preempted (if the host still holds KV), and become the guest's own if the host leaves first.

* Prefix caching (``prefix_caching=true``, issue 36): vLLM's automatic prefix caching on these blocks
  (kvstudy/memory/prefix.py holds the bookkeeping and its vLLM semantics). ``gpu[i]`` stays the blocks request i
  sees (shared ones included: its context's blocks, as without caching), ``used`` counts distinct blocks (a block
  shared by k requests once), and cached blocks nobody uses count as free until evicted. A prefill starts past its
  longest cached prefix of whole blocks (``start``; at most prompt - 1 tokens), its full blocks are cached as they
  are scheduled (``advance``) and when it leaves (``release``/``swap_out``: the blocks its decode filled too, if the
  workload's segments name them). A swapped-out request's blocks come back as its own (its GPU copies were released
  to the cache). ``freed_by(i)`` is what preempting i alone frees (not the blocks it shares); ``can_allocate`` still
  counts all of a prompt's blocks, as vLLM V0's block manager does with prefix caching (a conservative admission;
  vLLM v1 counts only blocks not in use). Loans (CacheOPT's embedding) are not modelled with caching.

The engine owns one ``PagedMemory`` per run: it is the only code that changes these counters, after
validating a policy's decision against them. ``PagedMemory(..., prefix_caching=True)`` builds a
:class:`PrefixCachingMemory`, the same model with the cache behind the same methods; ``PagedMemory`` itself is the
"no cache" implementation (SGLang's ``ChunkCache`` idea), so neither it nor its callers test for a cache.
"""
from __future__ import annotations

from typing import Optional

from kvstudy.config.validate import check_group
from kvstudy.errors import ConfigError
from kvstudy.memory.connector import KVConnector, NoConnector
from kvstudy.memory.offload import from_config as offload_tiers
from kvstudy.memory.base import LATER, NEVER, OK
from kvstudy.memory.path_keys import PathKeys
from kvstudy.memory.prefix import KeyRuns, NoPrefixIndex, PrefixCache
from kvstudy.memory.prefix_runs import RunPrefixCache


class PagedMemory:
    """vLLM's paged KV cache without prefix caching (module docstring); implements kvstudy/memory/base.py's
    ``MemoryModel``. Built with ``prefix_caching=True`` it is a :class:`PrefixCachingMemory`."""
    name = "paged"

    def __new__(cls, *args, **kwargs):
        caching = kwargs.get("prefix_caching", args[6] if len(args) > 6 else False)
        if cls is PagedMemory and caching is True:
            cls = PrefixCachingMemory
        return super().__new__(cls)
    modes = ("recompute", "swap")
    #: the token convention this model fixes: vLLM's (o tokens, the first from the prefill; a recompute keeps them)
    convention = "vllm"
    #: True: KV held per request in blocks; every decision is checked against the blocks the cache has
    tracks_blocks = True
    #: CacheOPT's loans (kvstudy/memory/base.py's ``Loans``): modelled here, not with prefix caching
    supports_loans = True

    def __init__(self, capacity_tokens: int, block_size: int = 16, watermark: float = 0.01,
                 swap_space_gb: float = 4.0, decode_block_check: str = "vllm", name: str = "paged",
                 prefix_caching: bool = False, offload: Optional[dict] = None,
                 connector: Optional[KVConnector] = None) -> None:
        # every value against its declaration in kvstudy/config/schema.py (one place), then the rule between two
        check_group("memory", {"_target_": "kvstudy.memory.PagedMemory", "capacity_tokens": capacity_tokens,
                               "block_size": block_size, "watermark": watermark, "swap_space_gb": swap_space_gb,
                               "decode_block_check": decode_block_check, "prefix_caching": prefix_caching,
                               **({"offload": dict(offload)} if offload else {})})
        if offload and not prefix_caching:
            raise ConfigError("memory.offload: the tiers hold the prefix cache's evicted blocks; allowed with "
                              "memory.prefix_caching=true only (memory=paged_offload sets both)")
        try:  # memory.offload's tiers (None: no tier given), built once
            tiers = offload_tiers(dict(offload) if offload else None)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if connector is not None and tiers is not None:
            raise ConfigError("memory.connector and memory.offload both move the prefix cache's blocks; allowed: "
                              "one of them (memory.offload.host_gb=null and disk_gb=null, or memory.connector=null)")
        if connector is not None and not prefix_caching:
            raise ConfigError("memory.connector: a connector moves the prefix cache's blocks (keyed by content); "
                              "allowed with memory.prefix_caching=true only")
        #: the KV connector (kvstudy/memory/connector.py): a user's own, the offload tiers behind the prefix cache
        #: (kvstudy/memory/offload.py), or ``NoConnector``
        self.connector = connector if connector is not None else tiers if tiers is not None else NoConnector()
        if int(capacity_tokens) < block_size:
            raise ConfigError(f"memory.capacity_tokens={capacity_tokens}: less than one block of "
                              f"memory.block_size={block_size} tokens")
        #: vLLM's automatic prefix caching (module docstring): True only on a ``PrefixCachingMemory``, whose ``cache``
        #: holds the bookkeeping during a run (``NoPrefixIndex`` here: no cache)
        self.prefix_caching = prefix_caching
        self.cache = NoPrefixIndex()
        self.segments = None
        #: when a running request may decode (vLLM's and Vidur's policies read it): ``boundary``, only a request
        #: crossing a block boundary needs a free block; ``vllm``, every decode needs one free block at its turn, as
        #: vLLM 0.6's ``can_append_slots`` and Vidur's ``_can_allocate_request`` ask (it takes it only at a boundary)
        self.decode_block_check = decode_block_check
        self.capacity_tokens = int(capacity_tokens)
        self.block_size = int(block_size)
        self.watermark = float(watermark)
        self.swap_space_gb = float(swap_space_gb)
        self.num_blocks = self.capacity_tokens // self.block_size
        self.watermark_blocks = int(self.watermark * self.num_blocks)
        self.host_blocks_total = 0
        self.block_bytes_per_gpu = 0
        self.gpu: dict = {}
        self.host: dict = {}
        self.loans: dict = {}  # guest -> (host, blocks)
        self.used = 0
        self.host_used = 0

    # --- set-up -------------------------------------------------------------------------------------
    def bind(self, kv_bytes_per_token_per_gpu: int) -> None:
        """Start a run: size the host space for this model's shard and clear all counters."""
        self.block_bytes_per_gpu = int(self.block_size * kv_bytes_per_token_per_gpu)
        self.host_blocks_total = int(self.swap_space_gb * 2**30 // self.block_bytes_per_gpu) \
            if self.block_bytes_per_gpu else 0
        self.gpu, self.host, self.loans = {}, {}, {}
        self.used = self.host_used = 0

    def set_segments(self, segments) -> None:
        """The run's requests' shared content (``Requests.segments``: per request index its (key, length) pairs, or
        None: no request shares anything); read only with prefix caching."""
        self.segments = segments

    # --- queries (used by policies to plan, by the engine to check) -------------------------------
    def blocks(self, tokens: int) -> int:
        return -(-int(tokens) // self.block_size)

    def rejection(self, prompt: int, output: int, watermark: bool = True) -> str:
        """Why a request can never be served (empty: it can): its prompt + output needs more blocks than the cache
        has (it would preempt itself forever), or (``watermark``: vLLM's rule, for the vLLM family) its prompt's
        blocks ``can_allocate`` calls NEVER."""
        if self.blocks(prompt + output) > self.num_blocks:
            return (f"prompt + output = {prompt + output} tokens needs {self.blocks(prompt + output)} blocks, more "
                    f"than the cache's {self.num_blocks}")
        if watermark and self.can_allocate(self.blocks(prompt)) == NEVER:
            return (f"prompt of {prompt} tokens needs {self.blocks(prompt)} blocks; the watermark leaves "
                    f"{self.num_blocks - self.watermark_blocks}")
        return ""

    def overflows(self, need_tokens: int, growing: int) -> bool:
        """Do the running requests' next tokens need more blocks than the cache has (``growing`` of them need one
        more block each)?"""
        return self.used + growing > self.num_blocks

    @property
    def free(self) -> int:
        return self.num_blocks - self.used

    def held(self, i: int) -> int:
        return self.gpu.get(i, 0)

    def can_allocate(self, need_blocks: int, free: int = None) -> str:
        """vLLM's ``BlockSpaceManager.can_allocate`` for a prefill needing ``need_blocks``; ``free`` lets a
        policy ask against its own running count of free blocks while it plans one step."""
        free = self.free if free is None else free
        if self.num_blocks - need_blocks < self.watermark_blocks:
            return NEVER
        return OK if free - need_blocks >= self.watermark_blocks else LATER

    def can_swap_in(self, i: int, free: int = None) -> str:
        """vLLM's ``can_swap_in``: the request's blocks plus one for its next token, above the watermark."""
        free = self.free if free is None else free
        need = self.host.get(i, 0) + 1
        if self.num_blocks < need:
            return NEVER
        return OK if free - need >= self.watermark_blocks else LATER

    def swapped_blocks(self, i: int) -> int:
        return self.host.get(i, 0)

    def swap_in_blocks(self, i: int, context_tokens: int) -> int:
        """GPU blocks request i holds once swapped back in to decode: its blocks on the host, or more if its next
        token (context ``context_tokens`` = prompt + generated) crosses a block boundary."""
        return max(self.host[i], self.blocks(context_tokens))

    def host_has_room(self, blocks: int) -> bool:
        return self.host_used + blocks <= self.host_blocks_total

    @property
    def max_request_tokens(self) -> int:
        """The longest context that can ever be held (all blocks)."""
        return self.num_blocks * self.block_size

    # --- changes (engine only) ----------------------------------------------------------------------
    def hold(self, i: int, blocks: int) -> int:
        """Make request i hold ``blocks`` GPU blocks (never fewer than now); returns blocks added."""
        have = self.gpu.get(i, 0)
        add = blocks - have
        if add > 0:
            self.gpu[i] = blocks
            self._take(i, add)
            return add
        return 0

    def _take(self, i: int, blocks: int) -> None:
        """``blocks`` more blocks of request i's own in use."""
        self.used += blocks

    def lend(self, host: int, guest: int, blocks: int) -> None:
        """Move ``blocks`` of the host's held blocks to the guest (CacheOPT's embedding)."""
        self.gpu[host] -= blocks
        self.gpu[guest] = self.gpu.get(guest, 0) + blocks
        self.loans[guest] = (host, blocks)

    def _settle(self, i: int) -> None:
        """Request i leaves the GPU: its loan goes back to its host (if the host still holds KV), and loans it made
        become its guests' own."""
        if i in self.loans:
            host, blocks = self.loans.pop(i)
            if host in self.gpu:
                self.gpu[host] += blocks
                self.gpu[i] -= blocks
        for guest in [g for g, (h, _) in self.loans.items() if h == i]:
            del self.loans[guest]

    def release(self, i: int, computed: int = 0) -> int:
        """Free request i's blocks (a loan's go back to its host); returns the blocks it held, loan included.
        ``computed``: tokens of its context whose KV was computed (prefix caching keeps their full blocks)."""
        held = self.gpu.get(i, 0)
        if self.loans:
            self._settle(i)
        self.used -= self.gpu.pop(i, 0)
        return held

    def swap_out(self, i: int, computed: int = 0) -> int:
        """Request i's KV to the host: all its blocks are copied; a loan's blocks stay on the GPU with its host."""
        held = self.release(i, computed)
        self.host[i] = held
        self.host_used += held
        return held

    def swap_in(self, i: int) -> int:
        blocks = self.host.pop(i)
        self.host_used -= blocks
        self.gpu[i] = blocks
        self._take(i, blocks)  # with prefix caching: back as its own blocks
        return blocks

    # --- prefix caching's queries and changes: what a prefill skips (nothing here) ---------------------------------
    def start(self, i: int, tokens: int) -> int:
        """Request i starts a prefill of ``tokens`` tokens and holds its context's blocks (a guest may hold lent ones
        already); returns the tokens it skips: none without prefix caching."""
        self.hold(i, self.blocks(tokens))
        return 0

    def advance(self, i: int, computed: int) -> None:
        """Request i's prefill has scheduled ``computed`` tokens (prefix caching caches their full blocks)."""

    def keys(self, i: int, tokens: int) -> list:
        """Keys of request i's full blocks within its first ``tokens`` tokens: none without prefix caching."""
        return []

    def first_block(self, i: int, tokens: int):
        """No prefix caching: no block is ever cached."""
        return None

    def first_block_cached(self, name) -> bool:
        return False

    def cached_tokens(self, i: int, tokens: int) -> int:
        """Tokens of request i's first ``tokens`` a prefill starting now would skip: none without prefix caching."""
        return 0

    def start_blocks(self, i: int, tokens: int, dropped=()) -> int:
        """Free blocks request i's prefill of ``tokens`` tokens takes now: all of them without prefix caching."""
        return self.blocks(tokens)

    def freed_by(self, i: int) -> int:
        """Blocks preempting request i alone frees: all it holds."""
        return self.gpu.get(i, 0)

    def release_gain(self, requests) -> tuple:
        """(blocks freed, keys no longer in use) if all ``requests`` give their blocks back."""
        return sum(self.gpu.get(i, 0) for i in requests), set()

    def cache_stats(self) -> tuple:
        """(blocks holding a cached prefix, cached blocks evicted so far): none without a cache."""
        return 0, 0

    def describe(self) -> dict:
        connector = self.connector.describe()
        return {"name": self.name, "capacity_tokens": self.capacity_tokens, "block_size": self.block_size,
                "num_blocks": self.num_blocks, "watermark_blocks": self.watermark_blocks,
                "swap_space_gb": self.swap_space_gb, "host_blocks": self.host_blocks_total,
                **({"prefix_caching": True} if self.prefix_caching else {}),
                **({"offload": connector} if connector else {})}

    def __repr__(self) -> str:
        return f"PagedMemory({self.num_blocks} blocks of {self.block_size}, watermark {self.watermark_blocks})"




class PrefixCachingMemory(PagedMemory):
    """:class:`PagedMemory` with vLLM's automatic prefix caching (``memory.prefix_caching=true``; the module docstring
    and kvstudy/memory/prefix.py give its semantics): the same interface, the cache behind it. ``used`` counts
    distinct blocks; a prefill starts past its longest cached prefix of whole blocks; full blocks are cached as they
    are scheduled and when their request leaves. Loans (CacheOPT's embedding) are not modelled with caching."""

    supports_loans = False

    def bind(self, kv_bytes_per_token_per_gpu: int) -> None:
        super().bind(kv_bytes_per_token_per_gpu)
        # the cache as runs of each chain (kvstudy/memory/prefix_runs.py): the per-block cache's answers at a cost per
        # chain; a policy asking who holds each block (track_users) gets the per-block one before the run starts
        self.cache = RunPrefixCache(self.num_blocks, self.block_size, per_block=self._per_block)
        self.connector.bind(self.block_size, self.block_bytes_per_gpu)
        self._paths, self._memo = None, {}  # the keys' names: the trace's tree of segments (set_segments)
        #: the connector supplies or takes blocks (the offload tiers, a user's); False: the prefix cache alone, exactly
        self._external = type(self.connector) is not NoConnector
        if self.connector.saves:
            self.cache.on_evict = self.connector.save

    def set_segments(self, segments) -> None:
        super().set_segments(segments)
        self._memo = {}
        # blocks named by the tree of every request's segments (kvstudy/memory/path_keys.py): one run of keys per
        # unbranched stretch, and the same names on every replica given this list (a pool they share compares them)
        self._paths = PathKeys.of(segments, self.block_size) if segments is not None else None

    def _per_block(self) -> None:
        """The per-block cache in the run cache's place (nothing cached yet), keeping who holds each block."""
        runs = self.cache
        self.cache = PrefixCache(self.num_blocks)
        self.cache.on_evict, self.cache.on_first = runs.on_evict, runs.on_first
        self.cache.track_users()

    def _take(self, i: int, blocks: int) -> None:
        """``blocks`` more blocks of request i's own in use, taken through the cache (it may evict to make room)."""
        self.cache.grow(i, blocks)
        self.used = self.cache.used

    def lend(self, host: int, guest: int, blocks: int) -> None:
        raise ConfigError("memory.prefix_caching=true does not model CacheOPT's embedding (lending held blocks); "
                          "turn one of them off")

    def release(self, i: int, computed: int = 0) -> int:
        """Free request i's blocks: the full blocks of its ``computed`` tokens stay cached (evictable once unused)."""
        held = self.gpu.get(i, 0)
        self.gpu.pop(i, None)
        if self._segments(i) is None:
            self.cache.release(i)
        else:
            self.cache.release(i, computed // self.block_size, self._full_keys(i, computed))
        self.used = self.cache.used
        return held

    def _segments(self, i: int):
        """Request i's shared content (``Requests.segments``), or None: it shares nothing."""
        return self.segments[i] if self.segments is not None and self.segments[i] else None

    def keys(self, i: int, tokens: int) -> list:
        """Keys of request i's full blocks within its first ``tokens`` tokens (empty: it shares nothing)."""
        memo = self._memo.get(i)
        if memo is not None and memo[0] == tokens:
            return memo[1]
        keys = self._paths.keys(i, tokens) if self._segments(i) else []
        if len(self._memo) > 4096:  # planning policies ask about many waiting requests: keep the memo small
            self._memo.clear()
        self._memo[i] = (tokens, keys)
        return keys

    def _full_keys(self, i: int, computed: int):
        """Keys of the blocks a leaving request filled beyond those it started with (None: nothing new)."""
        have = len(self.cache.pending.get(i, ()))
        if not self._segments(i) or computed // self.block_size <= have \
                or self._paths.segment_total(i) // self.block_size <= have:  # no key beyond those it has
            return None
        return self._paths.keys(i, computed)

    def first_block(self, i: int, tokens: int):
        """A name of request i's first full block within ``tokens`` tokens, or None (it has none, or shares nothing):
        the segments up to the one the block ends in and its end offset there. Two requests' first blocks have one key
        exactly when their names are equal (``BlockKeys``); unlike a key, a name does not depend on the order keys
        were made in, so naming a block changes nothing."""
        bs, segments = self.block_size, self._segments(i)
        if tokens < bs or segments is None:
            return None
        start = 0
        for s, (key, length) in enumerate(segments):
            if start + length >= bs:
                return tuple((k, n) for k, n in segments[:s + 1]), bs - start
            start += length
        return None

    def first_block_cached(self, name) -> bool:
        """Whether the first block named ``name`` (``first_block``) is cached now (in use or in the evictor)."""
        key = self._paths.key_of(name[0], self.block_size)  # a first block ends at token block_size
        return key is not None and self.cache.cached(key)

    def cached_tokens(self, i: int, tokens: int) -> int:
        """Its longest cached prefix of whole blocks, at most tokens - 1 (with offload tiers: and the blocks after it a
        tier holds, if they would be loaded)."""
        keys, most = self.keys(i, tokens), (tokens - 1) // self.block_size
        hit = self.cache.hit(keys, most)
        if self._external:
            hit += self.connector.plan(keys, hit, most, tokens)
        return hit * self.block_size

    def start_blocks(self, i: int, tokens: int, dropped=()) -> int:
        """Its blocks less those it shares with running requests (``dropped``: keys whose users are all preempted
        first, so not shared)."""
        return self.cache.new_blocks(self.keys(i, tokens), self.blocks(tokens), (tokens - 1) // self.block_size,
                                     dropped)

    def start(self, i: int, tokens: int) -> int:
        """Request i takes its blocks, its cached prefix shared or taken back from the evictor; returns the tokens it
        skips. The engine then caches the blocks each chunk fills as it schedules it (``advance``; vLLM v1 caches at
        scheduling)."""
        blocks = self.gpu[i] = self.blocks(tokens)
        connector = self.connector
        if self._external:  # every start is a lookup of its tokens, for the hit rates (a miss too)
            connector.looked_up(tokens)
        if self._segments(i) is None:  # it shares nothing: blocks of its own, nothing to look up
            self._take(i, blocks)
            return 0
        keys = self.keys(i, tokens)
        self._memo.pop(i, None)
        bs = self.block_size
        most = (tokens - 1) // bs
        if not self._external:
            hit = self.cache.acquire(i, keys, blocks, most, upto=0)
            self.used = self.cache.used
            return hit * bs
        # the blocks after the GPU's hit the connector holds are loaded (or recomputed) as found before this
        # allocation: what the allocation evicts reaches it after the lookup (what cached_tokens promised is what it
        # gets)
        evicted: list = []  # batches of keys (runs from the run cache)
        self.cache.on_evict = evicted.append
        try:
            hit = self.cache.acquire(i, keys, blocks, most, upto=0)
        finally:
            self.cache.on_evict = connector.save if connector.saves else None
        self.used = self.cache.used
        load = connector.plan(keys, hit, most, tokens)
        if load:
            connector.load(i, keys, hit, load)
            self.cache.advance(i, hit + load)  # their KV is here: cached as the request's computed blocks
            hit += load
        else:
            connector.skipped(keys, hit, most)
        if evicted and connector.saves:
            evicted = KeyRuns.joined(evicted)
            if len(evicted):
                connector.save(evicted)
        return hit * bs

    def advance(self, i: int, computed: int) -> None:
        """Its full blocks among ``computed`` tokens are cached."""
        self.cache.advance(i, computed // self.block_size)

    def freed_by(self, i: int) -> int:
        """Those it does not share."""
        return self.cache.freed_by(i)

    def release_gain(self, requests) -> tuple:
        """Shared blocks stay in use."""
        return self.cache.release_gain(requests)

    def cache_stats(self) -> tuple:
        """(blocks holding a cached prefix, in use or evictable; cached blocks evicted so far)."""
        return self.cache.cached_blocks, self.cache.evictions
