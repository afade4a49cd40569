"""The memory interface: what the engine (kvstudy/engine/) asks of a memory model, and what it promises back.

Two models implement it: :class:`~kvstudy.memory.paper.PaperMemory` (the MC-SF paper's constraint (3), KV counted in
tokens in aggregate, no per-request holdings) and :class:`~kvstudy.memory.paged.PagedMemory` (vLLM's blocks, the
admission watermark, host swap space, loans, and with ``prefix_caching`` vLLM's automatic prefix caching behind the
same methods). A new model implements every member below; ``tests/test_architecture.py`` checks the built-in
ones against this protocol; docs/architecture.md says how the engine calls it.

Units: *blocks* are the model's allocation unit (``block_size`` tokens; the paper's memory has blocks of one token),
*tokens* are KV tokens (one per token of context). Requests are named by their index in the run (0..n-1).

Allocation is ``ceil(tokens / block_size)`` blocks per request: ``blocks`` says so, and the decode clock
(kvstudy/engine/decode_clock.py: a decoding request needs one more block each ``block_size`` tokens), ``StepView`` and
the vLLM-family policies compute the same rounding themselves. A model that allocates otherwise (a fixed reservation
per request, say) fits by choosing its ``block_size`` so that this rounding is its allocation (one block of R
tokens per request), not by changing ``blocks`` alone.

The engine is the only caller of the changing methods (``hold`` .. ``advance``), and calls them only after it has
checked a policy's decision against the queries (``blocks``, ``held``, ``free``, ``can_allocate`` ...). A policy
reads the queries through ``view.memory`` and never changes anything.
"""
from __future__ import annotations

from typing import Callable, TYPE_CHECKING, Hashable, Iterable, Optional, Protocol, Sequence, Tuple, runtime_checkable

if TYPE_CHECKING:
    from kvstudy.memory.connector import KVConnector

#: ``can_allocate`` / ``can_swap_in``'s answers (vLLM's ``AllocStatus``): the blocks are there now; they are not now
#: but will be once others finish; they never will be (more than the cache has, less the watermark)
OK, LATER, NEVER = "ok", "later", "never"


@runtime_checkable
class PrefixIndex(Protocol):
    """The prefix cache's index of cached blocks as a policy may read it (``memory.cache``; SGLang's
    ``BasePrefixCache``). kvstudy/memory/prefix.py's ``PrefixCache`` is the one with a cache; its ``NoPrefixIndex`` is
    "no cache" (nothing cached, nobody shares), so a policy never tests for ``None``. Keys are block keys
    (``MemoryModel.keys``): equal keys are equal KV."""

    #: with ``track_users()``: keyed block in use -> the requests holding it (None until asked for)
    users: Optional[dict]
    #: with ``track_users()``: the keys two or more running requests hold (a dict used as an ordered set)
    multi: dict
    #: a counter that changes whenever ``multi`` or its keys' holders change (a policy's memo key)
    multi_version: int
    #: ``i -> None``, told when request i's first block is cached (the engine's indexed waiting queue sets it,
    #: kvstudy/engine/indexed_queue.py; None: nobody is told)
    on_first: Optional[Callable[[int], None]]

    def hit(self, keys: Sequence[Hashable], most: Optional[int] = None) -> int:
        """How many of ``keys``, from the first, are cached (in use or evictable), at most ``most``."""

    def track_users(self) -> None:
        """Keep ``users`` and ``multi`` from now on (they cost a little per block; MC-SF's prefix-aware eq. (5) reads
        them)."""


@runtime_checkable
class BlockAllocator(Protocol):
    """Block allocation: the GPU's KV cache in blocks, what a request holds, vLLM's admission answer, and the changes
    the engine makes (after checking a decision against the queries)."""

    # --- sizes and counters ---
    capacity_tokens: int  #: KV capacity, tokens
    block_size: int  #: tokens per block
    num_blocks: int  #: blocks the cache has
    watermark_blocks: int  #: blocks an admission must leave free (vLLM's watermark); 0 without one
    used: int  #: blocks in use (distinct blocks under prefix caching)
    gpu: dict  #: request -> blocks it holds (shared ones included); the memory owns it, others only read it
    #: when a running request may decode: ``"vllm"`` (a free block at every decode's turn) or ``"boundary"``
    decode_block_check: str

    # --- queries ---
    def blocks(self, tokens: int) -> int:
        """Blocks that ``tokens`` tokens of context need."""

    def held(self, i: int) -> int:
        """Blocks request i holds now."""

    @property
    def free(self) -> int:
        """Blocks not in use."""

    def rejection(self, prompt: int, output: int, watermark: bool = True) -> str:
        """Why a request of ``prompt`` + ``output`` tokens can never be served (empty: it can)."""

    def overflows(self, need_tokens: int, growing: int) -> bool:
        """Do the running requests' next tokens (``need_tokens`` in total, ``growing`` of them needing one more block
        each) exceed the memory?"""

    def can_allocate(self, need_blocks: int, free: int = None) -> str:
        """vLLM's admission answer for a prefill of ``need_blocks``: ``OK``, ``LATER`` or ``NEVER`` (above)."""

    def start_blocks(self, i: int, tokens: int, dropped=()) -> int:
        """Free blocks request i's prefill of ``tokens`` takes now (less any it shares: prefix caching)."""

    def freed_by(self, i: int) -> int:
        """Blocks preempting request i alone frees (not those it shares)."""

    def release_gain(self, requests: Iterable[int]) -> Tuple[int, set]:
        """(blocks freed, which shared blocks would no longer be in use) if every request in ``requests`` gives its
        blocks back; the second is what ``start_blocks`` takes as ``dropped`` (a set: of keys with the per-block cache,
        of (chain, its top after) with the run cache, kvstudy/memory/prefix_runs.py; empty when nothing is shared)."""

    def cached_tokens(self, i: int, tokens: int) -> int:
        """Tokens of request i's first ``tokens`` a prefill starting now would skip (0 without prefix caching)."""

    def keys(self, i: int, tokens: int) -> list:
        """Keys of request i's full blocks within its first ``tokens`` (prefix caching; empty without it)."""

    def first_block(self, i: int, tokens: int) -> Optional[Hashable]:
        """A name of request i's first full block within ``tokens``, equal for two requests exactly when their first
        blocks are one cached block, and independent of the order keys are made in; None: it has none, or nothing
        is cached (prefix caching off)."""

    def first_block_cached(self, name: Hashable) -> bool:
        """Whether the first block ``first_block`` named is cached now (False without prefix caching)."""

    def cache_stats(self) -> Tuple[int, int]:
        """Prefix caching's (blocks holding a cached prefix, evictions so far); (0, 0) without a cache."""

    # --- changes (the engine only, after checking) ---
    def hold(self, i: int, blocks: int) -> int:
        """Request i holds ``blocks`` blocks (never fewer than now); returns the blocks added (allocate, grow)."""

    def start(self, i: int, tokens: int) -> int:
        """Request i starts a prefill of ``tokens`` tokens and takes their blocks; returns the tokens it skips (its
        cached prefix, found on the GPU or supplied by the connector; 0 without prefix caching)."""

    def advance(self, i: int, computed: int) -> None:
        """Request i's prefill has scheduled ``computed`` tokens (prefix caching caches their full blocks)."""

    def release(self, i: int, computed: int = 0) -> int:
        """Free request i's blocks (``computed``: its tokens whose KV was computed); returns the blocks it held."""


