"""Analytical per-layer operator times for a transformer on one GPU (roofline with fitted efficiencies).

Every operator Vidur profiles is described by the floating-point work F and the bytes B it moves per
layer on one tensor-parallel worker; its time in milliseconds is

    t(n) = c0 + max(F(n) / (P * eta), B(n) / (W * mu))                (GEMMs, attention prefill)
    t(n) = c0 + B(n) / (W * mu)                                        (element-wise ops, decode attention)
    t(n) = c0 + max(C, B(n) / (W * mu) + phi * C),  C = F(n) / (P * eta)   (GEMMs of a fit with ``phi``: H100)

with P the dense FP16 tensor-core peak and W the HBM bandwidth of the device (datasheet figures in
``DEVICES``) and (c0, eta, mu) per operator. The third form follows the Execution-Cache-Memory (ECM) model's overlap
rule T = max(T_OL, T_nOL + T_data) (Treibig & Hager, "Introducing a performance model for bandwidth-limited loop
kernels", PPAM 2009, LNCS 6067, 2010; Hager, Treibig, Habich & Wellein, CCPE 28(2), 2016): a fraction phi of the
compute time cannot overlap the memory traffic (a GEMM's pipeline fill and epilogue, where the tensor cores wait for
loads or for the output to be written) and adds to the transfer time, so an operator near the roofline's ridge takes
up to (1 + phi) x the larger of the two; phi = 0 is the roofline. Only a calibration that fitted phi uses it
(``calibration.OVERLAP_FITTED``: H100, whose ridge sits at 295 FLOP/byte against A100's 153, so far more of its
measured token counts lie near it; profiles/README.md). For the MLP-block operators the constants are least-squares
fits to Vidur's real A100 (H100) measurements (``calibration.py``, written to ``profiles/calibration.json``,
``calibration_h100.json``); attention has no measured data here and uses published FlashAttention-2 figures
(``ATTENTION``).

Collectives: ring all-reduce of S bytes over w workers takes alpha + 2 (w-1)/w * S / B_bus and a
send/recv alpha + S / B_link, with (alpha, B) fitted to Vidur's measured all_reduce/send_recv files.
"""
from __future__ import annotations

from typing import Dict, Mapping

import numpy as np

from kvstudy.costs.arch import ModelArch


# The GPUs (datasheet peaks, which calibration each borrows): kvstudy/profiles/devices.py
from kvstudy.profiles.devices import DEVICES, Device  # noqa: E402,F401  (re-exported: gpu_model.DEVICES)

#: Operators Vidur's MLP profile holds, in its column order.
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS = ("mlp_act", "attn_rope", "input_layernorm", "post_attention_layernorm", "add")
MLP_OPS = GEMM_OPS + ELEMENTWISE_OPS

#: Attention efficiencies (no measured attention profile is available here; see profiles/README.md).
#: FlashAttention-2 forward on A100 reaches 180-230 TFLOPS for head dim 128 at 2k-16k tokens (Dao 2023,
#: Fig. 4: ~60-73% of 312), lower for short sequences: eta(c) = eta_max * c / (c + c_half), eta_max the device's
#: ``attention_eta_max`` (0.65 on A100; each device's in devices.py).
#: Decode attention is bandwidth bound; paged decode kernels reach ~60-70% of HBM bandwidth at large
#: batch x context (vLLM paged attention, FlashDecoding reports); c0 is a kernel launch (~8 us).
ATTENTION = {
    "prefill_c_half": 256.0,
    "prefill_c0_ms": 0.010,
    "decode_mu": 0.65,
    "decode_c0_ms": 0.008,
    "decode_per_seq_us": 0.05,
    "kv_save_mu": 0.5,
    "kv_save_c0_ms": 0.004,
}


