"""Triton kernels for jagged <-> padded dense conversion (one jagged dim, values [T, D])."""

from __future__ import annotations

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
    v = values.contiguous().reshape(values.shape[0], -1)
    d = v.shape[1]
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
    x = dense.contiguous().reshape(b, n, -1)
    d = x.shape[2]
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
