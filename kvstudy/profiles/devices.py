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
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class Device:
    name: str
    peak_tflops: float  # dense FP16/BF16 tensor-core peak
    hbm_gbps: float  # memory bandwidth, GB/s
    memory_gb: float  # device memory, GB
    pcie_gbps: float  # host link, GB/s per direction (after encoding)
    calibration: str = "a100"  # the measured GPU whose fitted efficiencies it uses
    attention_eta_max: float = 0.65  # FlashAttention-2's share of this architecture's peak (module docstring)
    source: str = ""  # where every number above comes from

    @property
    def calibrated(self) -> bool:
        """Its own measurements fitted (the MLP block and collectives), not a borrowed calibration."""
        return self.calibration == self.name


#: Every number from the vendor's datasheet; PCIe per direction after 128b/130b encoding (Gen4 x16 31.5 GB/s,
#: Gen5 x16 63 GB/s).
DEVICES: Dict[str, Device] = {
    "a100": Device("a100", peak_tflops=312.0, hbm_gbps=2039.0, memory_gb=80.0, pcie_gbps=31.5, calibration="a100",
                   source="NVIDIA A100 Tensor Core GPU datasheet (2021), A100 SXM4 80GB: 312 TFLOPS dense FP16/BF16 "
                          "tensor, HBM2e 2,039 GB/s, 80 GB, NVLink 600 GB/s, PCIe Gen4 x16"),
    "h100": Device("h100", peak_tflops=989.0, hbm_gbps=3350.0, memory_gb=80.0, pcie_gbps=63.0, calibration="h100",
                   attention_eta_max=0.30,
                   source="NVIDIA H100 Tensor Core GPU datasheet (2023), H100 SXM5 80GB: 989 TFLOPS dense FP16/BF16 "
                          "tensor (1,979 with sparsity), HBM3 3.35 TB/s, 80 GB, NVLink 900 GB/s, PCIe Gen5 x16"),
    "h200": Device("h200", peak_tflops=989.0, hbm_gbps=4800.0, memory_gb=141.0, pcie_gbps=63.0, calibration="h100",
                   attention_eta_max=0.30,
                   source="NVIDIA H200 Tensor Core GPU datasheet (2024), H200 SXM: 989 TFLOPS dense FP16/BF16 tensor "
                          "(1,979 with sparsity), HBM3e 4.8 TB/s, 141 GB, NVLink 900 GB/s, PCIe Gen5 x16"),
    "a40": Device("a40", peak_tflops=149.7, hbm_gbps=696.0, memory_gb=48.0, pcie_gbps=31.5, calibration="a100",
                  source="NVIDIA A40 datasheet (2020): 149.7 TFLOPS dense FP16/BF16 tensor (299.4 with sparsity), "
                         "48 GB GDDR6 696 GB/s, NVLink bridge 112.5 GB/s bidirectional (2 GPUs), PCIe Gen4 x16"),
    "l4": Device("l4", peak_tflops=121.0, hbm_gbps=300.0, memory_gb=24.0, pcie_gbps=31.5, calibration="a100",
                 source="NVIDIA L4 datasheet (2023): 121 TFLOPS dense FP16/BF16 tensor (242 with sparsity), 24 GB GDDR6 "
                        "300 GB/s, PCIe Gen4 x16, no NVLink"),
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
        raise ConfigError(f"device '{name}': allowed {', '.join(DEVICES)} (kvstudy/profiles/devices.py)")
    return DEVICES[name]


def nodes_of(calibration: str):
    """The node types whose collectives rest on ``calibration``'s measurements, in a fixed order."""
    return [n for n in NODES.values() if n.calibration == calibration]
