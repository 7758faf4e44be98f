"""The elementwise part of an HSTU layer, fused on CPU (``csrc/hstu_layer.cpp``), as autograd
functions with the torch code as the fallback (other devices, float64 / float16, extension not
built): same semantics, fewer passes over memory.

* :func:`silu_split`: ``u, v, q, k = split(silu(h))`` as four contiguous tensors in one pass (no
  silu tensor; the attention's q, k, v need no copies);
* :func:`norm_gate`: ``dropout(u * LayerNorm(attn))`` (affine-free, eps 1e-6, statistics in fp32)
  in one pass, in ``u``'s dtype;
* :func:`dropout`: ``x * mask / (1 - p)``;
* :func:`layer_norm`: the affine-free LayerNorm (eps 1e-6) of fp32 rows written in the compute
  dtype -- under bf16 autocast the pre-norm of the fp32 residual stream and its cast to bf16 in one
  pass each way (forward: no fp32 normalised tensor then a cast; backward: no cast of the bf16
  gradient to fp32 before LayerNorm's backward);
* :func:`pre_norm`: :func:`layer_norm` plus ``x`` itself for the layer's residual, through one
  autograd node, so that the backward adds the residual's gradient to LayerNorm's in LayerNorm's
  own pass (not a separate ``dx += ...`` over ``[T, D]`` fp32 by the autograd engine);
* :func:`residual_add`: ``x + o + bias``, the fp32 residual plus the output projection (bias
  kept in fp32, not rounded into a bf16 GEMM), in one pass; its backward casts the gradient for
  the bf16 projection and sums it for the bias in one pass.

Dropout masks come from a counter-based hash of a seed and the element's index (the backward
regenerates them); the seed is drawn from torch's default generator, so ``torch.manual_seed``
makes runs repeat, as with ``torch.nn.functional.dropout`` (whose masks they do not reproduce:
same distribution, another stream).  The fallback computes the same hash with torch integer ops,
so the masks do not depend on the device either.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ..ops import extension

__all__ = ["silu_split", "norm_gate", "dropout", "input_rows", "layer_norm", "pre_norm", "residual_add",
           "fused_available"]

_EPS = 1e-6
_DTYPES = (torch.float32, torch.bfloat16)


def fused_available(*tensors: torch.Tensor) -> bool:
    """Whether the fused CPU kernels take these tensors (CPU, fp32 / bf16, extension built)."""
    return (extension.kernel("hstu_norm_gate") is not None
            and all(t.device.type == "cpu" and t.dtype in _DTYPES for t in tensors))


def _seed() -> int:
    return int(torch.randint(0, 2 ** 62, (1,)).item())


_M32 = 0xFFFFFFFF


def _mask_factor(rows: int, cols: int, p: float, seed: int, device, dtype) -> torch.Tensor:
    """``[rows, cols]`` of 0 or ``1 / (1 - p)``: the kernels' mask (csrc/hstu_layer_kernels.h
    ``layer_mask_hash``: murmur3's finalizer over (seed, row-major index)) in torch integer ops."""
    idx = torch.arange(rows * cols, device=device, dtype=torch.int64).view(rows, cols)
    x = ((idx & _M32) * 0x9E3779B1 & _M32) ^ (((idx >> 32) * 0x85EBCA77) & _M32)
    x = (x + (seed & _M32)) & _M32
    x = x ^ ((((seed >> 32) & _M32) * 0xC2B2AE3D) & _M32)
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _M32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _M32
    x = x ^ (x >> 16)
    threshold = min(int(p * 4294967296.0), _M32)
    return (x >= threshold).to(dtype) * (1.0 / (1.0 - p))


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
    seed = _seed() if p > 0 else 0
    if not fused_available(attn, u):
        a = F.layer_norm(attn.float() if attn.dtype in (torch.float16, torch.bfloat16) else attn,
                         (attn.shape[1],), eps=_EPS)
        y = u * a
        if p > 0:
            y = y * _mask_factor(y.shape[0], y.shape[1], p, seed, y.device, y.dtype)
        return y.to(u.dtype)
    return _NormGate.apply(attn, u, p, seed)


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
    if x.dim() != 2:
        raise ValueError(f"x: expected [T, D], got {tuple(x.shape)}")
    seed = _seed()
    if not fused_available(x):
        return x * _mask_factor(x.shape[0], x.shape[1], float(p), seed, x.device, x.dtype)
    return _Dropout.apply(x, float(p), seed)


