"""The KV connector: the one seam through which KV moves between a GPU's cache and somewhere else (issue 56), named
after vLLM v1's ``KVConnectorBase_V1``. Behind it: the offload tiers (host DRAM, local disk, a pool replicas share:
kvstudy/memory/offload.py's :class:`~kvstudy.memory.offload.OffloadConnector`, LMCache's and Mooncake's place in
vLLM), :class:`NoConnector` (nothing outside the GPU: today's behaviour without ``memory.offload``), or a user's own
(``memory.connector._target_``: docs/architecture.md, "The connector contract in practice").

Who calls what. The memory model (kvstudy/memory/paged.py's prefix cache; the only caller of the first five) asks
the connector when a prefill starts and hands it what the GPU evicts; the engine asks it how long an iteration's
transfers take; the records and the cluster driver read its summary. The connector never changes GPU blocks: the
memory allocates the blocks a load fills exactly as if they had been computed (vLLM's ``update_state_after_alloc``
comes after the allocation), so memory is the same whether a prefix is loaded or recomputed; only time differs.

Units: *keys* are the prefix cache's block keys (kvstudy/memory/path_keys.py: a block's key names its content and
everything before it, so equal keys are equal KV, on every replica of a run; a batch of keys is a read-only
sequence, often a ``KeyRuns`` of arithmetic runs rather than a list: index it, iterate it, or ``list()`` it); *blocks* are the GPU's blocks of ``block_size`` tokens; bytes are
one GPU's shard (``block_bytes_per_gpu``: each GPU of a tensor-parallel group moves its own over its own link);
seconds are simulated seconds.

=============================================  ======================================================================
vLLM v1 (``KVConnectorBase_V1``)               here
=============================================  ======================================================================
``get_num_new_matched_tokens``                 ``plan(keys, hit, most, tokens)`` (in blocks, not tokens)
``update_state_after_alloc`` + ``start_load``  ``load(i, keys, start, count)``
``wait_for_layer_load`` / ``wait_for_save``    ``iteration_seconds(compute)``
``save_kv_layer`` / ``request_finished``       ``save(keys)``: on eviction from the GPU (write-back: LMCache also
                                               offers write-through at prefill time)
=============================================  ======================================================================
"""
from __future__ import annotations

from typing import Callable, Dict, Hashable, Optional, Protocol, Sequence, runtime_checkable


