"""The KV handoff of prefill/decode disaggregation (issue 57; docs/disaggregation.md): the settings
(``cluster.handoff``), the links prefill replicas send over, and each decode replica's pulls.

A handed-off request joins a decode replica's queue when its prefill ends (kvstudy/engine/loop.py ``_deliver``) with
its prompt's KV still on the prefill replica. When the decode policy admits it (the blocks are reserved then, as
for any prefill: vLLM v1's ``WAITING_FOR_REMOTE_KVS`` allocation), the KV is *pulled*: its transfer starts on the
prefill replica's link, the admitting iteration waits for it (``load``: ``blocking``, the whole transfer before the
iteration computes, LMCache's blocking load; ``layerwise``, each layer's compute waits for that layer's KV,
kvstudy/costs/transfer.py ``layerwise``), and the prefill replica frees its blocks when the transfer ends (vLLM's
``request_finished`` -> ``delay_free_blocks``). What the decode replica already has in its prefix cache is not moved.

The transfer: the prompt's KV of one GPU of the prefill replica's tensor-parallel group (``kv_bytes_per_gpu``), each
GPU sending its shard over its own link at once (so a transfer's seconds are one shard's), over ``link``: ``nvlink``
(inside a node: the node's measured send/recv between two GPUs of one node, Vidur's ``send_recv.csv`` rows with
``devices_per_node`` 2), ``network`` (between nodes: its rows with ``devices_per_node`` 1, as the shared offload pool
reads), ``free`` (no cost: the checks' zero-cost transfer), or ``gbps`` (a set bandwidth, GB/s per GPU). Contention
(BLIS's model): a prefill replica's link carries one transfer at a time, first come first served, so two decode
replicas pulling from one prefill replica at once wait for each other.

Not built (said in docs/disaggregation.md): a transfer while the prefill runs (push, layer by layer from the prefill
side); a link shared as a set share of its bandwidth; an asynchronous pull that lets the decode batch run on while a
request waits for its KV (vLLM's NIXL path): here the admitting iteration waits, as with a blocking connector.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from kvstudy.costs.transfer import Link, layerwise
from kvstudy.errors import ConfigError

FLOWS = ("prefill_first", "decode_first")
DECIDERS = ("always", "never", "short_prompt", "prefix")
LOADS = ("blocking", "layerwise")
LINKS = ("network", "nvlink", "free")
FIELDS = ("flow", "decider", "threshold", "load", "link", "gbps")


@dataclass(frozen=True)
class HandoffSettings:
    """``cluster.handoff`` read and checked (each field's meaning: docs/disaggregation.md).

    * ``flow``: ``prefill_first`` (Splitwise, DistServe: a prefill replica is picked at arrival, a decode replica when
      the prefill ends) or ``decode_first`` (llm-d: the decode replica is picked at arrival, then a prefill replica);
    * ``decider``: which requests are disaggregated: ``always``; ``never`` (every request runs whole on a decode
      replica); ``short_prompt`` (a prompt of at most ``threshold`` tokens runs whole on its decode replica);
      ``prefix`` (llm-d's prefix-based decider: the decode replica is picked first, and a request whose prompt tokens
      not in that replica's prefix cache number at most ``threshold`` runs whole there);
    * ``load``: ``blocking`` or ``layerwise`` (module docstring); ``link`` and ``gbps``: the transfer's path.
    """

    flow: str = "prefill_first"
    decider: str = "always"
    threshold: Optional[int] = None
    load: str = "blocking"
    link: str = "network"
    gbps: Optional[float] = None

    @property
    def decode_first(self) -> bool:
        """The decode replica is picked at arrival (``decode_first``, and always for the ``prefix`` decider, which
        reads that replica's cache)."""
        return self.flow == "decode_first" or self.decider == "prefix"


def read_handoff(node: Optional[Mapping]) -> HandoffSettings:
    """``cluster.handoff`` (a plain mapping or None: every default) checked; a bad value is one line naming the key,
    the value and what is allowed."""
    if node is None:
        return HandoffSettings()
    if not isinstance(node, Mapping) or not len(node):
        raise ConfigError(f"cluster.handoff={node!r}: allowed: a mapping with some of the keys {', '.join(FIELDS)}, "
                          f"or null (every default)")
    unknown = [k for k in node if k not in FIELDS]
    if unknown:
        raise ConfigError(f"cluster.handoff.{unknown[0]}: not a handoff setting; allowed: {', '.join(FIELDS)}")
    got = {k: v for k, v in node.items() if v is not None}
    for key, allowed in (("flow", FLOWS), ("decider", DECIDERS), ("load", LOADS), ("link", LINKS)):
        if key in got and got[key] not in allowed:
            raise ConfigError(f"cluster.handoff.{key}={got[key]!r}: allowed: {', '.join(allowed)}")
    threshold = got.get("threshold")
    decider = got.get("decider", "always")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0):
        raise ConfigError(f"cluster.handoff.threshold={threshold!r}: allowed: a whole number of tokens >= 0")
    if decider in ("short_prompt", "prefix") and threshold is None:
        raise ConfigError(f"cluster.handoff.decider={decider} needs cluster.handoff.threshold (tokens): allowed: a "
                          f"whole number >= 0")
    if decider in ("always", "never") and threshold is not None:
        raise ConfigError(f"cluster.handoff.threshold={threshold}: read by the deciders short_prompt and prefix only, "
                          f"not by decider={decider}; allowed: threshold=null")
    gbps = got.get("gbps")
    if gbps is not None:
        if isinstance(gbps, bool) or not isinstance(gbps, (int, float)) or not gbps > 0 or gbps == float("inf"):
            raise ConfigError(f"cluster.handoff.gbps={gbps!r}: allowed: a bandwidth > 0 in GB/s per GPU (or null: "
                              f"the link's measured profile; link=free for no cost)")
        if got.get("link") not in (None, "network", "nvlink"):
            raise ConfigError(f"cluster.handoff.gbps={gbps} beside link={got['link']}: allowed: one of them")
    return HandoffSettings(**{k: got[k] for k in got})


class SenderLinks:
    """Each prefill replica's link, first come first served: ``transfer(source, t, seconds)`` -> (start, end)."""

    def __init__(self, sources: int) -> None:
        self.free_at = [0.0] * sources

    def transfer(self, source: int, t: float, seconds: float) -> Tuple[float, float]:
        start = max(t, self.free_at[source])
        end = start + seconds
        if seconds > 0.0:  # a free transfer occupies nothing
            self.free_at[source] = end
        return start, end


class Handoff:
    """One decode replica's pulls. The driver names each handed-off request's prefill replica (``source``); the
    engine's transitions call ``pull`` when its prefill starts here; the engine's ``_time`` asks
    ``iteration_seconds`` for the iteration's time with the pulls it started; the driver reads ``started`` (to free
    the prefill replica's blocks when each ends) and the per-request records."""

    def __init__(self, links: SenderLinks, shard_bytes: Callable[[int], int], seconds: Callable[[float], float],
                 load: str, num_layers: int, total_bytes: Callable[[int], int]) -> None:
        self.links, self.shard_bytes, self.seconds = links, shard_bytes, seconds
        self.total_bytes, self.load, self.num_layers = total_bytes, load, num_layers
        self.source: Dict[int, int] = {}
        self.records: Dict[int, tuple] = {}  # request -> (admitted, transfer start, end, bytes, tokens)
        self.started: List[Tuple[int, int, float]] = []  # (request, source, end) since the driver last read them
        self._t, self._end = 0.0, None

    def begin(self) -> None:
        """A run starts on this replica (kvstudy/engine/loop.py ``_begin``)."""
        self.records.clear()
        self.started.clear()
        self._end = None

    def pull(self, i: int, t: float, tokens: int) -> None:
        """Request i's prompt KV (``tokens`` tokens the decode replica does not have) starts moving at ``t``."""
        src = self.source[i]
        if tokens:
            start, end = self.links.transfer(src, t, self.seconds(self.shard_bytes(src) * tokens))
        else:  # its whole prompt is in this replica's prefix cache: nothing moves, the prefill replica frees it now
            start = end = t
        self.records[i] = (t, start, end, self.total_bytes(tokens), tokens)
        self.started.append((i, src, end))
        self._t = t
        self._end = end if self._end is None or end > self._end else self._end

    def iteration_seconds(self, compute: float) -> float:
        """The admitting iteration's seconds: its compute and the wait for the pulls it started (module docstring)."""
        if self._end is None:
            return compute
        wait, self._end = max(0.0, self._end - self._t), None
        if self.load == "blocking":
            return compute + wait
        return layerwise(compute, wait, self.num_layers)


def link_seconds(settings: HandoffSettings, send_recv_csv: Optional[str]) -> Callable[[float], float]:
    """``bytes -> seconds`` of one GPU's shard over the handoff's link (module docstring)."""
    if settings.link == "free":
        return lambda nbytes: 0.0
    if settings.gbps is not None:
        return Link(gbps=settings.gbps).seconds
    from kvstudy.costs.transfer import network_reader

    return network_reader(send_recv_csv, within_node=settings.link == "nvlink", who=f"cluster.handoff.link={settings.link}")
