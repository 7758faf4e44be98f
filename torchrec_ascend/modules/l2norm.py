"""Row-wise L2 normalisation with a short backward.

``l2_normalize(x, eps)`` is ``x / max(||x_row||, eps)`` -- ``torch.nn.functional.normalize``'s
value and gradient -- as one autograd function: forward = the row norms and one scaling pass;
backward = ``(dy - y <dy, y>) / max(||x||, eps)`` in two passes (rows whose norm is at or under
``eps`` were divided by the constant ``eps``: ``dy / eps``).  Autograd's backward of the division
by the expanded norm takes ~6 passes over ``[rows, D]``: one thread, 2-core Xeon, ``[2350, 512]``
fp32, forward + backward 5.2-9.3 ms (``F.normalize``) vs 2.2-2.8 ms.  fp32 rows on the CPU go
through the extension's row kernels (``csrc/rows.cpp``): each way one pass, a row reread from L1
(``[3064, 512]``, cold caches: forward 1.1-1.25 -> 0.8-0.9 ms, backward ~1.3 ms); other dtypes
and devices through the torch code below.  The retrieval encoder's
output and the sampled softmax's query / positive / negative rows use it; ``scale`` multiplies in
the same pass (the softmax's ``1 / temperature`` on the query rows: no pass of its own either way).
"""

from __future__ import annotations

import math

import torch

from ..ops import extension

__all__ = ["l2_normalize", "l2_normalized_dot"]


def _row_kernels(x: torch.Tensor) -> bool:
    """Whether the extension's one-pass row kernels take ``x`` (fp32 on the CPU)."""
    return (x.device.type == "cpu" and x.dtype == torch.float32
            and extension.kernel("l2_normalize_rows") is not None)


class _L2Normalize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, eps: float, scale: float) -> torch.Tensor:  # type: ignore[override]
        ctx.scale = scale
        ctx.kernel = _row_kernels(x)
        if ctx.kernel:  # csrc/rows.cpp: the norms and the scaling in one pass
            y, inv, clamped = extension.kernel("l2_normalize_rows")(
                x.reshape(math.prod(x.shape[:-1]), x.shape[-1]), eps, scale)
            ctx.save_for_backward(y, inv, clamped)
            return y.view(x.shape)
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        clamped = norm <= eps
        inv = norm.clamp_(min=eps).reciprocal_()
        if scale != 1.0:
            inv.mul_(scale)
        y = x * inv
        ctx.save_for_backward(y, inv, clamped)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):  # type: ignore[override]
        # y = s x / ||x||: dx = (s / ||x||) (dy - y <dy, y> / s^2); a clamped row: dx = s dy / eps
        y, inv, clamped = ctx.saved_tensors
        if ctx.kernel:
            dx = extension.kernel("l2_normalize_rows_bwd")(dy.reshape(y.shape), y, inv, clamped, ctx.scale)
            return dx.view(dy.shape), None, None
        s = torch.linalg.vecdot(dy, y).unsqueeze(-1).masked_fill_(clamped, 0.0)
        if ctx.scale != 1.0:
            s.mul_(1.0 / (ctx.scale * ctx.scale))
        return torch.addcmul(dy, y, s, value=-1.0).mul_(inv), None, None


def l2_normalize(x: torch.Tensor, eps: float = 1e-12, scale: float = 1.0) -> torch.Tensor:
    """``x`` with every row (last dimension) divided by ``max(its L2 norm, eps)``, times ``scale``
    (in the same pass: ``x * (scale / max(||x||, eps))``; e.g. a softmax temperature's ``1 / tau``)."""
    if x.dim() == 0:
        raise ValueError("x: expected at least one dimension")
    if not math.isfinite(scale) or scale == 0.0:
        raise ValueError(f"scale: expected a finite non-zero number, got {scale}")
    return _L2Normalize.apply(x, float(eps), float(scale))


class _L2NormalizedDot(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:  # type: ignore[override]
        out, inv, clamped = extension.kernel("l2_dot_rows")(q, x, eps)
        ctx.save_for_backward(q, x, out, inv, clamped)
        return out

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        q, x, out, inv, clamped = ctx.saved_tensors
        dq, dx = extension.kernel("l2_dot_rows_bwd")(g.contiguous(), q, x, out, inv, clamped)
        return dq, dx, None


def l2_normalized_dot(q: torch.Tensor, x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """``torch.linalg.vecdot(q, l2_normalize(x, eps))`` of ``[N, D]`` rows (value and gradient):
    each row of ``q`` dotted with the row of ``x`` divided by ``max(its norm, eps)`` (the sampled
    softmax's positive logits).  fp32 on the CPU: one kernel pass forward (no normalised rows
    written, no product tensor), one backward (``csrc/rows.cpp``); else those two functions."""
    if q.dim() != 2 or q.shape != x.shape:
        raise ValueError(f"q, x: expected two [N, D] tensors of one shape, got {tuple(q.shape)} and "
                         f"{tuple(x.shape)}")
    if (_row_kernels(q) and _row_kernels(x) and extension.kernel("l2_dot_rows") is not None):
        return _L2NormalizedDot.apply(q, x, float(eps))
    return torch.linalg.vecdot(q, l2_normalize(x, eps))
