"""The elementwise part of an HSTU layer, fused on CPU (``csrc/hstu_layer.cpp``), as autograd
functions with the torch code as the fallback (other devices, float64 / float16, extension not
built): same semantics, fewer passes over memory.

* :func:`silu_split`: ``u, v, q, k = split(silu(h))`` as four contiguous tensors in one pass (no
  silu tensor; the attention's q, k, v need no copies);
* :func:`norm_gate`: ``dropout(u * LayerNorm(attn))`` (affine-free, eps 1e-6, statistics in fp32)
  in one pass, in ``u``'s dtype;
* :func:`dropout`: ``x * mask / (1 - p)``.

Dropout masks come from a counter-based hash of a seed and the element's index (the backward
regenerates them); the seed is drawn from torch's default generator, so ``torch.manual_seed``
makes runs repeat, as with ``torch.nn.functional.dropout`` (whose masks they do not reproduce:
same distribution, another stream).
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
import torch.nn.functional as F

from ..ops import extension

__all__ = ["silu_split", "norm_gate", "dropout", "fused_available"]

_EPS = 1e-6
_DTYPES = (torch.float32, torch.bfloat16)


def fused_available(*tensors: torch.Tensor) -> bool:
    """Whether the fused CPU kernels take these tensors (CPU, fp32 / bf16, extension built)."""
    return (extension.kernel("hstu_norm_gate") is not None
            and all(t.device.type == "cpu" and t.dtype in _DTYPES for t in tensors))


def _seed() -> int:
    return int(torch.randint(0, 2 ** 62, (1,)).item())


class _SiluSplit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, widths: List[int]):
        ctx.save_for_backward(h)
        ctx.widths = widths
        return tuple(extension.kernel("hstu_silu_split")(h, widths))

    @staticmethod
    def backward(ctx, *grads):
        (h,) = ctx.saved_tensors
        full = [g if g is not None else h.new_zeros(h.shape[0], w) for g, w in zip(grads, ctx.widths)]
        return extension.kernel("hstu_silu_split_bwd")(full, h), None


def silu_split(h: torch.Tensor, widths: Sequence[int]) -> Tuple[torch.Tensor, ...]:
    """``torch.split(silu(h), widths, dim=1)`` with every part contiguous.  ``h``: ``[T, sum(widths)]``."""
    widths = [int(w) for w in widths]
    if h.dim() != 2 or sum(widths) != h.shape[1]:
        raise ValueError(f"h: expected [T, {sum(widths)}] for widths {widths}, got {tuple(h.shape)}")
    if not fused_available(h):
        return tuple(p.contiguous() for p in torch.split(F.silu(h), widths, dim=1))
    return _SiluSplit.apply(h, widths)


class _NormGate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, attn: torch.Tensor, u: torch.Tensor, p: float, seed: int):
        y, mean, rstd = extension.kernel("hstu_norm_gate")(attn, u, p, seed)
        ctx.save_for_backward(attn, u, mean, rstd)
        ctx.p, ctx.seed = p, seed
        return y

    @staticmethod
    def backward(ctx, dy):
        attn, u, mean, rstd = ctx.saved_tensors
        da, du = extension.kernel("hstu_norm_gate_bwd")(dy.contiguous(), attn, u, mean, rstd, ctx.p, ctx.seed)
        return da, du, None, None


def norm_gate(attn: torch.Tensor, u: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``dropout_p(u * LayerNorm(attn))`` (dropout only when ``training``); ``attn``, ``u``:
    ``[T, D]``; the result has ``u``'s dtype."""
    if attn.shape != u.shape or attn.dim() != 2:
        raise ValueError(f"attn, u: expected equal [T, D] shapes, got {tuple(attn.shape)} and {tuple(u.shape)}")
    p = float(p) if training else 0.0
    if not fused_available(attn, u):
        a = F.layer_norm(attn.float() if attn.dtype in (torch.float16, torch.bfloat16) else attn,
                         (attn.shape[1],), eps=_EPS)
        return F.dropout(u * a, p, training=p > 0).to(u.dtype)
    return _NormGate.apply(attn, u, p, _seed() if p > 0 else 0)


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float, seed: int):
        ctx.p, ctx.seed = p, seed
        return extension.kernel("hstu_dropout")(x, p, seed)

    @staticmethod
    def backward(ctx, dy):
        return extension.kernel("hstu_dropout")(dy.contiguous(), ctx.p, ctx.seed), None, None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``x * mask / (1 - p)`` when ``training`` and ``p > 0``, else ``x``; ``x``: ``[T, D]``."""
    if not training or p <= 0:
        return x
    if x.dim() != 2 or not fused_available(x):
        return F.dropout(x, p, training=True)
    return _Dropout.apply(x, float(p), _seed())
