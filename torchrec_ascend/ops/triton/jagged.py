"""Triton kernels of the jagged family (one jagged dim, values [T, D]): jagged <-> padded dense,
jagged softmax (forward, backward), jagged_jagged_bmm and jagged_dense_bmm forwards (their
backwards are made of the two forwards, see ops/jagged.py)."""

from __future__ import annotations

import math
import os
from typing import List, Optional

import torch
import triton
import triton.language as tl


@triton.jit
def _jagged_to_dense_kernel(
    values_ptr, offsets_ptr, out_ptr, N, D, pad,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    nb = tl.program_id(1)
    start = tl.load(offsets_ptr + b)
    length = tl.load(offsets_ptr + b + 1) - start
    rows = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    valid = rows < length
    for d0 in range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        col_ok = cols < D
        src = values_ptr + (start + rows)[:, None].to(tl.int64) * D + cols[None, :]
        x = tl.load(src, mask=valid[:, None] & col_ok[None, :], other=pad)
        dst = out_ptr + (b * N + rows)[:, None].to(tl.int64) * D + cols[None, :]
        tl.store(dst, x, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _dense_to_jagged_kernel(
    dense_ptr, offsets_ptr, out_ptr, N, D,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    nb = tl.program_id(1)
    start = tl.load(offsets_ptr + b)
    length = tl.load(offsets_ptr + b + 1) - start
    rows = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    in_seq = rows < length
    from_dense = in_seq & (rows < N)
    for d0 in range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        col_ok = cols < D
        src = dense_ptr + (b * N + rows)[:, None].to(tl.int64) * D + cols[None, :]
        x = tl.load(src, mask=from_dense[:, None] & col_ok[None, :], other=0.0)
        dst = out_ptr + (start + rows)[:, None].to(tl.int64) * D + cols[None, :]
        tl.store(dst, x, mask=in_seq[:, None] & col_ok[None, :])


def _block_d(d: int) -> int:
    return min(128, triton.next_power_of_2(max(d, 1)))


def jagged_to_padded_dense_forward(
    values: torch.Tensor, offsets: List[torch.Tensor], max_lengths: List[int],
    padding_value: float = 0.0,
) -> torch.Tensor:
    off = offsets[0].contiguous()
    b, n = off.numel() - 1, int(max_lengths[0])
    inner = tuple(values.shape[1:])
    d = math.prod(inner)
    v = values.contiguous().reshape(values.shape[0], d)  # explicit width: T may be 0
    out = torch.empty((b, n, d), dtype=values.dtype, device=values.device)
    if b and n and d:
        block_n = 16
        grid = (b, triton.cdiv(n, block_n))
        _jagged_to_dense_kernel[grid](v, off, out, n, d, padding_value,
                                      BLOCK_N=block_n, BLOCK_D=_block_d(d))
    return out.reshape((b, n) + inner)


def dense_to_jagged_forward(
    dense: torch.Tensor, offsets: List[torch.Tensor], total_L: Optional[int] = None
) -> torch.Tensor:
    off = offsets[0].contiguous()
    b, n = off.numel() - 1, dense.shape[1]
    total = int(off[-1]) if total_L is None else int(total_L)
    inner = tuple(dense.shape[2:])
    d = math.prod(inner)
    x = dense.contiguous().reshape(b, n, d)  # explicit width: B * N may be 0
    out = torch.zeros((total, d), dtype=dense.dtype, device=dense.device)
    lengths = off[1:] - off[:-1]
    max_len = int(lengths.max()) if b else 0
    if b and max_len and d:
        block_n = 16
        grid = (b, triton.cdiv(max_len, block_n))
        _dense_to_jagged_kernel[grid](x, off, out, n, d, BLOCK_N=block_n, BLOCK_D=_block_d(d))
    return out.reshape((total,) + inner)


def jagged_to_padded_dense_backward(
    grad_output: torch.Tensor, offsets: List[torch.Tensor], total_L: int
) -> torch.Tensor:
    return dense_to_jagged_forward(grad_output, offsets, total_L)


# --------------------------------------------------------------------------- jagged softmax
# One program per (sequence, block of columns), one row per step: an online max/sum pass over
# the first min(length, max_L) rows, then a pass writing every row of the sequence (0 past
# max_L).  Elementwise only (no tl.max / tl.sum): each column is its own softmax.


@triton.jit
def _softmax_fwd_kernel(x_ptr, offsets_ptr, out_ptr, D, max_L, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_ok = cols < D
    start = tl.load(offsets_ptr + b).to(tl.int64)
    full = tl.load(offsets_ptr + b + 1).to(tl.int64) - start
    n = tl.minimum(full, max_L)
    m = tl.full([BLOCK_D], float("-inf"), tl.float32)
    s = tl.full([BLOCK_D], 0.0, tl.float32)
    for r in range(0, n):
        x = tl.load(x_ptr + (start + r) * D + cols, mask=col_ok, other=0.0).to(tl.float32)
        m_new = tl.maximum(m, x)
        s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
        m = m_new
    s = tl.where(s == 0.0, 1.0, s)
    for r in range(0, full):
        ptrs = (start + r) * D + cols
        x = tl.load(x_ptr + ptrs, mask=col_ok, other=0.0).to(tl.float32)
        y = tl.exp(x - m) / s
        y = tl.where(r < n, y, 0.0)
        tl.store(out_ptr + ptrs, y.to(out_ptr.dtype.element_ty), mask=col_ok)


@triton.jit
def _softmax_bwd_kernel(g_ptr, y_ptr, offsets_ptr, out_ptr, D, max_L, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_ok = cols < D
    start = tl.load(offsets_ptr + b).to(tl.int64)
    full = tl.load(offsets_ptr + b + 1).to(tl.int64) - start
    n = tl.minimum(full, max_L)
    acc = tl.full([BLOCK_D], 0.0, tl.float32)
    for r in range(0, n):
        ptrs = (start + r) * D + cols
        g = tl.load(g_ptr + ptrs, mask=col_ok, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + ptrs, mask=col_ok, other=0.0).to(tl.float32)
        acc += g * y
    for r in range(0, full):
        ptrs = (start + r) * D + cols
        g = tl.load(g_ptr + ptrs, mask=col_ok, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + ptrs, mask=col_ok, other=0.0).to(tl.float32)
        gx = tl.where(r < n, y * (g - acc), 0.0)
        tl.store(out_ptr + ptrs, gx.to(out_ptr.dtype.element_ty), mask=col_ok)


def _softmax_launch(kernel, first: torch.Tensor, second: Optional[torch.Tensor],
                    x_offsets: torch.Tensor, max_L: int) -> torch.Tensor:
    t, d = first.shape
    b = x_offsets.numel() - 1
    out = torch.zeros((t, d), dtype=first.dtype, device=first.device)  # rows past offsets[-1]
    if b and d:
        block_d = min(64, triton.next_power_of_2(d))
        grid = (b, triton.cdiv(d, block_d))
        args = (first.contiguous(),) + ((second.contiguous(),) if second is not None else ())
        kernel[grid](*args, x_offsets.contiguous(), out, d, int(max_L), BLOCK_D=block_d)
    return out


def jagged_softmax_forward(values: torch.Tensor, x_offsets: torch.Tensor, max_L: int) -> torch.Tensor:
    return _softmax_launch(_softmax_fwd_kernel, values, None, x_offsets, max_L)


def jagged_softmax_backward(grad_output: torch.Tensor, output: torch.Tensor,
                            x_offsets: torch.Tensor, max_L: int) -> torch.Tensor:
    return _softmax_launch(_softmax_bwd_kernel, grad_output, output, x_offsets, max_L)


# --------------------------------------------------------------------------- jagged GEMMs
# fp32 accumulation (tl.dot, IEEE precision for fp32 inputs); tiles of at least 16 (tl.dot).


@triton.jit
def _jagged_jagged_bmm_kernel(x_ptr, y_ptr, offsets_ptr, out_ptr, M, N, max_L,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                              IEEE: tl.constexpr):
    """out[b, m, n] = sum_k x[start + k, m] * y[start + k, n], k < min(length, max_L)."""
    b = tl.program_id(0)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    start = tl.load(offsets_ptr + b).to(tl.int64)
    n_rows = tl.minimum(tl.load(offsets_ptr + b + 1).to(tl.int64) - start, max_L)
    acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
    for k0 in range(0, n_rows, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < n_rows
        xt = tl.load(x_ptr + (start + rk)[None, :] * M + rm[:, None],
                     mask=k_ok[None, :] & (rm < M)[:, None], other=0.0)
        yb = tl.load(y_ptr + (start + rk)[:, None] * N + rn[None, :],
                     mask=k_ok[:, None] & (rn < N)[None, :], other=0.0)
        if IEEE:  # fp32 inputs, or half inputs upcast (see _ieee)
            acc += tl.dot(xt.to(tl.float32), yb.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(xt, yb)
    ptrs = out_ptr + b.to(tl.int64) * M * N + rm[:, None] * N + rn[None, :]
    tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rm < M)[:, None] & (rn < N)[None, :])


@triton.jit
def _jagged_dense_bmm_kernel(x_ptr, offsets_ptr, y_ptr, out_ptr, K, N, max_L,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             IEEE: tl.constexpr):
    """out[start + i, n] = sum_k x[start + i, k] * y[b, k, n] for i < min(length, max_L)."""
    b = tl.program_id(0)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    start = tl.load(offsets_ptr + b).to(tl.int64)
    n_rows = tl.minimum(tl.load(offsets_ptr + b + 1).to(tl.int64) - start, max_L)
    row_ok = rm < n_rows
    if tl.program_id(1) * BLOCK_M < n_rows:
        acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            xb = tl.load(x_ptr + (start + rm)[:, None] * K + rk[None, :],
                         mask=row_ok[:, None] & (rk < K)[None, :], other=0.0)
            yb = tl.load(y_ptr + b.to(tl.int64) * K * N + rk[:, None] * N + rn[None, :],
                         mask=(rk < K)[:, None] & (rn < N)[None, :], other=0.0)
            if IEEE:  # fp32 inputs, or half inputs upcast (see _ieee)
                acc += tl.dot(xb.to(tl.float32), yb.to(tl.float32), input_precision="ieee")
            else:
                acc += tl.dot(xb, yb)
        ptrs = out_ptr + (start + rm)[:, None] * N + rn[None, :]
        tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & (rn < N)[None, :])


def _ieee(dtype: torch.dtype) -> bool:
    """Exact fp32 products: for fp32 inputs always (no TF32), for half inputs only under
    ``TRITON_INTERPRET=1``, whose bf16 ``tl.dot`` returns garbage; on devices half inputs go to
    the tensor cores with fp32 accumulation."""
    return dtype == torch.float32 or os.environ.get("TRITON_INTERPRET", "") == "1"


def _tile(n: int) -> int:
    return max(16, min(64, triton.next_power_of_2(max(n, 1))))


def jagged_jagged_bmm_forward(x_values: torch.Tensor, y_values: torch.Tensor,
                              x_offsets: torch.Tensor, max_L: int) -> torch.Tensor:
    b = x_offsets.numel() - 1
    m, n = x_values.shape[1], y_values.shape[1]
    out = torch.zeros((b, m, n), dtype=x_values.dtype, device=x_values.device)
    if b and m and n and max_L > 0:
        bm, bn = _tile(m), _tile(n)
        grid = (b, triton.cdiv(m, bm), triton.cdiv(n, bn))
        _jagged_jagged_bmm_kernel[grid](
            x_values.contiguous(), y_values.contiguous(), x_offsets.contiguous(), out, m, n,
            int(max_L), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=32, IEEE=_ieee(x_values.dtype))
    return out


def jagged_dense_bmm_forward(x_values: torch.Tensor, x_offsets: torch.Tensor, y: torch.Tensor,
                             max_L: int) -> torch.Tensor:
    b = x_offsets.numel() - 1
    k, n = y.shape[1], y.shape[2]
    # zero-filled: rows past max_L (and past offsets[-1]) stay 0
    out = torch.zeros((x_values.shape[0], n), dtype=x_values.dtype, device=x_values.device)
    if b and n and max_L > 0:
        bm, bn = 32, _tile(n)
        grid = (b, triton.cdiv(int(max_L), bm), triton.cdiv(n, bn))
        _jagged_dense_bmm_kernel[grid](
            x_values.contiguous(), x_offsets.contiguous(), y.contiguous(), out, k, n, int(max_L),
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=_tile(k), IEEE=_ieee(x_values.dtype))
    return out
