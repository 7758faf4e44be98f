"""``DeviceMemoryReservation``: TorchRec ``StorageReservation`` keeping a fraction of each
device's embedding memory (HBM on npu/cuda, DDR on cpu) for the dense model, activations and
the allocator.  Unlike TorchRec's ``HeuristicalStorageReservation`` it does not estimate the
dense part from the module (TorchRec warns that this estimate fails on meta modules), and
unlike ``FixedPercentageStorageReservation`` it also reserves DDR on cpu."""

from __future__ import annotations

import copy
from typing import Dict, List, Optional

from torch import nn
from torchrec.distributed.planner.types import (
    ParameterConstraints,
    StorageReservation,
    Topology,
)
from torchrec.distributed.types import ModuleSharder

__all__ = ["DeviceMemoryReservation"]


class DeviceMemoryReservation(StorageReservation):
    def __init__(self, fraction: float = 0.15) -> None:
        if not 0 <= fraction < 1:
            raise ValueError(f"fraction={fraction}: must be in [0, 1)")
        self.fraction = fraction
        self._percentage = fraction  # TorchRec's planner reads it when reporting a failure
        self._last: Optional[Topology] = None

    def reserve(self, topology: Topology, batch_size: int, module: nn.Module,
                sharders: List[ModuleSharder[nn.Module]],
                constraints: Optional[Dict[str, ParameterConstraints]] = None) -> Topology:
        reserved = copy.deepcopy(topology)
        keep = 1.0 - self.fraction
        for device in reserved.devices:
            if topology.compute_device == "cpu":
                device.storage.ddr = int(device.storage.ddr * keep)
            else:
                device.storage.hbm = int(device.storage.hbm * keep)
        self._last = reserved
        return reserved

    @property
    def last_reserved_topology(self) -> Optional[Topology]:
        return copy.deepcopy(self._last)
