"""Write Vidur-schema profile CSVs from the analytical GPU model, deterministically.

Layout (the same as a Vidur checkout's ``data/profiling`` tree, so real profiles drop in):

    <root>/compute/<device>/<model>/mlp.csv        one row per (tp, num_tokens)
    <root>/compute/<device>/<model>/attention.csv  prefill (chunk, kv) and decode (batch, kv) rows
    <root>/network/<node>/all_reduce.csv, send_recv.csv

Only the ``.median`` timing columns Vidur's predictor reads are written (milliseconds per layer).
Grids follow Vidur's profiler (``vidur/profiling/utils``) but reach further where kvstudy's batches do:
decode batches up to 1,024 sequences and token counts up to 65,536 per iteration (up to the context for a
longer-context model). Past 4,096 tokens of context (only long-context models have any) the decode KV grid
coarsens as Vidur's own sequence-length space does, and prefill chunks continue past Vidur's 8,192 on that
space, so a 131,072-token model's attention file stays ~10 MB (45 MB at 64-token steps throughout).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterable, List

import numpy as np
import pandas as pd

from kvstudy.costs.arch import ModelArch
from kvstudy.running.atomic import write_atomic
from kvstudy.errors import ConfigError
from kvstudy.profiles import gpu_model as gm
from kvstudy.profiles.devices import NODES, device as device_of, nodes_of
from kvstudy.profiles.calibration import op_times_from_calibration

BLOCK_SIZE = 16  # Vidur's default CacheConfig.block_size; its predictor filters attention rows on it.
TP_SIZES = (1, 2, 4, 8)
MAX_TOKENS = 65536
DECODE_BATCHES = np.array(list(range(1, 17)) + list(range(24, 129, 8)) + list(range(144, 1025, 16)))
KV_STEP = 64
FLOAT_FORMAT = "%.6g"


#: decode KV steps past FINE_KV tokens: Vidur's sequence-length space (vidur/profiling/utils.get_seq_lengths_to_profile,
#: the contexts its profiler times decodes and full prefills at): 256 tokens to 64k, 1,024 to 512k, 4,096 to 4M, then 16k
FINE_KV = 4096
LONG_SEQ_STEPS = ((1 << 16, 256), (1 << 19, 1024), (1 << 22, 4096), (1 << 24, 16384))


def _octaves(start: int, stop: int) -> List[int]:
    """Vidur's NUM_TOKENS_SPACE rule past 1,024: each octave [2^k, 2^(k+1)] in steps of 2^k / 64."""
    out, low = [], start
    while low < stop:
        out += list(range(low, min(2 * low, stop) + 1, low // 64))
        low *= 2
    return out


def num_tokens_grid(max_tokens: int = MAX_TOKENS) -> np.ndarray:
    """Vidur's NUM_TOKENS_SPACE (vidur/profiling/utils.get_num_tokens_to_profile), up to max_tokens; past 65,536 (a
    longer context than that) its octave rule continues (Vidur's own space: every 1,024 tokens to 131,072)."""
    space = ([1, 2, 4] + list(range(8, 1024, 8)) + list(range(1024, 2048 + 1, 16))
             + list(range(2048, 4096 + 1, 32)) + list(range(4096, 8192 + 1, 64))
             + list(range(8192, 16384 + 1, 128)) + list(range(16384, 32768 + 1, 256))
             + list(range(32768, 65536 + 1, 512)))
    if max_tokens > 65536:
        space += _octaves(65536, max_tokens)
    return np.array(sorted({n for n in space if n <= max_tokens}))


def _long_seq(low: int, max_len: int) -> List[int]:
    """Vidur's sequence-length space above ``low`` up to ``max_len``, and ``max_len`` itself."""
    out, start = [], low
    for end, step in LONG_SEQ_STEPS:
        out += list(range(start + step, min(end, max_len) + 1, step))
        start = max(start, end)
    return sorted(set(out + [max_len])) if max_len > low else []


def kv_grid(max_len: int) -> np.ndarray:
    """Decode contexts: every KV_STEP tokens to FINE_KV, then Vidur's sequence-length steps (long contexts only)."""
    return np.array(list(range(0, min(max_len, FINE_KV) + 1, KV_STEP)) + _long_seq(FINE_KV, max_len))


def prefill_chunks(max_len: int) -> List[int]:
    """Vidur's chunk space (32..8,192); a longer context continues on Vidur's sequence-length space to the context
    (the lengths Vidur's profiler times full prefills at), so one prefill of a long prompt is profiled, not extrapolated."""
    space = list(range(32, 129, 32)) + list(range(256, 1025, 128)) + list(range(1536, 8193, 512))
    return [c for c in space if c <= max_len] + _long_seq(8192, max_len)


def mlp_profile(arch: ModelArch, calib: Dict, tps: Iterable[int], device: str = None) -> pd.DataFrame:
    frames = []
    n = num_tokens_grid(max(MAX_TOKENS, arch.max_model_len))
    for tp in tps:
        times = op_times_from_calibration(arch, tp, n, calib, device)
        df = pd.DataFrame({f"time_stats.{op}.median": times[op] for op in gm.MLP_OPS})
        df["n_head"] = arch.num_q_heads
        df["n_kv_head"] = arch.num_kv_heads
        df["n_embd"] = arch.embedding_dim
        df["n_expanded_embd"] = arch.mlp_hidden_dim
        df["vocab_size"] = arch.vocab_size
        df["use_gated_mlp"] = arch.use_gated_mlp
        df["num_tokens"] = n
        df["num_tensor_parallel_workers"] = tp
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def attention_profile(arch: ModelArch, device: gm.Device, tps: Iterable[int]) -> pd.DataFrame:
    max_len = arch.max_model_len
    chunk, kv_pre = [], []
    for c in prefill_chunks(max_len):
        for kv in range(0, max_len - c + 1, c):
            chunk.append(c)
            kv_pre.append(kv)
    chunk, kv_pre = np.array(chunk), np.array(kv_pre)
    batch_dec, kv_dec = (a.ravel() for a in np.meshgrid(DECODE_BATCHES, kv_grid(max_len), indexing="ij"))
    frames = []
    for tp in tps:
        pre = pd.DataFrame({
            "batch_size": 1, "prefill_chunk_size": chunk, "kv_cache_size": kv_pre, "is_prefill": True,
            "time_stats.attn_prefill.median": gm.attention_prefill_ms(arch, tp, chunk, kv_pre, device),
            "time_stats.attn_decode.median": np.nan,
            "time_stats.attn_kv_cache_save.median": gm.kv_cache_save_ms(arch, tp, chunk, device)})
        dec = pd.DataFrame({
            "batch_size": batch_dec, "prefill_chunk_size": 0, "kv_cache_size": kv_dec, "is_prefill": False,
            "time_stats.attn_prefill.median": np.nan,
            "time_stats.attn_decode.median": gm.attention_decode_ms(arch, tp, batch_dec, kv_dec, device),
            "time_stats.attn_kv_cache_save.median": gm.kv_cache_save_ms(arch, tp, batch_dec, device)})
        df = pd.concat([pre, dec], ignore_index=True)
        df.insert(0, "n_embd", arch.embedding_dim)
        df.insert(1, "n_q_head", arch.num_q_heads)
        df.insert(2, "n_kv_head", arch.num_kv_heads)
        df.insert(3, "block_size", BLOCK_SIZE)
        df.insert(4, "num_tensor_parallel_workers", tp)
        df.insert(5, "max_model_len", max_len)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def _network_fits(calib: Dict, node: str) -> Dict[tuple, Dict]:
    """The (alpha, bus bandwidth) fits of ``node``: its own measured ones, or those of the node it is derived from
    with the bus bandwidth scaled (kvstudy/profiles/devices.py ``NodeSpec``)."""
    spec = NODES[node]
    source = spec.derived or node
    fits = {(f["collective"], f["workers"], f["devices_per_node"]): f for f in calib["network"] if f["node"] == source}
    if spec.derived:
        fits = {key: {**f, "bus_gbps": f["bus_gbps"] * spec.bus_scale[key]} if key in spec.bus_scale else f
                for key, f in fits.items()}
    return fits


def network_profiles(calib: Dict, node: str) -> Dict[str, pd.DataFrame]:
    fits = _network_fits(calib, node)
    workers_space = NODES[node].workers
    sizes = np.unique(np.round(1024 * 2 ** (np.arange(0, 21 * 16 + 1) / 16)).astype(np.int64))
    out = {}
    for kind, combos in (("all_reduce", [(w, w) for w in workers_space]), ("send_recv", [(2, 1), (2, 2)])):
        frames = []
        for workers, dpn in combos:
            fit = fits.get((kind, workers, dpn))
            if fit is None:
                if kind == "send_recv" and (kind, workers, 1) in fits:
                    fit = fits[(kind, workers, 1)]  # same link inside one node; documented in profiles/README.md
                else:
                    raise ConfigError(f"calibration has no {kind} fit for node {node}, workers={workers}")
            frames.append(pd.DataFrame({
                f"time_stats.{kind}.median": gm.collective_ms(kind, sizes, workers, fit["alpha_ms"], fit["bus_gbps"]),
                "rank": 0, "num_workers": workers, "size": sizes, "collective": kind,
                "devices_per_node": dpn, "max_devices_per_node": max(workers_space)}))
        out[kind] = pd.concat(frames, ignore_index=True)
    return out


def write_csv(df: pd.DataFrame, path: Path) -> None:
    write_atomic(path, lambda tmp: df.to_csv(tmp, index=False, float_format=FLOAT_FORMAT, lineterminator="\n"))


def build_model(arch: ModelArch, calib: Dict, root: Path, tps: Iterable[int] = TP_SIZES,
                device: str = None) -> List[Path]:
    """``device`` (default: the calibration's) names a GPU of ``devices.DEVICES``; one that borrows the calibration
    (``Device.calibration``; H200 from H100, A40 and L4 from A100) gets its efficiencies with its own peaks
    (uncalibrated)."""
    name = device or calib["device"]
    device = device_of(name)
    if device.calibration != calib["device"]:
        raise ConfigError(f"device '{name}' rests on the {device.calibration} calibration, not the {calib['device']} "
                          f"one given; allowed: profiles/calibration{'' if device.calibration == 'a100' else '_' + device.calibration}.json")
    tps = [tp for tp in tps if arch.num_q_heads % tp == 0]
    folder = Path(root) / "compute" / name / arch.name
    write_csv(mlp_profile(arch, calib, tps, name), folder / "mlp.csv")
    write_csv(attention_profile(arch, device, tps), folder / "attention.csv")
    return [folder / "mlp.csv", folder / "attention.csv"]


def build_network(calib: Dict, root: Path) -> List[Path]:
    """Every node type resting on this calibration's measurements (kvstudy/profiles/devices.py ``NODES``)."""
    paths = []
    for spec in nodes_of(calib["device"]):
        node = spec.name
        for kind, df in network_profiles(calib, node).items():
            path = Path(root) / "network" / node / f"{kind}.csv"
            write_csv(df, path)
            paths.append(path)
    return paths