@runtime_checkable
class KVConnector(Protocol):
    #: the connector's name, for messages and the run's summary (``none``: no connector)
    name: str
    #: True: the GPU's evicted blocks are handed to ``save`` (False: the prefix cache keeps no list of them)
    saves: bool

    # --- set-up (a run starts) ---
    def bind(self, block_size: int, block_bytes_per_gpu: int) -> None:
        """A run starts: the GPU's block size (tokens) and one block's bytes on one GPU; every counter cleared."""

    def set_timing(self, num_layers: int, recompute_seconds: Callable[[int, int], float]) -> None:
        """The engine's latency model, for the connector's choices and its layer-by-layer overlap: the layers one GPU
        runs (``num_layers / pipeline_parallel``) and ``recompute_seconds(tokens, context)``, the latency model's
        seconds to prefill ``tokens`` tokens after ``context`` cached ones."""

    # --- scheduler side: a prefill starts (the memory model calls these) ---
    def plan(self, keys: Sequence[Hashable], hit: int, most: int, tokens: int) -> int:
        """Blocks past the GPU's ``hit`` (of ``keys``, the prompt's full blocks) the connector would supply for a
        prefill of ``tokens`` tokens, at most ``most - hit``; 0: none (not found, or recomputing is chosen). Asked
        by planning policies too (``cached_tokens``): it must not change anything."""

    def looked_up(self, tokens: int) -> None:
        """A prefill of ``tokens`` tokens starts and looks its context up (the denominator of hit rates)."""

    def load(self, i: int, keys: Sequence[Hashable], start: int, count: int) -> float:
        """Request ``i``'s blocks ``keys[start:start + count]`` are read into the blocks the memory allocated for them
        (their KV is on the GPU once the iteration's transfers are done); returns the seconds, which count in this
        iteration (``iteration_seconds``)."""

    def skipped(self, keys: Sequence[Hashable], hit: int, most: int) -> None:
        """``plan`` answered 0 for a start: blocks it could have supplied are recomputed (counted, not timed)."""

    def save(self, keys: Sequence[Hashable]) -> None:
        """The GPU evicted these cached blocks (least recently used first); asynchronous: no iteration waits."""

    # --- worker side: the engine times an iteration ---
    def iteration_seconds(self, compute: float) -> float:
        """The iteration's seconds given its ``compute`` seconds and the loads started since the last call (then
        done): ``compute`` itself when none."""

    # --- records ---
    def loaded_tokens(self) -> Dict[int, int]:
        """Request -> prompt tokens its prefills loaded through the connector (requests.parquet's
        ``offload_loaded_tokens``)."""

    def describe(self) -> dict:
        """The settings, for the run's summary (its ``memory.offload``); empty for ``none``."""

    def summary(self) -> Optional[dict]:
        """The run's counts (summary.json's ``offload``), or None: nothing to report."""

    # --- several replicas (kvstudy/cluster/driver.py) ---
    # A cluster builds one connector per replica from the same config (one memory each). The order: assembly calls
    # ``connect_replicas`` on replica 0's; then the driver starts replica 0, then 1, ..., each run's ``bind`` first.
    # So a store shared by replicas is made or joined in ``connect_replicas`` and emptied by replica 0's ``bind``
    # alone (a later replica's ``bind`` must not replace it): kvstudy/memory/offload.py's shared pool does this.
    def connect_replicas(self, connectors: Sequence["KVConnector"], link: Callable[[], Callable[[float], float]]) \
            -> bool:
        """Called on replica 0's connector with every replica's (itself first) before a cluster runs: a shared store
        joins them here. ``link()`` returns ``bytes -> seconds`` of one transfer between two nodes (the node's
        send/recv profile; read only when called). Returns True when the replicas see each other's writes, so the
        driver steps them in time order."""

    def merged_summary(self, parts: Sequence[dict], loaded_tokens: int) -> dict:
        """The replicas' ``summary`` dicts (each taken when its replica's run ended) as one, with ``loaded_tokens``
        (every replica's): summary.json's ``offload`` for the cluster, used as returned."""


#: the members a connector has (``KVConnector``'s, in their order there), for messages naming what a class lacks
KV_CONNECTOR_MEMBERS = tuple(KVConnector.__annotations__) + tuple(
    k for k, v in vars(KVConnector).items() if not k.startswith("_") and callable(v))


class NoConnector:
    """Nothing outside the GPU: nothing found, nothing loaded or saved, an iteration's compute is its time (SGLang's
    ``ChunkCache`` idea: "off" is an implementation, not ``None``)."""

    name = "none"
    saves = False

    def bind(self, block_size: int, block_bytes_per_gpu: int) -> None:
        pass

    def set_timing(self, num_layers: int, recompute_seconds) -> None:
        pass

    def plan(self, keys, hit: int, most: int, tokens: int) -> int:
        return 0

    def looked_up(self, tokens: int) -> None:
        pass

    def load(self, i: int, keys, start: int, count: int) -> float:
        raise RuntimeError("no connector: nothing to load (plan answered 0)")

    def skipped(self, keys, hit: int, most: int) -> None:
        pass

    def save(self, keys) -> None:
        pass

    def iteration_seconds(self, compute: float) -> float:
        return compute

    def loaded_tokens(self) -> Dict[int, int]:
        return {}

    def describe(self) -> dict:
        return {}

    def summary(self) -> Optional[dict]:
        return None

    def connect_replicas(self, connectors, link) -> bool:
        return False

    def merged_summary(self, parts, loaded_tokens: int) -> dict:
        """Numbers summed over the replicas (others as replica 0's), and ``loaded_tokens``: a default that fits
        counts; a connector with rates or a shared store's sizes merges its own."""
        first = parts[0] if parts else {}
        merged = {k: (sum(p.get(k, 0) for p in parts)
                      if all(isinstance(p.get(k, 0), (int, float)) and not isinstance(p.get(k, 0), bool) for p in parts)
                      else v) for k, v in first.items()}
        return {**merged, "loaded_tokens": loaded_tokens}
