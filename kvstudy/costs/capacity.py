"""KV-cache capacity in tokens (``memory.capacity_tokens``): a number, or ``auto``, sized as vLLM sizes its cache.

``auto`` follows vLLM's start-up profiling, per GPU (vllm/worker/worker.py ``determine_num_available_blocks``,
0.6.x, and vllm/v1/worker/gpu_worker.py ``determine_available_memory``; both with vllm/utils ``memory_profiling``,
whose ``MemoryProfilingResult`` splits the non-KV memory into the three terms below; vllm-project/vllm PRs #9352,
#10511, #12126):

    available = gpu_memory_utilization x total - weights - activation peak - non-torch - CUDA graphs
    blocks    = floor(available / (block_size x kv bytes per token))      (vllm/worker/cache_engine.py
    tokens    = blocks x block_size                                        get_cache_block_size)

- ``total``: the device's memory in bytes as CUDA reports it (``torch.cuda.mem_get_info``), not the vendor's "GB":
  79.15 GiB on an A100-80GB, 79.216 GiB on an H100-80GB (kvstudy/profiles/devices.py, each with its source), or
  ``hardware.memory_gb_per_gpu`` in GiB when a hardware config sets it.
- ``gpu_memory_utilization``: ``memory.gpu_memory_utilization`` (vLLM's default 0.9).
- ``weights``: parameters x dtype bytes / (tensor_parallel x pipeline_parallel) (Llama-3-8B: 14.96 GiB, as vLLM's
  log prints it).
- ``activation peak``: the torch peak of vLLM's profiling forward pass (``profile_run``) over ``max_num_batched_tokens``
  tokens in ``min(256, tokens)`` sequences (vLLM's default ``max_num_seqs``), estimated as one layer's live tensors
  at the MLP (residual and normed hidden states, the up/gate projection's output and the activation's: ``2 h +
  3 f / tp`` values per token gated, ``2 h + 2 f / tp`` otherwise; the attention block is smaller) plus the sampler's
  logits (the gathered logits in the model's dtype and float32 logits, probabilities and log-probabilities:
  ``dtype + 12`` bytes per vocabulary entry per sequence). ``max_num_batched_tokens`` is vLLM 0.6's default
  (``SchedulerConfig``): ``max(max_model_len, 2048)``, or 512 when the context is above 32K, where vLLM turns chunked
  prefill on. Llama-3-8B on one H100: 1.21 GiB against the 1.26 GiB vLLM measured (PR #10511).
- ``non-torch``: memory outside PyTorch's allocator (CUDA context, cuBLAS workspaces; with tensor or pipeline
  parallelism NCCL communicators and vLLM's custom all-reduce buffers): 1.79 GiB per GPU, and 3.58 GiB with more than
  one GPU, as vLLM measured them on an H100 for Llama-3-8B at TP 1 and 2 (PR #10511's log); ``memory.non_torch_gib``
  sets it. It is the least certain term: another published log (vllm-project/vllm issue #10517, Llama-3.1-8B on an
  RTX 3090, vLLM 0.6.x) measured 0.35 GiB on one GPU. For Llama2-70B on two A100s every GiB of it is 6,554 tokens
  (18,672 at the default 3.58 GiB, 30,400 at 1.79, 39,840 at 0.35), so a study that rests on that margin should sweep it.
- ``CUDA graphs``: 0. vLLM (V0, and V1 up to 0.10) captures its CUDA graphs after the KV cache is sized; their
  memory (0.5-2.5 GiB) comes out of the ``1 - gpu_memory_utilization`` headroom, not the cache.

Block rounding as vLLM's: ``memory=paged`` takes ``capacity_tokens // block_size`` blocks, so it gets vLLM's
``num_gpu_blocks`` exactly (``memory.block_size``, 16 by default); ``memory=paper`` counts tokens and gets the same
multiple of 16.

The check against published vLLM logs (three, with their sources) is tests/memory/test_capacity_vllm.py; profiles/README.md
("KV capacity as vLLM counts it") gives each term's figure. The MC-SF study keeps the paper's measured M = 16,492
(App. C) as its default capacity.
"""
from __future__ import annotations

from typing import Optional

from kvstudy.config.validate import check_group
from kvstudy.costs.arch import ModelArch
from kvstudy.errors import ConfigError
from kvstudy.latency.tables import HardwareSpec

