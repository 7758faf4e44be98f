"""Parameter versions of the local embedding shards, observed from the weights themselves.

Version ``v`` of a rank's sparse parameters is their value after ``v`` sparse updates (batches
``0 .. v-1``).  :class:`ParameterVersions` fingerprints the local shards (a float64 dot product
with a fixed random vector per tensor) after every update, and at every lookup finds which
version's fingerprint the weights it reads match.  A lookup of batch ``i`` that reads version
``v`` is ``i - v`` updates stale (synchronous training reads version ``i``).  Fingerprints are
computed on the device of the weights; they cost one pass over the local tables, so tracking is
opt-in (tests, small runs).
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch
from torch import nn

__all__ = ["ParameterVersions", "local_sparse_tensors"]


def local_sparse_tensors(modules: List[nn.Module]) -> Dict[str, torch.Tensor]:
    """``{name: tensor}`` of every local shard of the sharded modules' state dicts."""
    out: Dict[str, torch.Tensor] = {}
    for m_i, module in enumerate(modules):
        for key, value in module.state_dict().items():
            if hasattr(value, "local_shards"):
                for s_i, shard in enumerate(value.local_shards()):
                    out[f"{m_i}.{key}.{s_i}"] = shard.tensor
            elif isinstance(value, torch.Tensor) and value.is_floating_point():
                out[f"{m_i}.{key}"] = value
    return out


class ParameterVersions:
    """Fingerprints of the local sparse weights per version, and the version each lookup saw."""

    def __init__(self, modules: List[nn.Module], seed: int = 0) -> None:
        self._modules = list(modules)
        self._probes: Dict[str, torch.Tensor] = {}
        self._seed = seed
        self.fingerprints: List[float] = []      # fingerprints[v] = weights after v updates
        self.seen: Dict[int, int] = {}           # batch index -> version its lookup read

    def _fingerprint(self) -> float:
        total = torch.zeros((), dtype=torch.float64)
        for name, t in local_sparse_tensors(self._modules).items():
            probe = self._probes.get(name)
            if probe is None or probe.shape != t.shape:
                g = torch.Generator().manual_seed(self._seed + len(self._probes))
                probe = torch.rand(t.shape, generator=g, dtype=torch.float64).to(t.device)
                self._probes[name] = probe
            total = total + (t.detach().to(torch.float64) * probe).sum().cpu()
        return float(total)

    def record_update(self) -> None:
        """Call once before training (version 0) and after every sparse update."""
        self.fingerprints.append(self._fingerprint())

    @property
    def version(self) -> int:
        """Number of updates recorded so far."""
        return len(self.fingerprints) - 1

    def record_lookup(self, batch: int) -> int:
        """Call just before batch ``batch``'s lookup reads the weights; returns the version read
        (the newest version with that fingerprint; -1 if it matches none, a torn read)."""
        fp = self._fingerprint()
        version = -1
        for v in range(len(self.fingerprints) - 1, -1, -1):
            if self.fingerprints[v] == fp:
                version = v
                break
        self.seen[int(batch)] = version
        return version

    def staleness(self) -> Dict[int, int]:
        """``{batch: updates it was behind}`` (``batch - version read``)."""
        return {b: b - v for b, v in self.seen.items()}

    def distinct(self) -> bool:
        """Whether every recorded version had different weights (else a stale read of an
        unchanged version is indistinguishable from a fresh one)."""
        return len(set(self.fingerprints)) == len(self.fingerprints)

    def max_staleness(self) -> Optional[int]:
        """The largest staleness seen, or None before any lookup."""
        st = self.staleness()
        return max(st.values()) if st else None