class _InputRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, table: torch.Tensor, positions: torch.Tensor, scale: float,
                p: float, seed: int):
        ctx.save_for_backward(positions)
        ctx.rows, ctx.scale, ctx.p, ctx.seed = table.shape[0], scale, p, seed
        return extension.kernel("hstu_input_rows")(x, table, positions, scale, p, seed)

    @staticmethod
    def backward(ctx, dy):
        (positions,) = ctx.saved_tensors
        dx, dtable = extension.kernel("hstu_input_rows_bwd")(dy.contiguous(), positions, ctx.rows,
                                                              ctx.scale, ctx.p, ctx.seed)
        return dx, dtable, None, None, None, None


def input_rows(x: torch.Tensor, table: torch.Tensor, positions: torch.Tensor, scale: float,
               p: float, training: bool) -> torch.Tensor:
    """``dropout_p(table[positions] + scale * x)`` (dropout only when ``training``): ``x [T, D]``,
    ``table [N, D]`` (rows looked up by ``positions [T]``, int64).  fp32 on the CPU: one kernel
    pass each way, the same mask as :func:`dropout` on the sum (the embedding lookup, the sum and
    the dropout were three passes forward, three backward); else those torch ops."""
    if x.dim() != 2:
        raise ValueError(f"x: expected [T, D], got {tuple(x.shape)}")
    p = float(p) if training else 0.0
    if not (fused_available(x, table) and x.dtype == torch.float32 and table.dtype == torch.float32):
        return dropout(torch.add(F.embedding(positions, table), x, alpha=scale), p, p > 0)
    seed = _seed() if p > 0 else 0
    return _InputRows.apply(x, table, positions, float(scale), p, seed)


class _PreNorm(torch.autograd.Function):
    """(LayerNorm(x) in dtype, x): the backward's dx = LayerNorm's + the second output's gradient,
    one kernel pass."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dtype: torch.dtype):
        y, mean, rstd = extension.kernel("hstu_ln_cast")(x, dtype)
        ctx.save_for_backward(x, mean, rstd)
        ctx.set_materialize_grads(False)
        return y, x.view_as(x)

    @staticmethod
    def backward(ctx, dy, dskip):
        x, mean, rstd = ctx.saved_tensors
        if dy is None:  # only the residual was used
            return dskip, None
        add = dskip.float().contiguous() if dskip is not None else None
        return extension.kernel("hstu_ln_cast_bwd")(dy.contiguous(), x, mean, rstd, add), None


def pre_norm(x: torch.Tensor, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(layer_norm(x, dtype), x)``: a pre-norm layer's two uses of its input ``x [T, D]`` -- the
    normalised rows and the residual -- through one autograd node where the fused kernels take
    ``x`` (its backward adds the residual's gradient inside LayerNorm's pass); elsewhere
    ``(layer_norm(x, dtype), x)`` as they are."""
    if x.dim() != 2:
        raise ValueError(f"x: expected [T, D], got {tuple(x.shape)}")
    if x.dtype == torch.float32 and dtype in _DTYPES and fused_available(x):
        return _PreNorm.apply(x, dtype)
    widened = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return F.layer_norm(widened, (x.shape[1],), eps=_EPS).to(dtype), x


def layer_norm(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``LayerNorm(x)`` over the last dimension (no affine, eps 1e-6), statistics in fp32 (half
    inputs are widened first), the result in ``dtype``; ``x``: ``[T, D]``."""
    return pre_norm(x, dtype)[0]


class _ResidualAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, o: torch.Tensor, bias: Optional[torch.Tensor]):
        ctx.o_dtype = o.dtype
        ctx.has_bias = bias is not None
        return extension.kernel("hstu_residual_add")(x, o, bias)

    @staticmethod
    def backward(ctx, dy):
        want_o = ctx.needs_input_grad[1]
        want_b = ctx.has_bias and ctx.needs_input_grad[2]
        if want_o and want_b and ctx.o_dtype != dy.dtype:
            do, db = extension.kernel("hstu_cast_colsum")(dy, ctx.o_dtype)
            return dy, do, db
        do = dy.to(ctx.o_dtype) if want_o else None
        db = dy.sum(0) if want_b else None
        return dy, do, db


def residual_add(x: torch.Tensor, o: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x + (o + bias)`` in ``x``'s dtype: ``x [T, D]`` the residual stream, ``o [T, D]`` a
    projection's output (bf16 under autocast), ``bias [D]`` or None."""
    if x.shape != o.shape or x.dim() != 2:
        raise ValueError(f"x, o: expected equal [T, D] shapes, got {tuple(x.shape)} and {tuple(o.shape)}")
    if (x.dtype == torch.float32 and (bias is None or bias.dtype == torch.float32)
            and fused_available(x, o, *([bias] if bias is not None else []))):
        return _ResidualAdd.apply(x, o, bias)
    return x + (o + bias if bias is not None else o)
