"""KV-cache capacity in tokens (``memory.capacity_tokens``): a number, or ``auto`` from GPU memory.

``auto`` (per GPU, as vLLM sizes its cache; Kwon et al. 2023, Sec. 4.1/6):

    usable  = gpu_memory_utilization * memory_gb_per_gpu
    weights = num_params * dtype_bytes / (tensor_parallel * pipeline_parallel)
    activ   = reserved_gb + max_batch_tokens * (4 h + 2 f / tp) * dtype_bytes   (peak of one forward pass)
    M       = floor((usable - weights - activ) / kv_bytes_per_token_per_gpu)

with kv bytes per token per GPU = 2 (K, V) * layers / pp * ceil(kv_heads / tp) * head_dim * dtype_bytes.
``reserved_gb`` covers the CUDA context, NCCL buffers and CUDA graphs (vLLM measures it at start-up;
1.5 GB is a typical figure). The MC-SF study uses the paper's measured M = 16492 (App. C) instead.
"""
from __future__ import annotations

import math
from typing import Optional

from kvstudy.config.validate import check_group
from kvstudy.costs.arch import ModelArch
from kvstudy.errors import ConfigError
from kvstudy.latency.tables import HardwareSpec


def _weights_per_gpu(arch: ModelArch, hw: HardwareSpec) -> float:
    return arch.num_params * arch.dtype_bytes / (hw.tensor_parallel * hw.pipeline_parallel)


def _kv_bytes_per_token(arch: ModelArch, hw: HardwareSpec) -> int:
    """2 (K, V) * layers / pp * ceil(kv_heads / tp) * head_dim * dtype_bytes (module docstring)."""
    kv_heads = -(-arch.num_kv_heads // hw.tensor_parallel)
    return 2 * (arch.num_layers // hw.pipeline_parallel) * kv_heads * arch.head_dim * arch.dtype_bytes


def auto_breakdown(arch: ModelArch, hw: HardwareSpec, gpu_memory_utilization: float = 0.9,
                   reserved_gb: float = 1.5, max_batch_tokens: int = 4096) -> dict:
    """The terms of the module docstring's formula, per GPU (bytes), and M."""
    usable = gpu_memory_utilization * hw.memory_gb_per_gpu * 1e9
    weights = _weights_per_gpu(arch, hw)
    activ = reserved_gb * 1e9 + max_batch_tokens * (4 * arch.embedding_dim
                                                    + 2 * arch.mlp_hidden_dim / hw.tensor_parallel) * arch.dtype_bytes
    per_token = _kv_bytes_per_token(arch, hw)
    free = usable - weights - activ
    if free <= 0:
        raise ConfigError(f"model '{arch.name}' does not fit on hardware '{hw.name}': weights {weights / 1e9:.1f} GB "
                          f"+ activations {activ / 1e9:.1f} GB per GPU exceed {usable / 1e9:.1f} GB usable; "
                          "use more GPUs (tensor_parallel) or a smaller model")
    return {"tokens": int(math.floor(free / per_token)), "gpu_memory_utilization": gpu_memory_utilization,
            "memory_gb_per_gpu": hw.memory_gb_per_gpu, "weights_gb_per_gpu": round(weights / 1e9, 2),
            "activations_gb_per_gpu": round(activ / 1e9, 2), "kv_bytes_per_token_per_gpu": per_token}


def auto_capacity(arch: ModelArch, hw: HardwareSpec, gpu_memory_utilization: float = 0.9,
                  reserved_gb: float = 1.5, max_batch_tokens: int = 4096) -> int:
    return auto_breakdown(arch, hw, gpu_memory_utilization, reserved_gb, max_batch_tokens)["tokens"]


def describe(value, arch: ModelArch, hw: HardwareSpec, capacity_tokens: int) -> str:
    """How the run's KV capacity came about, for its printed summary: ``auto``'s terms, or the number given."""
    if value != "auto":
        return f"{capacity_tokens:,} tokens (memory.capacity_tokens)"
    b = auto_breakdown(arch, hw)
    return (f"{capacity_tokens:,} tokens (auto, per GPU: {b['gpu_memory_utilization']} x {b['memory_gb_per_gpu']:g} GB "
            f"- weights {b['weights_gb_per_gpu']:.1f} GB - activations {b['activations_gb_per_gpu']:.1f} GB, "
            f"{b['kv_bytes_per_token_per_gpu']:,} B per token per GPU; kvstudy/costs/capacity.py)")


def resolve_capacity(value, arch: ModelArch, hw: HardwareSpec, **auto_kw) -> int:
    # auto, or a whole number of tokens (1e5 too) up to 2^26 (an 8-GPU node with a 1B model holds ~20M), as
    # kvstudy/config/schema.py declares memory.capacity_tokens
    check_group("memory", {"capacity_tokens": value})
    if value == "auto":
        return auto_capacity(arch, hw, **auto_kw)
    return int(value)


def fit_note(arch: ModelArch, hw: HardwareSpec, capacity_tokens: int) -> Optional[str]:
    """One line when a fixed capacity describes a deployment the GPUs cannot hold (weights plus that KV cache
    above their memory): a timing study may want it (hardware=a100_vidur_default times Llama2-70B on one
    A100), so it runs, but never without a word."""
    weights = _weights_per_gpu(arch, hw)
    kv = capacity_tokens * _kv_bytes_per_token(arch, hw)
    memory = hw.memory_gb_per_gpu * 1e9
    if weights + kv <= memory:
        return None
    return (f"model '{arch.name}' on hardware '{hw.name}' needs {(weights + kv) / 1e9:.0f} GB per GPU (weights "
            f"{weights / 1e9:.0f} GB + {capacity_tokens:,} KV tokens {kv / 1e9:.0f} GB) of {memory / 1e9:.0f} GB: "
            f"simulated as a timing model, not a deployment that fits")