GIB = 2 ** 30
#: vLLM's default share of the device's memory it may use (``--gpu-memory-utilization``)
GPU_MEMORY_UTILIZATION = 0.9
#: vLLM's default ``max_num_seqs``: the profiling pass spreads its tokens over this many sequences (V0 ``profile_run``)
PROFILE_SEQS = 256
#: non-torch memory per GPU (module docstring): vLLM's log, Llama-3-8B on an H100, TP 1 and TP 2 (PR #10511)
NON_TORCH_ONE_GPU = 1.79 * GIB
NON_TORCH_PARALLEL = 3.58 * GIB


def visible_memory_bytes(hw: HardwareSpec, memory_gib: Optional[float] = None) -> Optional[int]:
    """The device's memory as CUDA reports it: ``memory_gib`` (a hardware config's ``memory_gb_per_gpu``, GiB) if
    given, else kvstudy/profiles/devices.py's figure for ``hw.device``; None for a device it does not know."""
    if memory_gib is not None:
        return int(round(float(memory_gib) * GIB))
    from kvstudy.profiles.devices import DEVICES

    gpu = DEVICES.get(hw.device)
    return gpu.memory_bytes if gpu is not None and gpu.visible_gib > 0 else None


def _weights_per_gpu(arch: ModelArch, hw: HardwareSpec) -> float:
    return arch.num_params * arch.dtype_bytes / (hw.tensor_parallel * hw.pipeline_parallel)


