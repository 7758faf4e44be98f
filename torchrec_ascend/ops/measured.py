"""``ops.describe()`` notes for csrc kernel variants chosen by a one-time measurement on this CPU
(``csrc/interleaved_timing.h``): which variant the CPU got.

The choices are memory-system facts that a CPU's name does not settle (the same prefetch helps on
one CPU and costs on another); the kernel measures them on first use, and asking here measures
them now if no call has yet (a few to ~30 ms, once per process).
"""

from __future__ import annotations

from typing import Callable

from . import extension

__all__ = ["measured_detail", "FAR_PREFETCH", "SCATTER_PREFETCH"]


def measured_detail(probe: str, chosen: str, otherwise: str) -> Callable[[str, str], str]:
    """An OpSpec ``detail``: on the csrc CPU backend, ``chosen`` where the extension's ``probe()``
    (a one-time measurement) is true, else ``otherwise``; nothing elsewhere."""

    def detail(device: str, backend: str) -> str:
        fn = extension.kernel(probe)
        if device != "cpu" or backend != "cpu_kernel" or fn is None:
            return ""
        return f"{chosen if fn() else otherwise} (measured on this CPU)"

    return detail


# the pooled TBE forward for weights past the LLC (csrc/embedding.cpp far_prefetch_pays; tests
# force it with _set_far_prefetch)
FAR_PREFETCH = measured_detail("_far_prefetch_used", "weights past the LLC: rows prefetched into L2 and L1",
                               "weights past the LLC: rows prefetched into L1 only")
# invert_permute's writes (csrc/sparse.cpp prefetch_scatter_pays)
SCATTER_PREFETCH = measured_detail("_prefetch_scatter_pays", "writes prefetched", "writes not prefetched")
