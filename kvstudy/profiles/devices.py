"""The GPUs and nodes the profile builder knows: public specs, and whose measured efficiencies each borrows.

A device's operator times come from the roofline of ``gpu_model.py`` with the device's own peaks (dense FP16/BF16
tensor TFLOPS, memory bandwidth) and per-operator efficiencies (c0, eta, mu) fitted to real measurements of one
*calibrated* GPU (``calibration``): A100 on Vidur's A100 profiles (``profiles/calibration.json``), H100 on Vidur's H100
profiles (``profiles/calibration_h100.json``). A device with no measurement of its own is ``calibrated=False``:
H200 borrows H100's efficiencies (the same GH100 chip and Hopper kernels with more and faster memory), A40 and L4
borrow A100's (Ampere GA102 / Ada AD104: tensor cores of the same generation or one after; no measurement of either
exists here). Everything built for such a device says "uncalibrated" (profiles/README.md, the hardware config, the
run summary).

Attention has no measured profile on any GPU here; its compute efficiency is FlashAttention-2's published fraction of
each architecture's peak (``attention_eta_max``): on A100 the forward pass at head dim 128 reaches 180-230 TFLOPS
(Dao 2023, "FlashAttention-2", Fig. 4; kvstudy takes 0.65 of 312); on H100 it reaches up to 335 TFLOPS (ibid.,
Sec. 4.1 / Fig. 7), i.e. the same kernel uses a smaller share of Hopper's peak: 0.65 * (335 / 989) / (230 / 312) =
0.30. Decode attention is bandwidth-bound on every GPU (mu 0.65 of its memory bandwidth).

Nodes: the collectives of a node Vidur measured are fitted to its measurements (``calibration.py``); a node it did
not measure is derived from a measured one with the link bandwidth scaled by the spec ratio (``NodeSpec.derived``).

Memory: ``memory_gb`` is the vendor's figure (80, 141, 48, 24 "GB"); ``visible_gib`` what CUDA reports as the device's
total (``torch.cuda.mem_get_info()[1]``, the ``total_gpu_memory`` vLLM's memory profiling starts from), in GiB
(2^30 B), with its source in ``memory_source``. An "80 GB" A100 or H100 has 80 GiB of HBM (nvidia-smi: 81,920 MiB
and 81,559 MiB) of which the driver keeps ~0.4-0.9 GiB; the KV capacity (kvstudy/costs/capacity.py) starts from
``visible_gib``. Printed figures (A100, H100) are used as printed; the others are nvidia-smi's total less the
reserve measured on the closest device with both figures (Hopper: H100's 0.43 GiB; GDDR6 Ampere/Ada: A10G's
0.51 GiB), each said in its source.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class Device:
    name: str
    peak_tflops: float  # dense FP16/BF16 tensor-core peak
    hbm_gbps: float  # memory bandwidth, GB/s
    memory_gb: float  # device memory, the vendor's "GB" (datasheet)
    pcie_gbps: float  # host link, GB/s per direction (after encoding)
    calibration: str = "a100"  # the measured GPU whose fitted efficiencies it uses
    attention_eta_max: float = 0.65  # FlashAttention-2's share of this architecture's peak (module docstring)
    source: str = ""  # where every number above comes from
    visible_gib: float = 0.0  # total memory as CUDA reports it (torch.cuda.mem_get_info), GiB (module docstring)
    memory_source: str = ""  # where visible_gib comes from

    @property
    def memory_bytes(self) -> int:
        """The device's memory in bytes as CUDA reports it (what vLLM's ``gpu_memory_utilization`` multiplies)."""
        return int(round(self.visible_gib * 2 ** 30))

    @property
    def calibrated(self) -> bool:
        """Its own measurements fitted (the MLP block and collectives), not a borrowed calibration."""
        return self.calibration == self.name


#: Every number from the vendor's datasheet; PCIe per direction after 128b/130b encoding (Gen4 x16 31.5 GB/s,
#: Gen5 x16 63 GB/s).
DEVICES: Dict[str, Device] = {
    "a100": Device("a100", peak_tflops=312.0, hbm_gbps=2039.0, memory_gb=80.0, pcie_gbps=31.5, calibration="a100",
                   source="NVIDIA A100 Tensor Core GPU datasheet (2021), A100 SXM4 80GB: 312 TFLOPS dense FP16/BF16 "
                          "tensor, HBM2e 2,039 GB/s, 80 GB, NVLink 600 GB/s, PCIe Gen4 x16",
                   visible_gib=79.15,
                   memory_source="PyTorch's out-of-memory message on an A100-SXM4-80GB, 'GPU 0 has a total capacity "
                                 "of 79.15 GiB' (torch.cuda.mem_get_info total), quoted with nvidia-smi's '0MiB / "
                                 "81920MiB' in public notes; nvidia-smi's 81,920 MiB also in modal-labs/modal-client "
                                 "PR #2797"),
    "h100": Device("h100", peak_tflops=989.0, hbm_gbps=3350.0, memory_gb=80.0, pcie_gbps=63.0, calibration="h100",
                   attention_eta_max=0.30,
                   source="NVIDIA H100 Tensor Core GPU datasheet (2023), H100 SXM5 80GB: 989 TFLOPS dense FP16/BF16 "
                          "tensor (1,979 with sparsity), HBM3 3.35 TB/s, 80 GB, NVLink 900 GB/s, PCIe Gen5 x16",
                   visible_gib=79.216,
                   memory_source="vLLM's own memory-profiling log on an H100-80G, 'total_gpu_memory (79.22GiB) x "
                                 "gpu_memory_utilization (0.90) = 71.29GiB' (vllm-project/vllm PR #12126; the same "
                                 "79.22GiB in PR #10511): both roundings hold for 79.215-79.2167 GiB; nvidia-smi "
                                 "81,559 MiB (modal-labs/modal-client PR #2797), so the driver keeps 0.43 GiB"),
    "h200": Device("h200", peak_tflops=989.0, hbm_gbps=4800.0, memory_gb=141.0, pcie_gbps=63.0, calibration="h100",
                   attention_eta_max=0.30,
                   source="NVIDIA H200 Tensor Core GPU datasheet (2024), H200 SXM: 989 TFLOPS dense FP16/BF16 tensor "
                          "(1,979 with sparsity), HBM3e 4.8 TB/s, 141 GB, NVLink 900 GB/s, PCIe Gen5 x16",
                   visible_gib=139.97,
                   memory_source="nvidia-smi's total '143771MiB' on an H200 (public nvidia-smi outputs) less the "
                                 "0.43 GiB the driver keeps on an H100 (its 81,559 MiB vs vLLM's 79.22 GiB): an "
                                 "estimate, no printed CUDA total found"),
    "a40": Device("a40", peak_tflops=149.7, hbm_gbps=696.0, memory_gb=48.0, pcie_gbps=31.5, calibration="a100",
                  source="NVIDIA A40 datasheet (2020): 149.7 TFLOPS dense FP16/BF16 tensor (299.4 with sparsity), "
                         "48 GB GDDR6 696 GB/s, NVLink bridge 112.5 GB/s bidirectional (2 GPUs), PCIe Gen4 x16",
                  visible_gib=44.48,
                  memory_source="nvidia-smi's total '46068MiB' on an A40 with ECC on (the data-center default; "
                                "49,140 MiB with ECC off; public nvidia-smi outputs) less the 0.51 GiB the driver "
                                "keeps on an A10G (nvidia-smi 23,028 MiB vs PyTorch's 'total capacity of 21.98 "
                                "GiB'): an estimate, no printed CUDA total found"),
    "l4": Device("l4", peak_tflops=121.0, hbm_gbps=300.0, memory_gb=24.0, pcie_gbps=31.5, calibration="a100",
                 source="NVIDIA L4 datasheet (2023): 121 TFLOPS dense FP16/BF16 tensor (242 with sparsity), 24 GB GDDR6 "
                        "300 GB/s, PCIe Gen4 x16, no NVLink",
                 visible_gib=21.99,
                 memory_source="nvidia-smi's total 23,034 MiB on an L4 (modal-labs/modal-client PR #2797) less the "
                               "0.51 GiB the driver keeps on an A10G (23,028 MiB vs PyTorch's 'total capacity of "
                               "21.98 GiB'): an estimate"),
}

#: The GPUs with measurements (Vidur's public profiles): the calibration file of each.
CALIBRATED = ("a100", "h100")


@dataclass(frozen=True)
class NodeSpec:
    """A node type's collectives: ``workers`` the all-reduce sizes profiled (all inside one node). Measured by Vidur
    for ``calibration`` (fitted from its files), or ``derived`` from a measured node: ``bus_scale`` multiplies that
    node's fitted bandwidth of each (collective, workers, devices per node) in its keys; the others as measured
    there."""
    name: str
    workers: Tuple[int, ...]
    calibration: str  # the calibrated GPU whose measurements (or derivation) it rests on
    derived: Optional[str] = None  # the measured node it is derived from
    bus_scale: Dict[Tuple[str, int, int], float] = field(default_factory=dict)
    source: str = ""


#: A40's NVLink bridge joins two GPUs at 112.5 GB/s bidirectional (56.25 per direction); the A100 node it is derived
#: from links its pairs at 600 GB/s bidirectional (300 per direction; A100 datasheet), so a 2-GPU ring and a send/recv
#: between the two GPUs of a pair run at 56.25 / 300 of A100's measured bandwidth. A 4-GPU ring crosses PCIe Gen4 in
#: both nodes (A100's measured 4-way bus bandwidth is 23.6 GB/s, PCIe-bound), and so does a send/recv between nodes
#: (devices per node 1): kept as measured.
#: Vidur's h100_pairwise_nvlink/send_recv.csv is byte for byte its a100_pairwise_nvlink one (the same md5): that
#: node's send/recv "fit to H100 measurements" is A100's.
NODES: Dict[str, NodeSpec] = {
    "a100_pairwise_nvlink": NodeSpec("a100_pairwise_nvlink", (2, 4), "a100",
                                     source="Vidur's measured all_reduce.csv / send_recv.csv"),
    "a100_dgx": NodeSpec("a100_dgx", (2, 4, 8), "a100", source="Vidur's measured all_reduce.csv / send_recv.csv"),
    "h100_pairwise_nvlink": NodeSpec("h100_pairwise_nvlink", (2, 4), "h100",
                                     source="Vidur's measured all_reduce.csv; its send_recv.csv is A100's (identical "
                                            "files)"),
    "h100_dgx": NodeSpec("h100_dgx", (2, 4, 8), "h100", source="Vidur's measured all_reduce.csv / send_recv.csv"),
    "a40_pairwise_nvlink": NodeSpec("a40_pairwise_nvlink", (2, 4), "a100", derived="a100_pairwise_nvlink",
                                    bus_scale={("all_reduce", 2, 2): 56.25 / 300.0, ("send_recv", 2, 2): 56.25 / 300.0},
                                    source="derived from a100_pairwise_nvlink: NVLink bridge 112.5 GB/s bidirectional "
                                           "(A40 datasheet) against A100's 600 GB/s inside a pair; 4-way all-reduce and "
                                           "send/recv between nodes over PCIe Gen4 as measured on A100"),
}


def device(name: str) -> Device:
    from kvstudy.errors import ConfigError

    if name not in DEVICES:
        near = f" (names are lower case: '{name.lower()}')" if isinstance(name, str) and name.lower() in DEVICES else ""
        raise ConfigError(f"device '{name}'{near}: allowed {', '.join(DEVICES)} (kvstudy/profiles/devices.py)")
    return DEVICES[name]


def nodes_of(calibration: str):
    """The node types whose collectives rest on ``calibration``'s measurements, in a fixed order."""
    return [n for n in NODES.values() if n.calibration == calibration]
