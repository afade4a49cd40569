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

from kvstudy.arch import ModelArch
from kvstudy.errors import ConfigError
from kvstudy.latency.tables import HardwareSpec


def auto_capacity(arch: ModelArch, hw: HardwareSpec, gpu_memory_utilization: float = 0.9,
                  reserved_gb: float = 1.5, max_batch_tokens: int = 4096) -> int:
    gpus = hw.tensor_parallel * hw.pipeline_parallel
    usable = gpu_memory_utilization * hw.memory_gb_per_gpu * 1e9
    weights = arch.num_params * arch.dtype_bytes / gpus
    activ = reserved_gb * 1e9 + max_batch_tokens * (4 * arch.embedding_dim
                                                    + 2 * arch.mlp_hidden_dim / hw.tensor_parallel) * arch.dtype_bytes
    kv_heads = -(-arch.num_kv_heads // hw.tensor_parallel)
    per_token = 2 * (arch.num_layers // hw.pipeline_parallel) * kv_heads * arch.head_dim * arch.dtype_bytes
    free = usable - weights - activ
    if free <= 0:
        raise ConfigError(f"model '{arch.name}' does not fit on hardware '{hw.name}': weights {weights / 1e9:.1f} GB "
                          f"+ activations {activ / 1e9:.1f} GB per GPU exceed {usable / 1e9:.1f} GB usable; "
                          "use more GPUs (tensor_parallel) or a smaller model")
    return int(math.floor(free / per_token))


def resolve_capacity(value, arch: ModelArch, hw: HardwareSpec, **auto_kw) -> int:
    if isinstance(value, str) and value == "auto":
        return auto_capacity(arch, hw, **auto_kw)
    try:
        tokens = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"memory.capacity_tokens={value!r}: allowed a positive whole number or 'auto'")
    if tokens <= 0 or tokens != float(value):
        raise ConfigError(f"memory.capacity_tokens={value!r}: allowed a positive whole number or 'auto'")
    return tokens
