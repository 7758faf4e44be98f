"""Jagged tensor ops: public entry points (validation + dispatch) and their registry specs.

A jagged batch is ``values [T, *inner]`` plus ``offsets [B + 1]`` (one jagged dimension):
sequence ``b`` is ``values[offsets[b]:offsets[b + 1]]``.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch

from . import _checks
from ._util import triton_impl
from .reference import jagged as ref
from .registry import OpSpec, register

__all__ = ["jagged_to_padded_dense", "dense_to_jagged"]

_ops = torch.ops.torchrec_ascend
OffsetsLike = Union[torch.Tensor, Sequence[torch.Tensor]]


# --------------------------------------------------------------------------- specs


def _j2d_fake(values, offsets, max_lengths, padding_value=0.0):
    return values.new_empty((offsets[0].shape[0] - 1, max_lengths[0]) + tuple(values.shape[1:]))


def _j2d_setup(ctx, inputs, output):
    values, offsets, _, _ = inputs
    ctx.offsets = offsets
    ctx.total_L = values.shape[0]


def _j2d_backward(ctx, grad):
    grad_values = _ops.jagged_to_padded_dense_backward(grad, ctx.offsets, ctx.total_L)
    return grad_values, [None] * len(ctx.offsets), None, None


def _j2d_bwd_fake(grad_output, offsets, total_L):
    return grad_output.new_empty((total_L,) + tuple(grad_output.shape[2:]))


def _d2j_fake(dense, offsets, total_L=None):
    if total_L is None:
        total_L = torch.library.get_ctx().new_dynamic_size()
    return dense.new_empty((total_L,) + tuple(dense.shape[2:]))


def _d2j_setup(ctx, inputs, output):
    dense, offsets, _ = inputs
    ctx.offsets = offsets
    ctx.max_len = dense.shape[1]


def _d2j_backward(ctx, grad):
    grad_dense = _ops.jagged_to_padded_dense_forward(grad, ctx.offsets, [ctx.max_len], 0.0)
    return grad_dense, [None] * len(ctx.offsets), None


register(OpSpec(
    name="jagged_to_padded_dense_forward",
    schema="(Tensor values, Tensor[] offsets, SymInt[] max_lengths, float padding_value=0.) -> Tensor",
    reference=ref.jagged_to_padded_dense_forward,
    triton=triton_impl("jagged", "jagged_to_padded_dense_forward"),
    cpu_kernel="jagged_to_padded_dense_forward",
    fake=_j2d_fake,
    backward=_j2d_backward,
    setup_context=_j2d_setup,
    fbgemm=True,
    fbgemm_ascend=True,
))

register(OpSpec(
    name="jagged_to_padded_dense_backward",
    schema="(Tensor grad_output, Tensor[] offsets, SymInt total_L) -> Tensor",
    reference=ref.jagged_to_padded_dense_backward,
    triton=triton_impl("jagged", "jagged_to_padded_dense_backward"),
    cpu_kernel="jagged_to_padded_dense_backward",
    fake=_j2d_bwd_fake,
    fbgemm=True,
    fbgemm_ascend=True,
))

register(OpSpec(
    name="dense_to_jagged_forward",
    schema="(Tensor dense, Tensor[] x_offsets, SymInt? total_L=None) -> Tensor",
    reference=ref.dense_to_jagged_forward,
    triton=triton_impl("jagged", "dense_to_jagged_forward"),
    cpu_kernel="dense_to_jagged_forward",
    fake=_d2j_fake,
    backward=_d2j_backward,
    setup_context=_d2j_setup,
    fbgemm=True,
    fbgemm_ascend=True,
))


# --------------------------------------------------------------------------- public API


def _offsets_list(offsets: OffsetsLike, arg: str = "offsets") -> List[torch.Tensor]:
    if isinstance(offsets, torch.Tensor):
        return [offsets]
    offsets = list(offsets)
    if len(offsets) != 1:
        raise ValueError(f"{arg}: exactly one jagged dimension is supported, got {len(offsets)}")
    return offsets


def jagged_to_padded_dense(
    values: torch.Tensor,
    offsets: OffsetsLike,
    max_lengths: Union[int, Sequence[int]],
    padding_value: float = 0.0,
    validate: bool = True,
) -> torch.Tensor:
    """Pad a jagged batch to ``[B, max_length, *inner]`` (sequences longer than ``max_length``
    keep their first ``max_length`` items, as in fbgemm).  Differentiable w.r.t. ``values``.

    Args:
        values: ``[T, *inner]`` values of all sequences, back to back.
        offsets: ``[B + 1]`` int32/int64 offsets (or a one-element list of them).
        max_lengths: padded length (int, or a one-element list).
        padding_value: value of the padding slots.
        validate: check offsets' values (costs a device sync on npu/cuda).
    """
    offs = _offsets_list(offsets)
    _checks.check_tensor("values", values, min_dim=1)
    _checks.check_offsets("offsets", offs[0], values.shape[0], validate)
    _checks.check_same_device(values=values, offsets=offs[0])
    max_lengths = [int(max_lengths)] if isinstance(max_lengths, int) else [int(m) for m in max_lengths]
    _checks.check_max_lengths("max_lengths", max_lengths, 1)
    return _ops.jagged_to_padded_dense_forward(values, offs, max_lengths, float(padding_value))


def dense_to_jagged(
    dense: torch.Tensor,
    offsets: OffsetsLike,
    total_L: Optional[int] = None,
    validate: bool = True,
) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """Gather the valid rows of ``dense [B, N, *inner]`` into jagged values ``[total_L, *inner]``
    (positions ``>= N`` of a longer sequence are zero).  Returns ``(values, [offsets])`` like
    fbgemm.  Differentiable w.r.t. ``dense``."""
    offs = _offsets_list(offsets)
    _checks.check_tensor("dense", dense, min_dim=2)
    _checks.check_offsets("offsets", offs[0], None, validate)
    _checks.check_same_device(dense=dense, offsets=offs[0])
    if offs[0].numel() - 1 != dense.shape[0]:
        raise ValueError(
            f"offsets: has {offs[0].numel() - 1} sequences but dense has batch size {dense.shape[0]}"
        )
    if total_L is not None and int(total_L) < 0:
        raise ValueError(f"total_L: must be >= 0, got {total_L}")
    return _ops.dense_to_jagged_forward(dense, offs, total_L), offs