def _kv_heads_per_worker(arch: ModelArch, tp: int) -> int:
    return -(-arch.num_kv_heads // tp)


def op_work(arch: ModelArch, tp: int, n: np.ndarray) -> Dict[str, tuple]:
    """(flops, bytes) per layer and per worker for each MLP-profile operator at n tokens."""
    n = np.asarray(n, dtype=float)
    b = arch.dtype_bytes
    h, d = arch.embedding_dim, arch.head_dim
    q_local = arch.num_q_heads // tp
    kv_local = _kv_heads_per_worker(arch, tp)
    f_local = arch.mlp_hidden_dim / tp
    up_cols = f_local * (2 if arch.use_gated_mlp else 1)

    def gemm(k: float, cols: float):
        return 2.0 * n * k * cols, b * (n * k + k * cols + n * cols)

    work = {
        "attn_pre_proj": gemm(h, (q_local + 2 * kv_local) * d),
        "attn_post_proj": gemm(q_local * d, h),
        "mlp_up_proj": gemm(h, up_cols),
        "mlp_down_proj": gemm(f_local, h),
        "mlp_act": (np.zeros_like(n), b * n * f_local * (3 if arch.use_gated_mlp else 2)),
        "attn_rope": (np.zeros_like(n), b * n * (q_local + kv_local) * d * 2 * (1 if arch.uses_rope else 0)),
        "input_layernorm": (np.zeros_like(n), b * n * h * 2),
        "post_attention_layernorm": (np.zeros_like(n), b * n * h * 2 * (1 if arch.post_attn_norm else 0)),
        "add": (np.zeros_like(n), b * n * h * 3),
    }
    return work


def roofline_ms(flops, nbytes, device: Device, c0: float, eta: float, mu: float, phi: float = None) -> np.ndarray:
    """The module docstring's operator time; ``phi`` (None: the plain roofline) the non-overlapped share of compute."""
    compute = np.asarray(flops, float) / (device.peak_tflops * 1e12 * eta) if eta > 0 else 0.0
    memory = np.asarray(nbytes, float) / (device.hbm_gbps * 1e9 * mu)
    if phi is None:
        t = c0 + np.maximum(compute, memory) * 1e3
    else:
        t = c0 + np.maximum(compute, memory + phi * compute) * 1e3
    # An operator that moves no bytes (RoPE in a model without rotary embeddings) takes no time.
    return np.where(np.asarray(nbytes) > 0, t, 0.0)


def mlp_op_times(arch: ModelArch, tp: int, n: np.ndarray, device: Device,
                 params: Mapping[str, Mapping[str, float]]) -> Dict[str, np.ndarray]:
    """Milliseconds per layer for every MLP-profile operator at token counts ``n``."""
    out = {}
    for op, (flops, nbytes) in op_work(arch, tp, n).items():
        p = params[op]
        out[op] = roofline_ms(flops, nbytes, device, p["c0"], p.get("eta", 0.0), p["mu"], p.get("phi"))
    return out


def attention_prefill_ms(arch: ModelArch, tp: int, chunk: np.ndarray, kv: np.ndarray, device: Device) -> np.ndarray:
    """Causal attention of a chunk of c new tokens over kv cached ones: QK^T and PV over (kv + c/2) keys."""
    c = np.asarray(chunk, float)
    kv = np.asarray(kv, float)
    q_local = arch.num_q_heads // tp
    kv_local = _kv_heads_per_worker(arch, tp)
    d, b = arch.head_dim, arch.dtype_bytes
    flops = 4.0 * c * (kv + c / 2.0) * d * q_local
    nbytes = b * d * (2 * q_local * c + 2 * kv_local * (kv + c))
    eta = device.attention_eta_max * c / (c + ATTENTION["prefill_c_half"])
    compute = flops / (device.peak_tflops * 1e12 * eta)
    memory = nbytes / (device.hbm_gbps * 1e9 * ATTENTION["decode_mu"])
    return ATTENTION["prefill_c0_ms"] + np.maximum(compute, memory) * 1e3


def attention_decode_ms(arch: ModelArch, tp: int, batch: np.ndarray, kv: np.ndarray, device: Device) -> np.ndarray:
    """One new token for each of ``batch`` sequences holding ``kv`` cached tokens: reads all K and V."""
    bsz = np.asarray(batch, float)
    kv = np.asarray(kv, float)
    kv_local = _kv_heads_per_worker(arch, tp)
    nbytes = bsz * (kv + 1) * 2 * kv_local * arch.head_dim * arch.dtype_bytes
    return (ATTENTION["decode_c0_ms"] + bsz * ATTENTION["decode_per_seq_us"] * 1e-3
            + nbytes / (device.hbm_gbps * 1e9 * ATTENTION["decode_mu"]) * 1e3)


def kv_cache_save_ms(arch: ModelArch, tp: int, tokens: np.ndarray, device: Device) -> np.ndarray:
    nbytes = np.asarray(tokens, float) * 2 * _kv_heads_per_worker(arch, tp) * arch.head_dim * arch.dtype_bytes
    return ATTENTION["kv_save_c0_ms"] + nbytes / (device.hbm_gbps * 1e9 * ATTENTION["kv_save_mu"]) * 1e3


def collective_ms(kind: str, size_bytes: np.ndarray, workers: int, alpha_ms: float, bus_gbps: float) -> np.ndarray:
    size = np.asarray(size_bytes, float)
    factor = 2.0 * (workers - 1) / workers if kind == "all_reduce" else 1.0
    return alpha_ms + factor * size / (bus_gbps * 1e9) * 1e3
