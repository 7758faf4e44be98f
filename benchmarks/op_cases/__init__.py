"""Per-area op benchmark cases for benchmarks/ops.py: ours vs fbgemm's CPU kernel, same inputs.

Each area module (``sparse``, ``embedding``, ``jagged``) exposes ``cases(quick) -> list[Case]``.
A :class:`Case` holds the op name, a shape description and two zero-argument callables:
``ours`` calls ``torch.ops.torchrec_ascend.<op>`` (the registry picks the backend; run it inside
:func:`ours_context`, which takes fbgemm out of the choice) and ``baseline`` the same inputs on
``torch.ops.fbgemm.<op>`` where fbgemm-gpu-cpu has a CPU kernel for it, else on our torch-composite
reference implementation called directly (``baseline_name`` says which).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from typing import Callable, Iterator, Optional, Sequence

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from torchrec_ascend.ops import registry  # noqa: E402

__all__ = ["Case", "case", "ours_context", "our_backend", "fbgemm_cpu_kernel", "offsets_of"]

_FBGEMM_BACKENDS = ("fbgemm", "fbgemm_ascend")


@dataclasses.dataclass
class Case:
    """One benchmark row: ``op`` timed as ``ours()`` and ``fbgemm()`` (same inputs)."""

    op: str
    shapes: str
    ours: Callable[[], object]
    baseline: Callable[[], object]
    baseline_name: str  # "fbgemm" or "reference"
    training_path: bool = False

    @property
    def fbgemm(self) -> Optional[Callable[[], object]]:
        """The fbgemm side, or None where fbgemm-gpu-cpu has no CPU kernel for the op."""
        return self.baseline if self.baseline_name == "fbgemm" else None


def fbgemm_cpu_kernel(op: str) -> bool:
    """fbgemm-gpu-cpu is loaded and has a CPU kernel (or a CPU-capable composite) for ``op``."""
    if not registry.fbgemm_loaded() or not hasattr(torch.ops.fbgemm, op):
        return False
    qual = f"fbgemm::{op}"
    return any(torch._C._dispatch_has_kernel_for_dispatch_key(qual, k)
               for k in ("CPU", "CompositeImplicitAutograd", "CompositeExplicitAutograd"))


def case(op: str, shapes: str, args: Sequence[object], fb_args: Optional[Sequence[object]] = None,
         training_path: bool = False, fb_op: Optional[str] = None) -> Case:
    """A case calling ``op`` with ``args`` on both sides (``fb_args``: the baseline's own copy of
    mutable inputs; ``fb_op``: fbgemm's name where it differs)."""
    ours_fn = getattr(torch.ops.torchrec_ascend, op)
    fb_name = fb_op or op
    a = tuple(args)
    b = tuple(fb_args) if fb_args is not None else a
    if fbgemm_cpu_kernel(fb_name):
        fb_fn = getattr(torch.ops.fbgemm, fb_name)
        return Case(op, shapes, lambda: ours_fn(*a), lambda: fb_fn(*b), "fbgemm", training_path)
    ref_fn = registry.spec(op).reference
    full = registry.full_args(op, b)
    return Case(op, shapes, lambda: ours_fn(*a), lambda: ref_fn(*full), "reference",
                training_path)


@contextlib.contextmanager
def ours_context() -> Iterator[None]:
    """Every op on our best CPU backend with fbgemm excluded: the registry's own preference
    order (triton > cpu_kernel > reference) minus fbgemm, for the op and every op it calls."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(registry.use_backend("reference", device="cpu"))
        for backend in ("cpu_kernel", "triton"):  # pushed last = preferred
            ops = [s.name for s in registry.all_specs()
                   if backend in [b for b, _ in registry.available_backends(s.name, "cpu")]]
            if ops:
                stack.enter_context(registry.use_backend(backend, ops=ops, device="cpu"))
        yield


def our_backend(op: str) -> str:
    """The backend ``op`` runs on (call it inside :func:`ours_context`)."""
    backend, _ = registry.choose(op, "cpu")
    assert backend not in _FBGEMM_BACKENDS, (op, backend)
    return backend


def offsets_of(lengths: torch.Tensor) -> torch.Tensor:
    """Complete cumsum ``[0, cumsum(lengths)]`` as int64."""
    return torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths.to(torch.int64), 0)])
