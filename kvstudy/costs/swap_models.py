"""Swap cost models (config group ``swap``): seconds to copy a preempted request's KV blocks between GPU
and host memory, in one direction. Each GPU copies its own tensor-parallel shard over its own link at the
same time, so a copy of n blocks moves ``n * block_bytes_per_gpu`` bytes per GPU.

* ``pcie`` (:class:`PcieSwap`): a bandwidth model: PCIe 4.0 x16 (``hardware.pcie_gbps``) at 80%
  efficiency plus 10 us per layer (vLLM issues one copy per layer), as in ``kvstudy/costs/preemption_cost.py``.
* ``vllm_blocks`` (:class:`VllmBlocksSwap`): vLLM V0's one-``cudaMemcpyAsync``-per-block path, which
  CacheOPT and RR-SJF ran on. vLLM pull request 11531 measured, on an A100-40GB, 1.21 GB/s for one
  block and 3.11 GB/s for 1,250 blocks with that implementation (12.6 GB/s with the PR's new kernel).
  The effective rate is fitted as ``rate(n) = 1 / (a / n + b)`` (a fixed cost per copy call amortised
  over n blocks plus a per-byte cost): the two measurements give ``a = 0.5053``, ``b = 0.3211`` ns per
  byte. ``kernel: batched`` uses the new kernel's flat 12.6 GB/s instead.

``overlap`` (a setting of both): whether swaps run concurrently with the iteration's compute (the
iteration then takes the longer of the two) or before it (vLLM V0: they do not overlap; the default).
"""
from __future__ import annotations

from kvstudy.config.validate import check_group
from kvstudy.costs.transfer import Link

PCIE_EFFICIENCY = 0.8
PER_LAYER_OVERHEAD_S = 10e-6
# vLLM PR 11531 (A100-40GB): effective GB/s for 1 and 1,250 blocks with one copy per block.
PR11531_RATE_1, PR11531_RATE_1250, PR11531_NEW_KERNEL = 1.21, 3.11, 12.6


def kv_bytes_per_gpu(arch, hardware) -> int:
    """KV bytes of one token on one GPU: heads split over tensor parallelism, layers over pipeline stages."""
    return arch.kv_bytes_per_token(hardware.tensor_parallel) // max(1, hardware.pipeline_parallel)


def _fit_per_block_rate():
    """Solve 1/rate(n) = a/n + b through (1, 1.21) and (1250, 3.11); a, b in ns per byte."""
    inv1, inv1250 = 1.0 / PR11531_RATE_1, 1.0 / PR11531_RATE_1250
    a = (inv1 - inv1250) / (1.0 - 1.0 / 1250)
    return a, inv1 - a


class SwapModel:
    name = "base"

    def __init__(self, overlap: bool = False) -> None:
        check_group("swap", {"overlap": overlap})  # a setting of every swap model (kvstudy/config/schema.py)
        self.overlap = overlap

    def bind(self, arch, hardware, block_tokens: int) -> "SwapModel":
        """Size the copies for ``arch`` on ``hardware`` in blocks of ``block_tokens`` tokens (one GPU's shard)."""
        self.layers = arch.num_layers // max(1, hardware.pipeline_parallel)
        self.pcie_gbps = float(hardware.pcie_gbps)
        self.block_bytes = int(block_tokens * kv_bytes_per_gpu(arch, hardware))
        return self

    def seconds(self, blocks: int) -> float:
        """One direction (out or in) for ``blocks`` blocks moved together."""
        raise NotImplementedError

    def describe(self) -> dict:
        return {"name": self.name, "overlap": self.overlap}


class PcieSwap(SwapModel):
    name = "pcie"

    def __init__(self, efficiency: float = PCIE_EFFICIENCY, per_layer_overhead_s: float = PER_LAYER_OVERHEAD_S,
                 overlap: bool = False, name: str = "pcie") -> None:
        super().__init__(overlap)
        check_group("swap", {"_target_": "kvstudy.costs.swap_models.PcieSwap", "efficiency": efficiency,
                             "per_layer_overhead_s": per_layer_overhead_s})
        self.efficiency, self.per_layer = float(efficiency), float(per_layer_overhead_s)

    def bind(self, arch, hardware, block_tokens: int) -> "PcieSwap":
        super().bind(arch, hardware, block_tokens)
        #: the host link (kvstudy/costs/transfer.py): PCIe at ``efficiency``, one copy per layer
        self.link = Link(self.pcie_gbps, self.efficiency, per_layer_s=self.per_layer, layers=self.layers)
        return self

    def seconds(self, blocks: int) -> float:
        if blocks <= 0:
            return 0.0
        return self.link.seconds(blocks * self.block_bytes)


class VllmBlocksSwap(SwapModel):
    name = "vllm_blocks"

    def __init__(self, kernel: str = "per_block", overlap: bool = False, name: str = "vllm_blocks") -> None:
        super().__init__(overlap)
        check_group("swap", {"_target_": "kvstudy.costs.swap_models.VllmBlocksSwap", "kernel": kernel})
        self.kernel = kernel
        self.a_ns, self.b_ns = _fit_per_block_rate()

    def rate_gbps(self, blocks: int) -> float:
        if self.kernel == "batched":
            return PR11531_NEW_KERNEL
        return 1.0 / (self.a_ns / blocks + self.b_ns)

    def bind(self, arch, hardware, block_tokens: int) -> "VllmBlocksSwap":
        super().bind(arch, hardware, block_tokens)
        self.link = Link(rate=self.rate_gbps)  # kvstudy/costs/transfer.py: one copy call per block
        return self

    def seconds(self, blocks: int) -> float:
        if blocks <= 0:
            return 0.0
        return self.link.seconds(blocks * self.block_bytes, copies=blocks)

    def describe(self) -> dict:
        return {**super().describe(), "kernel": self.kernel}
