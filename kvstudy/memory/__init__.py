"""Memory models (config group ``memory``): how the KV cache is counted.

* ``paper`` (:class:`PaperMemory`): the MC-SF paper's token-granular constraint (3); run by
  :class:`kvstudy.engine.Engine`, admission-only policies, eviction only on overflow.
* ``paged`` (:class:`PagedMemory`): vLLM's paged KV cache (blocks, watermark, reservations, finite host
  swap space); run by :class:`kvstudy.step_engine.StepEngine` with preemptive policies.
"""
from kvstudy.memory.paged import PagedMemory
from kvstudy.memory.paper import PaperMemory

__all__ = ["PagedMemory", "PaperMemory"]
