"""Vidur's prediction tables as dense arrays: the fast, vidur-free query path and its disk cache.

Vidur's sklearn predictor answers a batch by looking up per-operator predictions keyed by the batch's
token count (rounded up to 8), by (decode batch size, mean decode context rounded up to the KV
granularity) and by (prefill context rounded to the granularity, chunk rounded up to 32). kvstudy
flattens those dicts once (``vidur_adapter.tables_from_predictor``) into arrays and answers the same
formula here; a test checks it against Vidur's own ``get_execution_time`` for random batches.
A query outside the trained range is an ``OutOfRangeError`` naming the limit, never a clamp.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from kvstudy.running.atomic import write_atomic
from kvstudy.errors import ConfigError, DataError, OutOfRangeError

TABLES_VERSION = 1

MLP_REQUIRED = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens",
                "num_tensor_parallel_workers"] + [
    f"time_stats.{op}.median" for op in ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj",
                                         "mlp_act", "attn_rope")]
ATTENTION_REQUIRED = ["n_embd", "n_q_head", "n_kv_head", "block_size", "num_tensor_parallel_workers", "batch_size",
                      "prefill_chunk_size", "kv_cache_size", "time_stats.attn_prefill.median",
                      "time_stats.attn_decode.median"]
NETWORK_REQUIRED = ["num_workers", "size", "collective", "devices_per_node"]


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    device: str  # Vidur DeviceSKUType string, e.g. "a100"
    node: str  # Vidur NodeSKUType string, e.g. "a100_pairwise_nvlink"
    tensor_parallel: int
    pipeline_parallel: int = 1
    memory_gb_per_gpu: float = 80.0  # the vendor's GB (a cache-key field); KV capacity: kvstudy/costs/capacity.py
    pcie_gbps: float = 31.5


#: the smallest prefill chunk Vidur's predictor tabulates (its grid: 32, 64, ... tokens), so the shortest context
#: model.max_model_len it can be trained for
MIN_PREFILL_CHUNK = 32


@dataclass(frozen=True)
class PredictorSettings:
    """Vidur predictor config fields kvstudy sets (documented in docs/latency.md)."""
    estimator: str = "random_forest"  # random_forest | linear_regression
    num_estimators: Tuple[int, ...] = (32,)
    max_depth: Tuple[int, ...] = (24,)
    min_samples_split: Tuple[int, ...] = (2,)
    polynomial_degree: Tuple[int, ...] = (1, 2, 3)
    k_fold_cv_splits: int = 3
    training_threads: int = 1
    kv_granularity: int = 64
    max_prefill_chunk: int = 4096
    max_batch_size: int = 1024
    max_tokens: int = 32768
    block_size: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        # Vidur predicts its prefill-attention table for chunks 32, 64, ... up to max_prefill_chunk (kvstudy's models.py
        # sets it to min(latency.max_prefill_chunk, model.max_model_len)): below 32 that grid is empty and sklearn fails
        # on it after a full training run; refused here, before anything is trained (issue 46)
        if self.max_prefill_chunk < MIN_PREFILL_CHUNK:
            raise ConfigError(f"model.max_model_len (or latency.max_prefill_chunk, the smaller) gives prefill chunks "
                              f"of at most {self.max_prefill_chunk} tokens, too short to train Vidur's latency "
                              f"predictor (latency=vidur), whose prefill table starts at {MIN_PREFILL_CHUNK}-token "
                              f"chunks; allowed: model.max_model_len >= {MIN_PREFILL_CHUNK} (and "
                              f"latency.max_prefill_chunk >= {MIN_PREFILL_CHUNK}), or latency=linear")


@dataclass(frozen=True)
class ProfileFiles:
    mlp: Path
    attention: Path
    all_reduce: Path
    send_recv: Path

    def check(self) -> None:
        import pandas as pd

        for path, required in ((self.mlp, MLP_REQUIRED), (self.attention, ATTENTION_REQUIRED),
                               (self.all_reduce, NETWORK_REQUIRED), (self.send_recv, NETWORK_REQUIRED)):
            if not Path(path).exists():
                raise DataError(f"profile file {path} not found")
            header = pd.read_csv(path, nrows=0).columns
            missing = [c for c in required if c not in header]
            if missing:
                raise DataError(f"profile file {path} is missing column(s) {missing}; Vidur's schema needs {required}")

    def digest(self) -> str:
        h = hashlib.sha256()
        for path in (self.mlp, self.attention, self.all_reduce, self.send_recv):
            h.update(Path(path).read_bytes())
        return h.hexdigest()


def _vidur_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vidur")
    except PackageNotFoundError:
        return "absent"


def cache_key(files: ProfileFiles, arch_fingerprint: str, hw: HardwareSpec,
              settings: PredictorSettings) -> str:
    """Everything a trained table depends on: CSV bytes, architecture, hardware, settings, versions."""
    payload = json.dumps({"files": files.digest(), "arch": arch_fingerprint, "hw": asdict(hw),
                          "settings": asdict(settings), "vidur": _vidur_version(),
                          "tables": TABLES_VERSION}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass
class VidurTables:
    per_token_ms: np.ndarray  # [max_tokens + 1]: every token-count-keyed op of one layer, summed
    decode_ms: np.ndarray  # [max_batch + 1, n_kv]: decode attention per layer
    prefill_ms: np.ndarray  # [n_kv, max_chunk/32 + 1]: prefill attention per layer
    send_recv_ms: np.ndarray  # [max_tokens + 1]: pipeline hop (zeros without pipeline parallelism)
    layers_per_stage: int
    stages: int
    kv_granularity: int
    decode_overhead: float
    cv_mape_pct: Dict[str, float] = field(default_factory=dict)

    @property
    def max_tokens(self) -> int:
        return len(self.per_token_ms) - 1

    @property
    def max_batch_size(self) -> int:
        return self.decode_ms.shape[0] - 1

    @property
    def max_chunk(self) -> int:
        return (self.prefill_ms.shape[1] - 1) * 32

    def cut(self, max_tokens: int) -> "VidurTables":
        """The tables a build for ``max_tokens`` (at most this one's) makes: the first rows of each token axis (the
        per-token ops up to ``max_tokens``, the KV-context axis up to ``max_tokens`` in steps of the granularity)."""
        n_kv = max_tokens // self.kv_granularity + 1
        return VidurTables(self.per_token_ms[:max_tokens + 1].copy(), self.decode_ms[:, :n_kv].copy(),
                           self.prefill_ms[:n_kv].copy(), self.send_recv_ms[:max_tokens + 1].copy(),
                           self.layers_per_stage, self.stages, self.kv_granularity, self.decode_overhead,
                           dict(self.cv_mape_pct))

    def iteration_seconds(self, prefill_chunks: Sequence[Tuple[int, int]], num_decodes: int, decode_context_sum: int) -> float:
        """One iteration's seconds: prefill chunks as (new tokens, tokens already cached), plus ``num_decodes``
        decode requests whose cached contexts sum to ``decode_context_sum``. Table cells are read as Python floats
        (``item``) and combined in the same order as numpy scalars would be: the same IEEE doubles, without numpy's
        per-scalar cost on the engine's hottest call."""
        total = num_decodes
        for chunk, _ in prefill_chunks:
            total += chunk
        if total <= 0:
            return 0.0
        rounded = (total + 7) // 8 * 8
        per_token = self.per_token_ms
        if rounded >= len(per_token):  # past max_tokens (len - 1); no property call on this hot path
            raise OutOfRangeError(f"iteration of {total} tokens exceeds the predictor's trained range "
                                  f"latency.max_tokens={self.max_tokens}; raise latency.max_tokens")
        layer = per_token.item(rounded)
        g = self.kv_granularity
        if num_decodes:
            decode_ms = self.decode_ms
            rows, cols = decode_ms.shape
            if num_decodes >= rows:  # past max_batch_size
                raise OutOfRangeError(f"decode batch of {num_decodes} requests exceeds the trained range "
                                      f"latency.max_batch_size={self.max_batch_size}; raise latency.max_batch_size")
            kv_idx = -(-(decode_context_sum // num_decodes) // g)
            if kv_idx >= cols:
                raise OutOfRangeError(f"mean decode context {decode_context_sum // num_decodes} exceeds the trained "
                                      f"range latency.max_tokens={self.max_tokens}")
            attn = decode_ms.item(num_decodes, kv_idx)
            layer += attn * (1.0 + self.decode_overhead) if num_decodes > 1 else attn
        for chunk, context in prefill_chunks:
            c_idx = -(-chunk // 32)
            kv_idx = -(-context // g)
            if c_idx >= self.prefill_ms.shape[1] or kv_idx >= self.prefill_ms.shape[0]:
                raise OutOfRangeError(f"prefill chunk of {chunk} tokens over {context} cached exceeds the trained range "
                                      f"(latency.max_prefill_chunk={self.max_chunk}, latency.max_tokens={self.max_tokens})")
            layer += self.prefill_ms.item(kv_idx, c_idx)
        stages = self.stages
        ms = self.layers_per_stage * layer * stages + (stages - 1) * self.send_recv_ms.item(rounded)
        return ms * 1e-3

    def hop_seconds(self, tokens: int) -> float:
        """The pipeline hop between two stages of a batch of ``tokens`` tokens (Vidur's send/recv prediction keyed
        by the tokens rounded up to 8, as ``iteration_seconds`` adds it); 0 without pipeline parallelism."""
        if self.stages < 2 or tokens <= 0:
            return 0.0
        rounded = (tokens + 7) // 8 * 8
        if rounded >= len(self.send_recv_ms):
            raise OutOfRangeError(f"iteration of {tokens} tokens exceeds the predictor's trained range "
                                  f"latency.max_tokens={self.max_tokens}; raise latency.max_tokens")
        return self.send_recv_ms.item(rounded) * 1e-3

    def min_iteration_seconds(self) -> float:
        """A lower bound on ``iteration_seconds`` of any iteration of at least one token: the token-keyed ops at
        their least over every rounded count (>= 8), the attention terms at 0, the hop at its least, combined as
        ``iteration_seconds`` combines them; 0 (no bound) if a table holds a negative time."""
        tables = (self.per_token_ms[8:], self.prefill_ms, self.decode_ms[1:], self.send_recv_ms[8:])
        if any(t.size and float(t.min()) < 0.0 for t in tables):
            return 0.0
        hop = float(self.send_recv_ms[8:].min()) if self.stages > 1 else 0.0
        layer = float(self.per_token_ms[8:].min())
        return (self.layers_per_stage * layer * self.stages + (self.stages - 1) * hop) * 1e-3

    def decode_run_seconds(self, num_decodes: int, decode_context_sum: int, count: int) -> list:
        """``iteration_seconds`` of ``count`` decode-only iterations of the same ``num_decodes`` requests, the
        context sum growing by ``num_decodes`` in each, in one vectorised lookup (the engine's decode runs, issue 47).
        The same operations in the same order as ``iteration_seconds``, so every value is bit-identical to it; the
        list stops before the first iteration outside the trained range (``iteration_seconds`` raises there)."""
        n = num_decodes
        rounded = (n + 7) // 8 * 8
        decode_ms = self.decode_ms
        if count <= 0 or n <= 0 or rounded >= len(self.per_token_ms) or n >= decode_ms.shape[0]:
            return []
        g = self.kv_granularity
        # (ctx + k n) // n == ctx // n + k: the mean context of iteration k
        kv_idx = -(-(decode_context_sum // n + np.arange(count)) // g)
        kv_idx = kv_idx[:int(np.searchsorted(kv_idx, decode_ms.shape[1]))]  # ascending: in range up to there
        attn = decode_ms[n, kv_idx]
        layer = self.per_token_ms[rounded] + (attn * (1.0 + self.decode_overhead) if n > 1 else attn)
        ms = self.layers_per_stage * layer * self.stages + (self.stages - 1) * self.send_recv_ms[rounded]
        return (ms * 1e-3).tolist()

    def save(self, path: Path) -> None:
        """Atomic: a concurrent reader sees the old file or the complete new one."""
        meta = json.dumps({"layers_per_stage": self.layers_per_stage, "stages": self.stages,
                           "kv_granularity": self.kv_granularity, "decode_overhead": self.decode_overhead,
                           "cv_mape_pct": self.cv_mape_pct})

        def write(tmp: str) -> None:
            with open(tmp, "wb") as fh:  # a file object: savez would append ".npz" to a bare path
                np.savez_compressed(fh, per_token_ms=self.per_token_ms, decode_ms=self.decode_ms,
                                    prefill_ms=self.prefill_ms, send_recv_ms=self.send_recv_ms, meta=np.array(meta))

        write_atomic(Path(path), write)

    @classmethod
    def load(cls, path: Path) -> Optional["VidurTables"]:
        """The cached tables, or None when there are none, or when the file cannot be read (a copy cut short by
        a full disk, say): then a warning names it and the caller rebuilds and replaces it atomically."""
        if not Path(path).exists():
            return None
        try:
            with np.load(path) as data:
                meta = json.loads(str(data["meta"]))
                return cls(per_token_ms=data["per_token_ms"], decode_ms=data["decode_ms"],
                           prefill_ms=data["prefill_ms"], send_recv_ms=data["send_recv_ms"], **meta)
        except Exception as exc:  # any damage: zip, compression, missing array, bad metadata
            warnings.warn(f"{path}: damaged predictor cache ({type(exc).__name__}: {exc}); rebuilding it", stacklevel=2)
            return None
