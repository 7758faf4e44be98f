"""Torch-composite jagged <-> dense conversions (one jagged dimension)."""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch


def single_offsets(offsets: List[torch.Tensor], arg: str = "offsets") -> torch.Tensor:
    """The offsets tensor of the (single) jagged dimension; more than one is not supported."""
    if len(offsets) != 1:
        raise ValueError(
            f"{arg}: torchrec_ascend supports exactly one jagged dimension, got {len(offsets)}"
        )
    return offsets[0]


def padded_index(offsets: torch.Tensor, max_len: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(mask [B, max_len] of valid slots, flat value index of each valid slot, row-major).

    Sequences longer than ``max_len`` keep their first ``max_len`` items (fbgemm semantics).
    """
    lengths = offsets[1:] - offsets[:-1]
    pos = torch.arange(max_len, device=offsets.device, dtype=offsets.dtype)
    mask = pos.unsqueeze(0) < lengths.unsqueeze(1)
    src = (offsets[:-1].unsqueeze(1) + pos.unsqueeze(0))[mask]
    return mask, src


def jagged_to_padded_dense_forward(
    values: torch.Tensor,
    offsets: List[torch.Tensor],
    max_lengths: List[int],
    padding_value: float = 0.0,
) -> torch.Tensor:
    """values [T, *inner] + offsets [B+1] -> dense [B, max_len, *inner]."""
    off = single_offsets(offsets)
    n = int(max_lengths[0])
    b = off.numel() - 1
    out = values.new_full((b, n) + tuple(values.shape[1:]), padding_value)
    mask, src = padded_index(off, n)
    out[mask] = values.index_select(0, src)
    return out


def dense_to_jagged_forward(
    dense: torch.Tensor, offsets: List[torch.Tensor], total_L: Optional[int] = None
) -> torch.Tensor:
    """dense [B, N, *inner] + offsets -> values [total_L, *inner] (rows past N are zero)."""
    off = single_offsets(offsets)
    total = int(off[-1]) if total_L is None else int(total_L)
    out = dense.new_zeros((total,) + tuple(dense.shape[2:]))
    mask, src = padded_index(off, dense.shape[1])
    out.index_copy_(0, src, dense[mask])
    return out


def jagged_to_padded_dense_backward(
    grad_output: torch.Tensor, offsets: List[torch.Tensor], total_L: int
) -> torch.Tensor:
    """Gradient of :func:`jagged_to_padded_dense_forward` w.r.t. values."""
    return dense_to_jagged_forward(grad_output, offsets, total_L)
