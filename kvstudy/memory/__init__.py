"""Memory models (config group ``memory``): how the KV cache is counted, pieces of the one loop
(kvstudy/engine/loop.py), each fixing its token convention.

* ``paper`` (:class:`PaperMemory`): the MC-SF paper's token-granular constraint (3), the paper's convention;
  admission-only policies, eviction (restart) only on overflow.
* ``paged`` (:class:`PagedMemory`): vLLM's paged KV cache (blocks, watermark, reservations, finite host
  swap space), vLLM's convention; every policy (admission-only ones through kvstudy/policies/admission.py).
"""
from kvstudy.memory.paged import PagedMemory, PrefixCachingMemory
from kvstudy.memory.paper import PaperMemory

__all__ = ["PagedMemory", "PaperMemory", "PrefixCachingMemory"]
