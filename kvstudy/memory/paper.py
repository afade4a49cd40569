"""The MC-SF paper's memory model (Jaillet et al., Sec. 2, IP constraint (3)), a memory model of the one loop
(kvstudy/engine/loop.py) beside :class:`~kvstudy.memory.paged.PagedMemory`.

* KV is counted in tokens, in aggregate: a running request that has produced j decode rounds holds s + j + 1 tokens
  in its next round; the round that admits a prompt is not charged (constraint (3)). No per-request holdings, no
  blocks, no watermark, no host space (``modes``: recompute only).
* Over-commitment is possible (an admission is never checked against capacity): when the running requests' need
  for a round exceeds ``capacity_tokens`` the loop records an overflow and the policy's ``on_overflow`` names the
  requests to evict (kvstudy/policies/admission.py).
* Token convention ``paper``: a request of output o is admitted in one round (its prompt's round produces a first
  token) and then decodes o rounds; evicted, it loses its KV and its progress (it restarts from its prompt).
  The paged model's convention is vLLM's (``vllm``: o tokens, the first from the prefill, a recompute keeps them).

The rest of this class answers the loop's questions about blocks with their token-granular values (a "block" is a
token; nothing is held per request), so the loop needs no branch per call.
"""
from __future__ import annotations

from kvstudy.config.validate import check_group
from kvstudy.memory.base import OK
from kvstudy.memory.connector import NoConnector
from kvstudy.memory.prefix import NoPrefixIndex


class PaperMemory:
    """The MC-SF paper's memory (module docstring); implements kvstudy/memory/base.py's ``MemoryModel``."""
    name = "paper"
    #: preemption modes this model can carry out: eviction = recompute from scratch (the paper's clearing)
    modes = ("recompute",)
    #: the token convention this model fixes (docstring): ``paper`` (o decode rounds after the prompt's round)
    convention = "paper"
    #: False: KV is counted in aggregate; admissions are not checked against capacity (over-commitment possible)
    tracks_blocks = False
    supports_loans = False  # nothing is held per request to lend
    prefix_caching = False
    #: nothing outside the GPU (kvstudy/memory/connector.py): the paper's memory moves no KV
    connector = NoConnector()
    cache = NoPrefixIndex()  # no prefix cache (kvstudy/memory/base.py's PrefixIndex)
    block_size = 1
    watermark_blocks = 0
    used = 0
    host_used = 0
    host_blocks_total = 0

    def __init__(self, capacity_tokens: int, name: str = "paper") -> None:
        # its value against its declaration in kvstudy/config/schema.py (the one place config values are checked)
        check_group("memory", {"_target_": "kvstudy.memory.PaperMemory", "capacity_tokens": capacity_tokens})
        self.capacity_tokens = int(capacity_tokens)
        self.num_blocks = self.capacity_tokens
        self.gpu: dict = {}
        self.loans: dict = {}

    def bind(self, kv_bytes_per_token_per_gpu: int) -> None:
        """Start a run (nothing is held per request)."""

    def rejection(self, prompt: int, output: int, watermark: bool = False) -> str:
        """Why a request can never be served (empty: it can): s + o above capacity, its last round's KV."""
        if prompt + output > self.capacity_tokens:
            return f"prompt + output = {prompt + output} tokens exceeds capacity {self.capacity_tokens}"
        return ""

    def overflows(self, need_tokens: int, growing: int) -> bool:
        """Does the running requests' need for this round (``need_tokens`` = sum of s + j + 1) exceed capacity?"""
        return need_tokens > self.capacity_tokens

    def blocks(self, tokens: int) -> int:
        return int(tokens)

    def held(self, i: int) -> int:
        return 0

    def can_allocate(self, need_blocks: int, free: int = None) -> str:
        return OK

    def host_has_room(self, blocks: int) -> bool:
        return False

    def hold(self, i: int, blocks: int) -> int:
        return 0

    def release(self, i: int, computed: int = 0) -> int:
        return 0

    def swap_out(self, i: int, computed: int = 0) -> int:
        raise NotImplementedError("memory=paper never swaps (modes: recompute)")

    def swap_in(self, i: int) -> int:
        raise NotImplementedError("memory=paper never swaps (modes: recompute)")

    def swapped_blocks(self, i: int) -> int:
        return 0

    def swap_in_blocks(self, i: int, context_tokens: int) -> int:
        return 0

    def lend(self, host: int, guest: int, blocks: int) -> None:
        raise NotImplementedError("memory=paper holds nothing per request to lend")

    @property
    def free(self) -> int:
        return self.capacity_tokens

    #: no blocks: a running request always decodes (constraint (3) is checked as an overflow, next round)
    decode_block_check = "boundary"

    def can_swap_in(self, i: int, free: int = None) -> str:
        return "never"  # nothing is ever swapped out on this memory

    def freed_by(self, i: int) -> int:
        return 0

    def cached_tokens(self, i: int, tokens: int) -> int:
        return 0

    def keys(self, i: int, tokens: int) -> list:
        return []

    def first_block(self, i: int, tokens: int):
        return None

    def first_block_cached(self, name) -> bool:
        return False

    def set_segments(self, segments) -> None:
        """No prefix caching on this memory: shared content is not used."""

    def start_blocks(self, i: int, tokens: int, dropped=()) -> int:
        return 0

    def start(self, i: int, tokens: int) -> int:
        """A prefill starts: nothing is held per request (constraint (3) counts the running requests in aggregate)."""
        return 0

    def advance(self, i: int, computed: int) -> None:
        pass

    def release_gain(self, requests) -> tuple:
        return 0, set()

    def cache_stats(self) -> tuple:
        return 0, 0

    def describe(self) -> dict:
        return {"name": self.name, "capacity_tokens": self.capacity_tokens}

    def __repr__(self) -> str:
        return f"PaperMemory({self.capacity_tokens} tokens)"
