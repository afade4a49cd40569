"""Transformer architecture numbers: what the profile builder, the capacity formula and Vidur need.

One YAML in ``conf/model/`` per model; a user adds a model by adding one file there.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from kvstudy.errors import ConfigError


@dataclass(frozen=True)
class ModelArch:
    name: str
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    embedding_dim: int
    mlp_hidden_dim: int
    max_model_len: int
    vocab_size: int
    use_gated_mlp: bool
    use_bias: bool
    use_qkv_bias: bool
    post_attn_norm: bool
    activation: str  # silu | relu | gelu
    norm: str  # rms_norm | layer_norm
    uses_rope: bool
    num_params: float  # total parameters, for the weight-memory term of the KV capacity
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.type in ("int", int) and f.name != "dtype_bytes":
                value = getattr(self, f.name)
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                    raise ConfigError(f"model.{f.name}={value!r}: allowed a positive whole number (model '{self.name}')")
        params = self.num_params
        if isinstance(params, bool) or not isinstance(params, (int, float)) or not 0 < params < float("inf"):
            raise ConfigError(f"model.num_params={params!r}: allowed a finite number > 0 (model '{self.name}')")
        if self.embedding_dim % self.num_q_heads:
            raise ConfigError(f"model.embedding_dim={self.embedding_dim}: not a multiple of model.num_q_heads="
                              f"{self.num_q_heads} of model '{self.name}'; allowed: a multiple of it")
        if self.num_q_heads % self.num_kv_heads:  # grouped-query attention: whole groups of query heads per KV head
            raise ConfigError(f"model.num_kv_heads={self.num_kv_heads}: does not divide model.num_q_heads="
                              f"{self.num_q_heads} of model '{self.name}'; allowed: a divisor of it")
        if self.activation not in ("silu", "relu", "gelu"):
            raise ConfigError(f"model.activation={self.activation!r}: allowed silu, relu, gelu")
        if self.norm not in ("rms_norm", "layer_norm"):
            raise ConfigError(f"model.norm={self.norm!r}: allowed rms_norm, layer_norm")

    @property
    def head_dim(self) -> int:
        return self.embedding_dim // self.num_q_heads

    def kv_bytes_per_token(self, tensor_parallel: int = 1) -> int:
        """K and V for every layer, per GPU when heads are split over ``tensor_parallel`` GPUs."""
        kv_heads = -(-self.num_kv_heads // tensor_parallel)
        return 2 * self.num_layers * kv_heads * self.head_dim * self.dtype_bytes

    def check_tensor_parallel(self, tp: int) -> None:
        if self.num_q_heads % tp or self.embedding_dim % tp:
            raise ConfigError(
                f"hardware.tensor_parallel={tp}: does not divide model '{self.name}' (num_q_heads={self.num_q_heads}, "
                f"embedding_dim={self.embedding_dim}); allowed: divisors of both"
            )

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "ModelArch":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names - {"_target_"})
        if unknown:
            raise ConfigError(f"model config: unknown field(s) {unknown}; allowed: {sorted(names)}")
        missing = sorted(f.name for f in fields(cls) if f.name not in data and f.name != "dtype_bytes")
        if missing:
            raise ConfigError(f"model config '{data.get('name', '?')}': missing field(s) {missing}")
        return cls(**{k: v for k, v in data.items() if k in names})