@runtime_checkable
class HostSwap(Protocol):
    """Host swap space (vLLM's ``--swap-space``): a preempted request's blocks copied to the host and back."""

    host_blocks_total: int  #: host swap space, blocks (set by ``bind``)
    host_used: int  #: host blocks in use (swapped-out requests)

    def host_has_room(self, blocks: int) -> bool:
        """Can ``blocks`` more be swapped out to the host?"""

    def swapped_blocks(self, i: int) -> int:
        """Blocks swapped-out request i holds in host swap space (0 when it holds none)."""

    def swap_in_blocks(self, i: int, context_tokens: int) -> int:
        """Blocks swapped-out request i holds once back on the GPU to decode with ``context_tokens`` of context."""

    def can_swap_in(self, i: int, free: int = None) -> str:
        """vLLM's answer for swapping request i back in: ``OK``, ``LATER`` or ``NEVER``."""

    def swap_out(self, i: int, computed: int = 0) -> int:
        """Move request i's blocks to the host; returns them."""

    def swap_in(self, i: int) -> int:
        """Bring request i's blocks back from the host; returns them."""


@runtime_checkable
class Loans(Protocol):
    """CacheOPT's embedding (Shen et al. Sec. 3.3.1): a running host lends blocks it holds but does not use to a guest
    starting its prefill. A capability, not a duty: ``supports_loans`` says whether a model has it, and a policy that
    lends (``policy.embedding=true``) is refused on one that has not (kvstudy/engine/assembly.py)."""

    supports_loans: bool
    loans: dict  #: guest -> (host, blocks) lent to it; empty on a model without loans

    def lend(self, host: int, guest: int, blocks: int) -> None:
        """Move ``blocks`` of the host's held blocks to the guest."""


@runtime_checkable
class MemoryModel(BlockAllocator, HostSwap, Loans, Protocol):
    """A memory model: block allocation, host swap space and loans (above), the prefix index (``cache``) and the KV
    connector (``connector``) as objects of their own, and what the model is."""

    # --- what the model is (class attributes) ---
    #: the ``memory`` group's option name, for messages and the run's summary
    name: str
    #: preemption modes the model can carry out: ``("recompute",)`` or ``("recompute", "swap")``
    modes: tuple
    #: the token convention it fixes: ``"paper"`` (o decode rounds after the prompt's round; an eviction restarts the
    #: request) or ``"vllm"`` (o tokens, the first from the prefill; a recompute keeps them)
    convention: str
    #: True: KV is held per request in blocks and every decision is checked against the blocks the cache has;
    #: False: counted in aggregate, admissions unchecked (over-commitment is caught as an overflow next round)
    tracks_blocks: bool
    #: True: vLLM's automatic prefix caching is on (a prefill may start past a cached prefix; ``cache_stats`` and
    #: ``release_gain`` answer for shared blocks)
    prefix_caching: bool

    #: the prefix cache's index (``PrefixIndex`` above): what is cached and who shares it; "no cache" without caching
    cache: PrefixIndex
    #: the KV connector (kvstudy/memory/connector.py): what moves KV between this GPU and elsewhere (the offload
    #: tiers, a user's store); ``NoConnector`` when nothing does. The engine times its loads; records read its summary
    connector: "KVConnector"

    # --- set-up ---
    def bind(self, kv_bytes_per_token_per_gpu: int) -> None:
        """Start a run: size the host space for one GPU's KV bytes per token and clear every counter."""

    def set_segments(self, segments) -> None:
        """The run's requests' shared content (``Requests.segments``; prefix caching keys blocks by it)."""

    def describe(self) -> dict:
        """The model's settings for the run's summary."""
