"""Whole-batch row padding that keeps the CPU's half-precision GEMM shapes few.

A jagged batch's token count ``T`` changes every step, so on the CPU in bf16 each step's
``[T, D] @ [D, N]`` products (the UVQK and output projections, forward and backward) would be new
shapes, and oneDNN builds a primitive for every new shape (:data:`torchrec_ascend.device.
GEMM_ROW_MULTIPLE` says what that costs).  :func:`pad_jagged` appends padding rows -- as sequences
of their own, so no real token attends to them or they to it -- until ``T`` is a multiple of
:func:`row_multiple`; the shapes then repeat from step to step and the primitive cache serves
them.  The cost: the padding rows' work, under ``multiple / 2`` rows per step on average.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ..device import gemm_row_multiple
from .projection import compute_dtype

__all__ = ["row_multiple", "PaddedBatch", "pad_jagged", "real_rows"]


def row_multiple(x: torch.Tensor) -> int:
    """The multiple a batch of rows ``x`` is padded to: that of the dtype its GEMMs run in (the
    autocast dtype under autocast, else ``x``'s) on ``x``'s device."""
    return gemm_row_multiple(x.device.type, compute_dtype(x))


class PaddedBatch(NamedTuple):
    """A jagged batch with padding rows appended; ``rows``: the real ones (``x[:rows]``)."""

    x: torch.Tensor
    offsets: torch.Tensor
    timestamps: Optional[torch.Tensor]
    num_targets: Optional[torch.Tensor]
    rows: int


def pad_jagged(x: torch.Tensor, offsets: torch.Tensor, timestamps: Optional[torch.Tensor],
               num_targets: Optional[torch.Tensor], multiple: int, max_seq_len: int) -> PaddedBatch:
    """``x [T, D]`` and its jagged metadata with zero rows appended up to the next multiple of
    ``multiple``, as sequences of at most ``max_seq_len`` rows (timestamps: the last real one,
    num_targets: 0).  Unchanged where ``T`` is already a multiple."""
    rows = x.shape[0]
    pad = -rows % max(int(multiple), 1)
    if pad == 0:
        return PaddedBatch(x, offsets, timestamps, num_targets, rows)
    lens = [max_seq_len] * (pad // max_seq_len) + ([pad % max_seq_len] if pad % max_seq_len else [])
    ends = (torch.tensor(lens, device=offsets.device).cumsum(0) + offsets[-1]).to(offsets.dtype)
    x = torch.cat([x, x.new_zeros(pad, x.shape[1])])
    offsets = torch.cat([offsets, ends])
    if timestamps is not None:
        last = timestamps[-1:] if rows else timestamps.new_zeros(1)
        timestamps = torch.cat([timestamps, last.expand(pad)])
    if num_targets is not None:
        num_targets = torch.cat([num_targets, num_targets.new_zeros(len(lens))])
    return PaddedBatch(x, offsets, timestamps, num_targets, rows)


class _RealRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, rows: int) -> torch.Tensor:  # type: ignore[override]
        ctx.padded = x.shape[0]
        return x[:rows]

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        rows = g.shape[0]
        dx = g.new_empty((ctx.padded,) + tuple(g.shape[1:]))
        dx[:rows].copy_(g)
        dx[rows:].zero_()
        return dx, None


def real_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x[:rows]``: a padded batch's real rows (a view).  Its gradient is written once: the
    gradient's rows, then zeros for the padding rows (autograd's backward of the slice fills all
    of ``x``'s shape with zeros and then copies the gradient in: two passes)."""
    if rows == x.shape[0]:
        return x
    return _RealRows.apply(x, rows)