def _kv_bytes_per_token(arch: ModelArch, hw: HardwareSpec) -> int:
    """2 (K, V) x layers / pp x ceil(kv_heads / tp) x head_dim x dtype_bytes (vLLM's get_cache_block_size per token)."""
    kv_heads = -(-arch.num_kv_heads // hw.tensor_parallel)
    return 2 * (arch.num_layers // hw.pipeline_parallel) * kv_heads * arch.head_dim * arch.dtype_bytes


def profile_tokens(arch: ModelArch) -> int:
    """vLLM 0.6's default ``max_num_batched_tokens``, the size of its profiling pass (module docstring)."""
    return 512 if arch.max_model_len > 32768 else max(arch.max_model_len, 2048)


def activation_peak_bytes(arch: ModelArch, hw: HardwareSpec, tokens: int) -> float:
    """The torch peak of a profiling pass of ``tokens`` tokens (module docstring's estimate)."""
    tp = hw.tensor_parallel
    mlp = (3 if arch.use_gated_mlp else 2) * arch.mlp_hidden_dim / tp
    layer = tokens * (2 * arch.embedding_dim + mlp) * arch.dtype_bytes
    sampler = min(PROFILE_SEQS, tokens) * arch.vocab_size * (arch.dtype_bytes + 12)
    return layer + sampler


def non_torch_bytes(hw: HardwareSpec, non_torch_gib: Optional[float] = None) -> float:
    """``memory.non_torch_gib`` if set, else the module docstring's default by GPU count."""
    if non_torch_gib is not None:
        return float(non_torch_gib) * GIB
    return NON_TORCH_PARALLEL if hw.tensor_parallel * hw.pipeline_parallel > 1 else NON_TORCH_ONE_GPU


def auto_breakdown(arch: ModelArch, hw: HardwareSpec, gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
                   block_size: int = 16, memory_gib: Optional[float] = None,
                   max_num_batched_tokens: Optional[int] = None, non_torch_gib: Optional[float] = None) -> dict:
    """The terms of the module docstring's formula, per GPU (bytes), the blocks and the tokens."""
    total = visible_memory_bytes(hw, memory_gib)
    if total is None:
        raise ConfigError(f"hardware '{hw.name}': device '{hw.device}' has no visible memory in "
                          f"kvstudy/profiles/devices.py; set hardware.memory_gb_per_gpu (GiB, as "
                          f"torch.cuda.mem_get_info reports it) or a fixed memory.capacity_tokens")
    tokens = int(max_num_batched_tokens or profile_tokens(arch))
    usable = gpu_memory_utilization * total
    weights = _weights_per_gpu(arch, hw)
    activation = activation_peak_bytes(arch, hw, tokens)
    non_torch = non_torch_bytes(hw, non_torch_gib)
    graphs = 0.0
    available = usable - weights - activation - non_torch - graphs
    if available <= 0:
        raise ConfigError(f"model '{arch.name}' does not fit on hardware '{hw.name}': weights {weights / GIB:.2f} GiB "
                          f"+ activation peak {activation / GIB:.2f} GiB + non-torch {non_torch / GIB:.2f} GiB per "
                          f"GPU exceed {usable / GIB:.2f} GiB usable ({gpu_memory_utilization} x {total / GIB:.2f} "
                          f"GiB); use more GPUs (tensor_parallel), a smaller model or a higher "
                          f"memory.gpu_memory_utilization")
    per_token = _kv_bytes_per_token(arch, hw)
    blocks = int(available // (block_size * per_token))
    return {"tokens": blocks * block_size, "blocks": blocks, "block_size": block_size,
            "gpu_memory_utilization": gpu_memory_utilization, "total_bytes": total, "weights_bytes": weights,
            "activation_bytes": activation, "profile_tokens": tokens, "non_torch_bytes": non_torch,
            "cuda_graph_bytes": graphs, "available_bytes": available, "kv_bytes_per_token_per_gpu": per_token}


def auto_capacity(arch: ModelArch, hw: HardwareSpec, **settings) -> int:
    return auto_breakdown(arch, hw, **settings)["tokens"]


def settings_of(cfg) -> dict:
    """The keyword arguments of ``auto_breakdown`` a composed config sets: ``memory.gpu_memory_utilization``,
    ``memory.non_torch_gib``, ``memory.block_size`` (16 for memory=paper, vLLM's default) and
    ``hardware.memory_gb_per_gpu`` (GiB)."""
    from omegaconf import OmegaConf

    util = OmegaConf.select(cfg, "memory.gpu_memory_utilization", default=None)
    non_torch = OmegaConf.select(cfg, "memory.non_torch_gib", default=None)
    # their declared bounds, for a config no one checked
    check_group("memory", {k: v for k, v in (("gpu_memory_utilization", util), ("non_torch_gib", non_torch))
                           if v is not None})
    block = OmegaConf.select(cfg, "memory.block_size", default=None)
    memory = OmegaConf.select(cfg, "hardware.memory_gb_per_gpu", default=None)
    return {"gpu_memory_utilization": GPU_MEMORY_UTILIZATION if util is None else float(util),
            "block_size": 16 if block is None else int(block), "memory_gib": None if memory is None else float(memory),
            "non_torch_gib": None if non_torch is None else float(non_torch)}


def describe(value, arch: ModelArch, hw: HardwareSpec, capacity_tokens: int, **settings) -> str:
    """How the run's KV capacity came about, for its printed summary: ``auto``'s every term, or the number given."""
    if value != "auto":
        return f"{capacity_tokens:,} tokens (memory.capacity_tokens)"
    b = auto_breakdown(arch, hw, **settings)
    g = {k: b[k] / GIB for k in ("total_bytes", "weights_bytes", "activation_bytes", "non_torch_bytes",
                                   "cuda_graph_bytes", "available_bytes")}
    return (f"{capacity_tokens:,} tokens (auto, as vLLM sizes it, per GPU: {b['gpu_memory_utilization']} x "
            f"{g['total_bytes']:.2f} GiB - weights {g['weights_bytes']:.2f} GiB - activation peak "
            f"{g['activation_bytes']:.2f} GiB ({b['profile_tokens']:,}-token profiling pass) - non-torch "
            f"{g['non_torch_bytes']:.2f} GiB - CUDA graphs {g['cuda_graph_bytes']:.0f} = {g['available_bytes']:.2f} GiB "
            f"= {b['blocks']:,} blocks of {b['block_size']} x {b['kv_bytes_per_token_per_gpu']:,} B; "
            f"kvstudy/costs/capacity.py)")


def resolve_capacity(value, arch: ModelArch, hw: HardwareSpec, **settings) -> int:
    # auto, or a whole number of tokens (1e5 too) up to 2^26 (an 8-GPU node with a 1B model holds ~20M), as
    # kvstudy/config/schema.py declares memory.capacity_tokens
    check_group("memory", {"capacity_tokens": value})
    if value == "auto":
        return auto_capacity(arch, hw, **settings)
    return int(value)


def fit_note(arch: ModelArch, hw: HardwareSpec, capacity_tokens: int, memory_gib: Optional[float] = None,
             **_settings) -> Optional[str]:
    """One line when a fixed capacity describes a deployment the GPUs cannot hold (weights plus that KV cache
    above their memory as CUDA reports it): a timing study may want it (hardware=a100_vidur_default times Llama2-70B
    on one A100), so it runs, but never without a word."""
    memory = visible_memory_bytes(hw, memory_gib)
    if memory is None:
        return None
    weights = _weights_per_gpu(arch, hw)
    kv = capacity_tokens * _kv_bytes_per_token(arch, hw)
    if weights + kv <= memory:
        return None
    return (f"model '{arch.name}' on hardware '{hw.name}' needs {(weights + kv) / GIB:.0f} GiB per GPU (weights "
            f"{weights / GIB:.0f} GiB + {capacity_tokens:,} KV tokens {kv / GIB:.0f} GiB) of {memory / GIB:.0f} GiB: "
            f"simulated as a timing model, not a deployment that fits")
