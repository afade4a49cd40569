"""The one transfer-cost model (issue 56): the seconds a KV copy takes over a link, for every place kvstudy moves KV.

* :class:`Link`: bytes over a bandwidth (GB/s per direction, per GPU: each GPU of a tensor-parallel group moves its
  own shard over its own link at the same time), at an efficiency, plus a fixed cost per copy call and per layer (vLLM
  issues one copy per layer). Its rate may depend on how many copies move together (``rate``: vLLM V0's one copy
  per block, fitted to vLLM PR 11531's measurements).
* :func:`network_reader`: a transfer between two nodes from a Vidur-schema ``send_recv.csv`` (measured, interpolated
  in log size).
* :func:`layerwise`: a transfer that overlaps compute layer by layer (LMCache's layer-wise loads).

Its instances: vLLM swap's copies (kvstudy/costs/swap_models.py: ``pcie``, PCIe at 80% and 10 us per layer;
``vllm_blocks``, the fitted per-block rate), the offload tiers' reads (kvstudy/memory/offload.py: a tier's read
bandwidth, per block) and a shared pool's reads from another node (the node's send/recv profile).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional


class Link:
    """A copy path. ``gbps``: GB/s per direction (1e9 bytes); ``efficiency``: the share of it a copy reaches;
    ``per_copy_s``: seconds each copy call costs; ``per_layer_s`` x ``layers``: a per-layer cost (one copy per layer);
    ``rate``: ``copies -> GB/s``, a rate that depends on how many copies move together (then ``gbps`` and
    ``efficiency`` are unused)."""

    def __init__(self, gbps: float = 0.0, efficiency: float = 1.0, per_copy_s: float = 0.0, per_layer_s: float = 0.0,
                 layers: int = 1, rate: Optional[Callable[[int], float]] = None) -> None:
        if rate is None and not gbps > 0:
            raise ValueError(f"a link's bandwidth: allowed gbps > 0 (GB/s), got {gbps!r}")
        self.gbps, self.efficiency, self.rate = float(gbps), float(efficiency), rate
        self.per_copy_s, self.per_layer_s, self.layers = float(per_copy_s), float(per_layer_s), int(layers)

    def seconds(self, nbytes: float, copies: int = 1) -> float:
        """Seconds to move ``nbytes`` bytes in ``copies`` copy calls (0 for nothing)."""
        if nbytes <= 0:
            return 0.0
        if self.rate is not None:
            return nbytes / (self.rate(copies) * 1e9)
        seconds = nbytes / (self.gbps * 1e9 * self.efficiency)
        if self.per_layer_s:
            seconds += self.layers * self.per_layer_s
        if self.per_copy_s:
            seconds += copies * self.per_copy_s
        return seconds


def layerwise(compute: float, transfer: float, layers: int) -> float:
    """An iteration's seconds when its transfer overlaps compute layer by layer: L stages of compute C/L and transfer
    T/L, pipelined (layer l computes once its KV has arrived): the longer stream, plus one layer of the shorter one,
    which nothing hides."""
    return max(compute, transfer) + min(compute, transfer) / layers


def network_reader(send_recv_csv, within_node: bool = False, who: str = "memory.offload.shared=true") -> Callable[[float], float]:
    """``bytes -> seconds`` of one transfer between two nodes, from a Vidur-schema ``send_recv.csv`` (its rows between
    nodes, devices_per_node 1: the link a shared pool's remote reads cross; ``within_node``: its rows between two GPUs
    of one node, devices_per_node 2, NVLink on a DGX), interpolated in log size; beyond the largest size profiled, at
    the bandwidth of the largest transfer."""
    import numpy as np
    import pandas as pd

    from kvstudy.errors import ConfigError

    if not Path(send_recv_csv).is_file():  # hardware.node naming no profile: said in one line (a shared pool reads it)
        there = sorted(p.parent.name for p in Path(send_recv_csv).parent.parent.glob("*/send_recv.csv"))
        raise ConfigError(f"{who} reads the link {'inside a node' if within_node else 'between nodes'} from "
                          f"{send_recv_csv}: no such file "
                          f"(hardware.node names no network profile there); allowed: a node with one there "
                          f"({', '.join(there) or 'none'}), or hardware.profiles.network_dir=<folder with "
                          f"send_recv.csv>")
    df = pd.read_csv(send_recv_csv)
    per_node = 2 if within_node else 1
    rows = df[df["devices_per_node"] == per_node] if (df["devices_per_node"] == per_node).any() else df
    rows = rows.groupby("size", as_index=False)["time_stats.send_recv.median"].median().sort_values("size")
    size, ms = rows["size"].to_numpy(float), rows["time_stats.send_recv.median"].to_numpy(float)
    log_size = np.log(size)

    def seconds(nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        if nbytes >= size[-1]:
            return float(ms[-1] * nbytes / size[-1]) / 1e3
        return float(np.interp(np.log(nbytes), log_size, ms)) / 1e3

    return seconds
