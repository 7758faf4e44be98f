"""What an op is (data only): :class:`OpSpec` (schema, implementations side by side, fake kernel,
autograd formula, what fbgemm has, fbgemm's argument rules and fix-ups) and :class:`Limit` (the
calls a fast backend covers)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional

__all__ = ["BACKENDS", "FBGEMM_BACKENDS", "DEVICES", "Impl", "Limit", "OpSpec"]

BACKENDS = ("fbgemm", "fbgemm_ascend", "triton", "cpu_kernel", "reference")
"""Every backend, in the default preference order (first available wins)."""

FBGEMM_BACKENDS = ("fbgemm", "fbgemm_ascend")
"""The backends that are fbgemm's own kernel (``torch.ops.fbgemm.<op>``)."""

DEVICES = ("cpu", "cuda", "npu")

Impl = Callable[..., object]


@dataclasses.dataclass(frozen=True)
class Limit:
    """The calls one backend of an op covers; the others go to the next backend that does.

    Attributes:
        covers: human-readable rule, shown by ``describe()`` (e.g. ``"one jagged dimension"``).
        accepts: predicate over the op's full positional arguments (schema defaults filled in);
            it must read shapes and argument values only, never tensor data (no device sync).
    """

    covers: str
    accepts: Callable[..., bool]


@dataclasses.dataclass
class OpSpec:
    """One op: schema, implementations side by side, fake kernel, autograd formula.

    Attributes:
        name: op name, the same in ``torchrec_ascend::`` and (when ``fbgemm``) ``fbgemm::``.
        schema: argument/return part of the schema, e.g. ``"(Tensor t_in) -> Tensor"``;
            mirrors fbgemm's schema for fbgemm ops.
        reference: torch-composite implementation (device-agnostic, the always-there backend:
            it covers every case the op accepts).
        fake: fake/meta kernel (shapes only).
        fbgemm: True if fbgemm has an op of this name and schema.
        fbgemm_ascend: True if fbgemm-ascend 1.5.0 is documented to implement it (used only
            when it really has a PrivateUse1 kernel at run time).
        triton: Triton implementation (CUDA, Ascend; CPU under ``TRITON_INTERPRET=1``).
        cpu_kernel: name of the function in the compiled ``torchrec_ascend._C`` extension.
        backward / setup_context: autograd formula, as for ``torch.library.register_autograd``.
        decomposes_in_fbgemm: fbgemm registers the op as CompositeImplicitAutograd (it decomposes
            into other fbgemm ops), so no PrivateUse1 kernel is registered for it.
        limits: ``{backend: Limit}`` for backends that cover only part of the op's cases
            (``triton`` / ``cpu_kernel``; ``reference`` covers everything by definition).
        contract: fbgemm's argument rules for the raw op, ``contract(*args)`` raising the error
            class fbgemm raises (ValueError / RuntimeError, naming the argument and the rule);
            run before the ``reference`` and ``triton`` backends (the csrc kernels check the same
            rules in C++, fbgemm's kernel its own).
        fbgemm_fixup: where fbgemm's own kernel serves the op, ``fbgemm_fixup(kernel, args)``
            calls it and makes the outcome what the other backends give (rows fbgemm leaves
            uninitialised zeroed, an error worded as ours).
        detail: ``detail(device, backend)``, a note ``describe()`` adds to the op's row (what the
            chosen backend runs inside, e.g. the csrc HSTU engines); ``""`` for none.
    """

    name: str
    schema: str
    reference: Impl
    fake: Impl
    fbgemm: bool = False
    fbgemm_ascend: bool = False
    triton: Optional[Impl] = None
    cpu_kernel: Optional[str] = None
    backward: Optional[Callable] = None
    setup_context: Optional[Callable] = None
    decomposes_in_fbgemm: bool = False
    limits: Dict[str, Limit] = dataclasses.field(default_factory=dict)
    contract: Optional[Callable[..., None]] = None
    fbgemm_fixup: Optional[Callable[[Impl, tuple], object]] = None
    detail: Optional[Callable[[str, str], str]] = None

    def validate(self) -> None:
        """Reject a spec that cannot be registered (ValueError naming the field)."""
        if (self.backward is None) != (self.setup_context is None):
            raise ValueError(f"op {self.name!r}: give both backward and setup_context, or neither")
        for backend in self.limits:
            if backend not in ("triton", "cpu_kernel"):
                raise ValueError(f"op {self.name!r}: limits[{backend!r}]: only the triton and "
                                 "cpu_kernel backends may cover part of an op's cases")
