"""Published defaults of the hosts the planner knows (docs/planner.md lists each source).

Bandwidths are per device and per direction, in bytes/s: a vendor's bidirectional figure is
halved (NVLink 4's 900 GB/s -> 450 GB/s; HCCS 392 GB/s -> 196 GB/s); a NIC's line rate in Gb/s
is divided by 8 (200 GbE RoCE -> 25 GB/s).  Latencies are order-of-magnitude assumptions of one
collective call (not published figures); a topology file overrides any field.
"""

from __future__ import annotations

import dataclasses
from typing import Dict

from torchrec.distributed.planner import constants as _trc

from .types import LinkSpec

__all__ = ["DevicePreset", "PRESETS", "DEFAULT_PRESET", "preset"]

GiB = 1 << 30
GB = 10 ** 9


@dataclasses.dataclass(frozen=True)
class DevicePreset:
    """A host kind: devices per host, per-device memory / memory bandwidth / peak dense
    FLOP/s, intra- and inter-host links, and where the numbers come from."""

    name: str
    compute_device: str
    devices_per_host: int
    memory_bytes: int
    memory_bandwidth: float
    peak_flops: float
    intra_host: LinkSpec
    inter_host: LinkSpec
    source: str


PRESETS: Dict[str, DevicePreset] = {
    p.name: p
    for p in (
        DevicePreset(
            "ascend-a2", "npu", 8, 64 * GiB, 1.6e12, 313e12,
            LinkSpec(392 * GB / 2, 5e-6), LinkSpec(200 * GB / 8, 15e-6),
            "Huawei Atlas 800T A2: 8 x Ascend 910B, 64 GB HBM2e and ~1.6 TB/s per NPU, HCCS "
            "full mesh 392 GB/s per NPU (7 x 56 GB/s), one 200 GE RoCE port per NPU, ~313 "
            "TFLOPS FP16"),
        DevicePreset(
            "ascend-a3", "npu", 16, 64 * GiB, 1.6e12, 400e12,
            LinkSpec(392 * GB / 2, 5e-6), LinkSpec(200 * GB / 8, 15e-6),
            "Huawei Atlas 800T A3: 8 x Ascend 910C = 16 NPU dies per node (HiAM pairs over "
            "SIO, HCCS between pairs; RoCE between SuperPoDs), 128 GB HBM / 3.2 TB/s / 784 GB/s "
            "HCCS / ~800 TFLOPS FP16 per 910C, i.e. half per die; one 200 GE RoCE port per die"),
        DevicePreset(
            "h100", "cuda", 8, 80 * GiB, 3.35e12, 989e12,
            LinkSpec(900 * GB / 2, 3e-6), LinkSpec(400 * GB / 8, 10e-6),
            "NVIDIA DGX H100: 8 x H100 SXM5, 80 GB HBM3 and 3.35 TB/s per GPU, NVLink 4 900 GB/s "
            "bidirectional per GPU, 8 x 400 Gb/s ConnectX-7 InfiniBand (one per GPU), 989 "
            "TFLOPS BF16 dense"),
        DevicePreset(
            "h200", "cuda", 8, 141 * GB, 4.8e12, 989e12,
            LinkSpec(900 * GB / 2, 3e-6), LinkSpec(400 * GB / 8, 10e-6),
            "NVIDIA HGX/DGX H200: 8 x H200 SXM, 141 GB HBM3e and 4.8 TB/s per GPU, NVLink 4 900 "
            "GB/s bidirectional per GPU, 400 Gb/s InfiniBand per GPU, 989 TFLOPS BF16 dense"),
        DevicePreset(
            "cpu", "cpu", 1, _trc.DDR_CAP, _trc.DDR_MEM_BW * 1000, 1e12,
            LinkSpec(_trc.DDR_MEM_BW * 1000 / 2, 2e-6),
            LinkSpec(_trc.CROSS_NODE_BANDWIDTH * 1000, 30e-6),
            "TorchRec 1.8 planner constants (torchrec/distributed/planner/constants.py): "
            "DDR_CAP 128 GiB per rank, DDR_MEM_BW 51 GiB/s, CROSS_NODE_BANDWIDTH 12.5 GiB/s "
            "(100 GbE class); intra-host = half of DDR_MEM_BW (a shared-memory copy reads and "
            "writes DDR); peak 1 TFLOP/s is a placeholder (lookups are priced by memory "
            "bandwidth)"),
    )
}

# the preset each device kind gets when none is named
DEFAULT_PRESET: Dict[str, str] = {"npu": "ascend-a2", "cuda": "h100", "cpu": "cpu"}


def preset(name: str) -> DevicePreset:
    """The preset called ``name`` (a key of :data:`PRESETS`)."""
    if name not in PRESETS:
        raise ValueError(f"preset={name!r}: must be one of {sorted(PRESETS)}")
    return PRESETS[name]
