"""Transfer costs: the seconds a KV copy takes over a link (issue 56). Today: a transfer between two nodes, from the
node's send/recv profile (a shared offload pool's remote reads: kvstudy/memory/offload.py). The tiers' own reads
(bytes over a tier's read bandwidth) and vLLM swap's copies (kvstudy/costs/swap_models.py) are not yet expressed
through it."""
from __future__ import annotations

from pathlib import Path
from typing import Callable


def network_reader(send_recv_csv) -> Callable[[float], float]:
    """``bytes -> seconds`` of one transfer between two nodes, from a Vidur-schema ``send_recv.csv`` (its rows between
    nodes, devices_per_node 1: the link a shared pool's remote reads cross), interpolated in log size; beyond the
    largest size profiled, at the bandwidth of the largest transfer."""
    import numpy as np
    import pandas as pd

    from kvstudy.errors import ConfigError

    if not Path(send_recv_csv).is_file():  # hardware.node naming no profile: said in one line (a shared pool reads it)
        there = sorted(p.parent.name for p in Path(send_recv_csv).parent.parent.glob("*/send_recv.csv"))
        raise ConfigError(f"memory.offload.shared=true reads the link between nodes from {send_recv_csv}: no such file "
                          f"(hardware.node names no network profile there); allowed: a node with one there "
                          f"({', '.join(there) or 'none'}), or hardware.profiles.network_dir=<folder with "
                          f"send_recv.csv>")
    df = pd.read_csv(send_recv_csv)
    rows = df[df["devices_per_node"] == 1] if (df["devices_per_node"] == 1).any() else df
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
