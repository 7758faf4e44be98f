"""``x @ w`` whose weight gradient runs on a contiguous ``x^T`` where that is faster.

The weight gradient of ``h = x @ w`` is ``x^T @ dh``: autograd's ``mm`` backward multiplies the
transposed *view* of ``x`` (or computes ``(dh^T @ x)^T``).  On the CPU in bf16 / fp16, oneDNN runs
that GEMM at about half its rate with a contiguous left operand (one thread, 2-core Xeon with AMX,
``x [2399, 512]``, ``dh [2399, 2048]``: 9.3 ms on the view, 5.1 ms copying ``x^T`` first, the copy
included; ``[700, 512]``: 2.9 -> 1.5 ms), while in fp32 and on accelerators (whose GEMMs take
transposed operands as they are) the copy buys nothing.  :func:`project` makes the copy exactly
there (with :func:`transposed_copy`, a blocked transpose: torch's strided copy of a bf16
``[2432, 512]`` took twice as long); the product and both gradients are otherwise autograd's.

The weight gradient is written in ``w``'s own layout: for ``w`` a transposed view (``nn.Linear``'s
``weight.t()``) it is ``(dh^T @ x)^T``, so the gradient reaching the ``[N, D]`` parameter is
contiguous and ``AccumulateGrad`` keeps it instead of copying it into the parameter's layout (a
strided fp32 ``[512, 512]`` copy: 0.3-0.9 ms per layer in the paper-config step, Xeon with AMX).

Under ``torch.autocast`` the operands are cast to the autocast dtype first (as autocast's own
``mm`` would: the casts are differentiable, so ``w``'s gradient arrives in ``w``'s dtype).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..ops import extension

__all__ = ["project", "compute_dtype", "contiguous_transpose_helps", "transposed_copy"]

_HALF = (torch.bfloat16, torch.float16)


def contiguous_transpose_helps(x: torch.Tensor) -> bool:
    """Whether the weight gradient should copy ``x^T`` contiguous first: half precision on the
    CPU (module docstring)."""
    return x.device.type == "cpu" and x.dtype in _HALF


def transposed_copy(x: torch.Tensor) -> torch.Tensor:
    """``x.t().contiguous()`` of a 2-D tensor: on the CPU the extension's blocked transpose
    (csrc/hstu_layer.cpp ``hstu_transpose``; torch's strided copy of a bf16 ``[2432, 512]`` takes
    0.76-0.89 ms on the Xeon with AMX, the kernel 0.34 ms), elsewhere torch's."""
    kernel = extension.kernel("hstu_transpose") if x.device.type == "cpu" else None
    if kernel is None or x.element_size() not in (2, 4):
        return x.t().contiguous()
    return kernel(x)


class _Project(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx, dh: torch.Tensor) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:  # type: ignore[override]
        x, w = ctx.saved_tensors
        dx = dh @ w.t() if ctx.needs_input_grad[0] else None
        dw = None
        if ctx.needs_input_grad[1]:
            dw = _weight_gradient(x, dh, transposed=_is_transposed_view(w))
        return dx, dw


def _is_transposed_view(w: torch.Tensor) -> bool:
    """``w [D, N]`` stored as a contiguous ``[N, D]`` (a ``.t()`` view), not plain contiguous."""
    return w.shape[0] > 1 and w.shape[1] > 1 and w.stride() == (1, w.shape[0])


def _weight_gradient(x: torch.Tensor, dh: torch.Tensor, transposed: bool) -> torch.Tensor:
    """``x^T @ dh``, as a contiguous ``[D, N]`` or (``transposed``) as the ``.t()`` view of a
    contiguous ``[N, D]``; the GEMM's left operand is copied contiguous where that helps."""
    left, right = (dh, x) if transposed else (x, dh)
    lt = transposed_copy(left) if contiguous_transpose_helps(left) else left.t()
    product = lt @ right
    return product.t() if transposed else product


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a product with ``x`` runs in: the autocast dtype of ``x``'s device under
    autocast, else ``x``'s own."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def project(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x [T, D] @ w [D, N]`` (in the autocast dtype under autocast); gradients as autograd's
    ``mm``, the weight's computed on a contiguous ``x^T`` where that is faster."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f"project: expected x [T, D] and w [D, N], got {tuple(x.shape)} and "
                         f"{tuple(w.shape)}")
    if torch.is_autocast_enabled(x.device.type):
        dtype = compute_dtype(x)
        x, w = x.to(dtype), w.to(dtype)
    elif x.dtype != w.dtype:
        raise ValueError(f"project: x is {x.dtype}, w is {w.dtype} (outside autocast they must "
                         "agree)")
    return _Project.apply(x, w)
