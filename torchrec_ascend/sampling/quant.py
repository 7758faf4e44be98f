"""Half-precision rows for the negative logits: storage format on CPU, fast path on npu/cuda.

:func:`quantize_rows` turns an fp32 ``[n, D]`` matrix into fp16/bf16 rows plus an optional
per-row **power-of-two** scale.  fp16 has a narrow range (max 65504, smallest normal 6.1e-5);
when a matrix's row maxima leave that range (large unnormalised embeddings, or tiny gradients of
a mean-reduced loss over 16k tokens) every row is scaled so its max magnitude lies in [0.5, 1).
Power-of-two scales multiply exactly, so scaling adds no rounding error of its own.  bf16 has
fp32's range and never needs a scale.

:func:`half_logits` computes ``a @ b.T`` from such rows with fp32 accumulation and fp32 output.
Where half-precision GEMM is fast -- npu, cuda, and CPUs where the dtype was *measured* faster
than fp32 (:func:`torchrec_ascend.device.gemm_dtype_is_fast`: AVX512-BF16 / AMX CPUs for bf16) --
it runs in half precision; elsewhere (AVX2 CPUs run half GEMM ~100x slower than fp32) the half
rows are widened to fp32 and multiplied in fp32: the
operands (what was rounded) are identical, only the arithmetic unit differs.  A half GEMM
accumulates in fp32; where the backend cannot return fp32 (``mm(out_dtype=...)`` exists on cuda
only) its output is rounded once to the half format and widened.  :class:`HalfLogits` is the autograd function the loss uses: forward
and backward GEMMs both take half-precision operands, gradients w.r.t. the fp32 inputs are
returned in fp32 (the rounding is treated as identity, i.e. a straight-through estimator).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F

from .. import device as _device
from ..modules.projection import transposed_copy

__all__ = [
    "HALF_DTYPES",
    "QuantizedRows",
    "resolve_half_dtype",
    "half_gemm_is_fast",
    "COMPUTE_MODES",
    "quantize_rows",
    "half_mm",
    "HalfLogits",
    "half_logits",
]

HALF_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}

# fp16 range with head-room: rows whose max magnitude is outside [2^-10, 2^12] get scaled.
_FP16_SAFE_LO = 2.0 ** -10
_FP16_SAFE_HI = 2.0 ** 12


def resolve_half_dtype(half_precision: Union[str, torch.dtype, None]) -> Optional[torch.dtype]:
    """``"fp16"`` / ``"bf16"`` / a torch dtype / ``None`` -> dtype or None; anything else is an error."""
    if half_precision is None:
        return None
    if isinstance(half_precision, torch.dtype):
        if half_precision not in HALF_DTYPES.values():
            raise ValueError(f"half_precision: dtype {half_precision} is not float16 or bfloat16")
        return half_precision
    if half_precision not in HALF_DTYPES:
        raise ValueError(f"half_precision: expected 'fp16', 'bf16' or None, got {half_precision!r}")
    return HALF_DTYPES[half_precision]


def half_gemm_is_fast(device: Union[str, torch.device], dtype: torch.dtype = torch.float16) -> bool:
    """Whether half-precision GEMM of ``dtype`` is a fast path on ``device``: the device's measured
    choice (:func:`torchrec_ascend.device.gemm_dtype_is_fast`): npu/cuda yes; cpu only where
    ``dtype`` has GEMM instructions (AVX512-BF16/AMX-BF16, AVX512-FP16/AMX-FP16) *and* was
    measured faster than fp32 on this machine.
    """
    return _device.gemm_dtype_is_fast(dtype, device)


COMPUTE_MODES = ("auto", "half", "fp32")


def _use_half_compute(compute: str, device: torch.device, dtype: torch.dtype) -> bool:
    if compute not in COMPUTE_MODES:
        raise ValueError(f"compute: expected one of {COMPUTE_MODES}, got {compute!r}")
    if compute == "auto":
        return half_gemm_is_fast(device, dtype)
    return compute == "half"


@dataclass
class QuantizedRows:
    """``data`` (fp16/bf16 ``[n, D]``) times ``scale`` (fp32 ``[n]``, power of two, or None)."""

    data: torch.Tensor
    scale: Optional[torch.Tensor]

    def dequantize(self) -> torch.Tensor:
        """The fp32 matrix these rows represent."""
        x = self.data.float()
        return x if self.scale is None else x * self.scale[:, None]

    def nbytes(self) -> int:
        """Bytes held (data + scales)."""
        n = self.data.numel() * self.data.element_size()
        return n + (0 if self.scale is None else self.scale.numel() * 4)


def quantize_rows(x: torch.Tensor, dtype: torch.dtype,
                  per_row_scale: Union[bool, str] = "auto") -> QuantizedRows:
    """Round fp32 rows ``x [n, D]`` to ``dtype`` with an optional per-row power-of-two scale.

    Args:
        x: ``[n, D]`` floating tensor (only the rows to be used: callers drop padding first).
        dtype: ``torch.float16`` or ``torch.bfloat16``.
        per_row_scale: ``True`` always scale, ``False`` never, ``"auto"`` scale (all rows) when
            the fp16 range demands it, i.e. some row's max magnitude is outside
            ``[2^-10, 2^12]``; bf16 never needs it under ``"auto"``.
    """
    if x.dim() != 2:
        raise ValueError(f"x: expected a 2-D tensor [n, D], got shape {tuple(x.shape)}")
    if dtype not in HALF_DTYPES.values():
        raise ValueError(f"dtype: expected torch.float16 or torch.bfloat16, got {dtype}")
    if per_row_scale not in (True, False, "auto"):
        raise ValueError(f"per_row_scale: expected True, False or 'auto', got {per_row_scale!r}")
    x = x.detach()
    if per_row_scale == "auto":
        if dtype == torch.bfloat16 or x.numel() == 0:
            per_row_scale = False
        else:
            amax = x.abs().amax(dim=1)
            nz = amax[amax > 0]
            per_row_scale = bool(nz.numel()) and bool(
                (nz.min() < _FP16_SAFE_LO) | (nz.max() > _FP16_SAFE_HI))
    if not per_row_scale:
        return QuantizedRows(x.to(dtype), None)
    amax = x.abs().amax(dim=1).float()
    # 2^e with amax / 2^e in [0.5, 1): frexp's exponent; zero rows keep scale 1.
    _, e = torch.frexp(torch.where(amax > 0, amax, torch.ones_like(amax)))
    scale = torch.ldexp(torch.ones_like(amax), e.to(torch.float32))
    return QuantizedRows((x.float() / scale[:, None]).to(dtype), scale)


_NO_OUT_DTYPE: set = set()  # device types whose mm has no fp32-output half GEMM


def _half_gemm(a: torch.Tensor, b: torch.Tensor, keep_half: bool = False) -> torch.Tensor:
    """``a @ b`` of half tensors, fp32 accumulation; fp32 output where the backend has it
    (``mm(..., out_dtype=float32)``, cuda), else the half output (one rounding) widened to fp32
    -- or, with ``keep_half``, as it is (no widening pass)."""
    kind = a.device.type
    if kind not in _NO_OUT_DTYPE:
        try:
            return torch.mm(a, b, out_dtype=torch.float32)
        except (RuntimeError, TypeError, NotImplementedError):
            _NO_OUT_DTYPE.add(kind)
    out = torch.mm(a, b)
    return out if keep_half else out.float()


def half_mm(a: QuantizedRows, b: QuantizedRows, transpose_b: bool = True,
            compute: str = "auto", keep_half: bool = False) -> torch.Tensor:
    """fp32 ``A @ B.T`` (or ``A @ B``) of quantized rows: half operands, fp32 accumulation.

    ``compute``: ``"half"`` runs a half-precision GEMM (see :func:`_half_gemm`),
    ``"fp32"`` widens the rows and multiplies in fp32 (same operands, exact fp32 products),
    ``"auto"`` picks ``"half"`` where :func:`half_gemm_is_fast`.
    Scales are applied to the fp32 product (row scale of ``a`` on rows; for ``transpose_b`` the
    row scale of ``b`` on columns, else ``b`` must be unscaled).  ``keep_half``: where the half
    GEMM's output is rounded to the half dtype anyway (no fp32-output GEMM) and nothing is
    scaled, return it in the half dtype (exactly the values the fp32 result would hold).
    """
    bd = b.data.t() if transpose_b else b.data
    if not transpose_b and b.scale is not None:
        raise ValueError("b: a row-scaled right operand needs transpose_b=True")
    if _use_half_compute(compute, a.data.device, a.data.dtype):
        out = _half_gemm(a.data, bd, keep_half=keep_half and a.scale is None and b.scale is None)
    else:
        out = torch.mm(a.data.float(), bd.float())
    if a.scale is not None:
        out = out * a.scale[:, None]
    if transpose_b and b.scale is not None:
        out = out * b.scale[None, :]
    return out


def _never_scales(dtype: torch.dtype, per_row_scale: Union[bool, str]) -> bool:
    """Whether :func:`quantize_rows` leaves every matrix unscaled (rounding is then elementwise)."""
    return per_row_scale is False or (per_row_scale == "auto" and dtype == torch.bfloat16)


def _padded(x: QuantizedRows, rows: int) -> QuantizedRows:
    """``x`` with zero rows (scale 1) appended up to ``rows``; only the new rows are written."""
    n = x.data.shape[0]
    if n == rows:
        return x
    data = x.data.new_empty((rows,) + tuple(x.data.shape[1:]))
    data[:n].copy_(x.data)
    data[n:].zero_()
    scale = None if x.scale is None else torch.cat([x.scale, x.scale.new_ones(rows - n)])
    return QuantizedRows(data, scale)


class HalfLogits(torch.autograd.Function):
    """``q @ n.T`` in half precision with fp32 accumulation; fp32 gradients for fp32 inputs
    (logits in fp32, or with ``half_out`` in the half dtype where the GEMM rounds to it anyway)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, n: torch.Tensor, dtype: torch.dtype,
                per_row_scale: Union[bool, str], compute: str, half_out: bool = False) -> torch.Tensor:
        # the query rows (their count changes every step) padded with zero rows where the half
        # GEMMs would otherwise be new shapes for the device's primitive cache
        # (device.gemm_row_multiple); padded after rounding (half the bytes, no fp32 copy)
        rows = q.shape[0]
        ctx.rows = rows
        padded = rows
        if _use_half_compute(compute, q.device, dtype):
            padded += -rows % _device.gemm_row_multiple(q.device, dtype)
        qq = _padded(quantize_rows(q, dtype, per_row_scale), padded)
        nq = quantize_rows(n, dtype, per_row_scale)
        ctx.dtype, ctx.per_row_scale, ctx.compute = dtype, per_row_scale, compute
        ctx.q_dtype, ctx.n_dtype = q.dtype, n.dtype
        # saved for backward in half precision: the memory this path saves
        ctx.save_for_backward(qq.data, nq.data,
                              *(s if s is not None else torch.empty(0) for s in (qq.scale, nq.scale)))
        ctx.has_scale = (qq.scale is not None, nq.scale is not None)
        return half_mm(qq, nq, compute=compute, keep_half=half_out)[:rows]

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        qd, nd, qs, ns = ctx.saved_tensors
        qq = QuantizedRows(qd, qs if ctx.has_scale[0] else None)
        nq = QuantizedRows(nd, ns if ctx.has_scale[1] else None)
        padded, rows = qd.shape[0], ctx.rows
        unscaled = (_never_scales(ctx.dtype, ctx.per_row_scale) and qq.scale is None
                    and nq.scale is None)
        # a gradient already in the half dtype (half_out) is what rounding it would give
        if not (unscaled and grad.dtype == ctx.dtype):
            grad = grad.float()
        gq_out = gn_out = gq = None
        if ctx.needs_input_grad[0] or unscaled:
            # dQ = G @ N_deq = (G * sn) @ Nd: fold n's column scales into G, then quantize G rows
            g = grad if nq.scale is None else grad * nq.scale[None, :]
            gq = _padded(quantize_rows(g, ctx.dtype, ctx.per_row_scale), padded)
        if ctx.needs_input_grad[0]:
            gq_out = half_mm(gq, QuantizedRows(nq.data, None), transpose_b=False,
                             compute=ctx.compute)[:rows].to(ctx.q_dtype)
        if ctx.needs_input_grad[1]:
            # dN = G.T @ Q_deq = (G.T * sq) @ Qd
            if unscaled:  # G.T's rounded rows are G's transposed
                gtq = QuantizedRows(transposed_copy(gq.data), None)
            else:
                gt = grad.t() if qq.scale is None else grad.t() * qq.scale[None, :rows]
                gtq = quantize_rows(gt.contiguous(), ctx.dtype, ctx.per_row_scale)
                gtq = QuantizedRows(F.pad(gtq.data, (0, padded - rows)), gtq.scale)
            gn_out = half_mm(gtq, QuantizedRows(qq.data, None), transpose_b=False,
                             compute=ctx.compute).to(ctx.n_dtype)
        return gq_out, gn_out, None, None, None, None


def half_logits(q: torch.Tensor, n: torch.Tensor, dtype: torch.dtype,
                per_row_scale: Union[bool, str] = "auto", compute: str = "auto",
                half_out: bool = False) -> torch.Tensor:
    """fp32 logits ``q [T, D] @ n [R, D].T`` from half-precision operands (autograd-aware).

    ``compute``: ``"auto"`` (half GEMM where fast, else fp32 on the widened rows), ``"half"``,
    ``"fp32"``.  ``half_out``: where the half GEMM has no fp32 output (the CPU) and no row is
    scaled, the logits in ``dtype`` -- the same values, without the widening pass (for a consumer
    that reads half rows, e.g. :func:`torchrec_ascend.modules.logsumexp.logsumexp_rows`); its
    gradient may then arrive in ``dtype`` too.
    """
    _use_half_compute(compute, q.device, dtype)  # validates ``compute``
    return HalfLogits.apply(q, n, dtype, per_row_scale, compute, bool(half_out))
