"""Jagged tensor ops: the public entry points (validation + dispatch through the registry).

A jagged batch is ``values [T, *inner]`` plus offsets.  The conversions and the elementwise ops
take any number ``J`` of jagged dimensions (``offsets`` a list of ``J`` tensors, the dense form
``[B, N_0, ..., N_{J-1}, *inner]``; see :mod:`.reference.jagged`); the others take one
(``offsets [B + 1]``: sequence ``b`` is ``values[offsets[b]:offsets[b + 1]]``).  The ops are
registered by :mod:`.specs.jagged`.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch

from . import validation
from .specs import jagged as _specs
from .specs.jagged import OP_NAMES  # noqa: F401  (the family, for tests)

__all__ = [
    "jagged_to_padded_dense",
    "dense_to_jagged",
    "jagged_1d_to_dense",
    "jagged_2d_to_dense",
    "stacked_jagged_2d_to_dense",
    "jagged_dense_elementwise_add",
    "jagged_dense_elementwise_add_jagged_output",
    "jagged_dense_elementwise_mul",
    "jagged_dense_dense_elementwise_add_jagged_output",
    "jagged_softmax",
    "jagged_jagged_bmm",
    "jagged_dense_bmm",
    "batched_dense_vec_jagged_2d_mul",
    "jagged_index_select",
    "jagged_slice",
]

_specs.register_all()
_ops = torch.ops.torchrec_ascend
OffsetsLike = Union[torch.Tensor, Sequence[torch.Tensor]]


def _offsets_list(offsets: OffsetsLike, arg: str = "offsets") -> List[torch.Tensor]:
    """A list of offsets tensors (a bare tensor is one jagged dimension)."""
    if isinstance(offsets, torch.Tensor):
        return [offsets]
    if not isinstance(offsets, (list, tuple)):
        raise ValueError(f"{arg}: expected a tensor or a list of tensors (one per jagged "
                         f"dimension), got {type(offsets).__name__}")
    return list(offsets)


def _max_lengths(name: str, max_lengths: Union[int, Sequence[int]], n: int) -> List[int]:
    ml = [max_lengths] if isinstance(max_lengths, int) else list(max_lengths)
    ml = [int(m) for m in ml]
    validation.check_max_lengths(name, ml, n)
    return ml


def jagged_to_padded_dense(
    values: torch.Tensor,
    offsets: OffsetsLike,
    max_lengths: Union[int, Sequence[int]],
    padding_value: float = 0.0,
    validate: bool = True,
) -> torch.Tensor:
    """Pad a jagged tensor to ``[B, N_0, ..., N_{J-1}, *inner]`` (a sequence longer than ``N_d``
    keeps its first ``N_d`` items, as in fbgemm).  Differentiable w.r.t. ``values``.

    Args:
        values: ``[T, *inner]`` values of all sequences, back to back.
        offsets: ``[B + 1]`` int32/int64 offsets, or a list of ``J`` of them (jagged dimension
            ``d`` has ``offsets[d - 1][-1] + 1`` entries).
        max_lengths: padded length per jagged dimension (an int for one dimension).
        padding_value: value of the padding slots.
        validate: check offsets' values (costs a device sync on npu/cuda).
    """
    offs = _offsets_list(offsets)
    validation.check_tensor("values", values, min_dim=1)
    validation.check_jagged_offsets("offsets", offs, values.shape[0], validate)
    validation.check_same_device(values=values, offsets=offs[0])
    ml = _max_lengths("max_lengths", max_lengths, len(offs))
    return _ops.jagged_to_padded_dense_forward(values, offs, ml, float(padding_value))


def dense_to_jagged(
    dense: torch.Tensor,
    offsets: OffsetsLike,
    total_L: Optional[int] = None,
    validate: bool = True,
) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """Gather the valid slots of ``dense [B, N_0, ..., N_{J-1}, *inner]`` into jagged values
    ``[total_L, *inner]`` (rows the dense form truncated are zero).  Returns
    ``(values, offsets)`` like fbgemm.  Differentiable w.r.t. ``dense``."""
    offs = _offsets_list(offsets)
    validation.check_tensor("dense", dense, min_dim=1 + len(offs))
    validation.check_jagged_offsets("offsets", offs, None, validate)
    validation.check_same_device(dense=dense, offsets=offs[0])
    if offs[0].numel() - 1 != dense.shape[0]:
        raise ValueError(
            f"offsets: has {offs[0].numel() - 1} sequences but dense has batch size {dense.shape[0]}"
        )
    if total_L is not None:
        total_L = validation.check_nonneg_int("total_L", total_L)
    return _ops.dense_to_jagged_forward(dense, offs, total_L), offs


def _jagged_input(values_name: str, values: torch.Tensor, offsets_name: str,
                  offsets: OffsetsLike, validate: bool) -> List[torch.Tensor]:
    """A jagged operand: ``values [T, ...]`` (any dtype, as fbgemm) and offsets ending exactly
    at ``T``."""
    offs = _offsets_list(offsets, offsets_name)
    validation.check_tensor(values_name, values, min_dim=1)
    validation.check_jagged_offsets(offsets_name, offs, values.shape[0], validate, exact=True,
                                    values_name=values_name)
    validation.check_same_device(**{values_name: values, offsets_name: offs[0]})
    return offs


def _check_dense(name: str, y: torch.Tensor, x_values: torch.Tensor,
                 offsets: Sequence[torch.Tensor]) -> None:
    """Dense partner ``[B, N_0, ..., N_{J-1}, *inner]`` of a jagged ``[T, *inner]``."""
    j = len(offsets)
    b = offsets[0].numel() - 1
    validation.check_tensor(name, y, dim=x_values.dim() + j)
    validation.check_same_dtype(x_values=x_values, **{name: y})
    validation.check_same_device(x_values=x_values, **{name: y})
    if y.shape[0] != b or tuple(y.shape[1 + j:]) != tuple(x_values.shape[1:]):
        inner = ", ".join(map(str, x_values.shape[1:]))
        jagged = ", ".join(f"N_{d}" for d in range(j))
        raise ValueError(f"{name}: expected shape [B={b}, {jagged}, {inner}] matching x_values "
                         f"and {j} jagged dimension(s), got {tuple(y.shape)}")


def jagged_1d_to_dense(values: torch.Tensor, offsets: torch.Tensor, max_sequence_length: int,
                       padding_value: int = 0, validate: bool = True) -> torch.Tensor:
    """Pad 1-D jagged ``values [T]`` to ``[B, max_sequence_length]`` with ``padding_value``."""
    validation.check_tensor("values", values, dim=1)
    validation.check_offsets("offsets", offsets, values.shape[0], validate)
    validation.check_same_device(values=values, offsets=offsets)
    validation.check_nonneg_int("max_sequence_length", max_sequence_length)
    return _ops.jagged_1d_to_dense(values, offsets, max_sequence_length, int(padding_value))


def jagged_2d_to_dense(values: torch.Tensor, offsets: torch.Tensor, max_sequence_length: int,
                       validate: bool = True) -> torch.Tensor:
    """Pad 2-D jagged ``values [T, D]`` to ``[B, max_sequence_length, D]`` with zeros."""
    validation.check_tensor("values", values, dim=2)
    validation.check_offsets("offsets", offsets, values.shape[0], validate)
    validation.check_same_device(values=values, offsets=offsets)
    validation.check_nonneg_int("max_sequence_length", max_sequence_length)
    return _ops.jagged_2d_to_dense(values, offsets, max_sequence_length)


def stacked_jagged_2d_to_dense(
    values: torch.Tensor, lengths: torch.Tensor, offset_per_key: Sequence[int],
    max_lengths_per_key: Sequence[int], padding_value: int = 0, validate: bool = True,
) -> List[torch.Tensor]:
    """Pad each key of a keyed jagged batch: key ``k`` owns rows
    ``offset_per_key[k]:offset_per_key[k+1]`` of ``values [T, D]`` with lengths ``lengths[k]``
    (``lengths [K, B]``); returns ``K`` tensors ``[B, max_lengths_per_key[k], D]``."""
    validation.check_tensor("values", values, dim=2, dtypes=validation.FLOAT_DTYPES)
    validation.check_tensor("lengths", lengths, dim=2, dtypes=validation.INDEX_DTYPES)
    validation.check_same_device(values=values, lengths=lengths)
    k = lengths.shape[0]
    offset_per_key = [int(o) for o in offset_per_key]
    max_lengths_per_key = [int(m) for m in max_lengths_per_key]
    if len(offset_per_key) != k + 1:
        raise ValueError(f"offset_per_key: expected K + 1 = {k + 1} entries, got {len(offset_per_key)}")
    validation.check_max_lengths("max_lengths_per_key", max_lengths_per_key, k)
    if offset_per_key[0] != 0 or any(b < a for a, b in zip(offset_per_key, offset_per_key[1:])) \
            or offset_per_key[-1] > values.shape[0]:
        raise ValueError(f"offset_per_key: must start at 0, be non-decreasing and end <= "
                         f"{values.shape[0]} (rows of values), got {offset_per_key}")
    if validate:
        validation.check_lengths("lengths", lengths.reshape(-1), None, True)
        sums = lengths.sum(1).tolist()
        spans = [b - a for a, b in zip(offset_per_key, offset_per_key[1:])]
        if sums != spans:
            raise ValueError(f"lengths: per-key sums {sums} must equal the spans of "
                             f"offset_per_key {spans}")
    return _ops.stacked_jagged_2d_to_dense(values, lengths, offset_per_key, max_lengths_per_key,
                                           int(padding_value))


def _jagged_dense(op: str, x_values: torch.Tensor, x_offsets: OffsetsLike, y: torch.Tensor,
                  validate: bool):
    """The elementwise ops of a jagged x and a dense y: check both, call ``op``."""
    offs = _jagged_input("x_values", x_values, "x_offsets", x_offsets, validate)
    _check_dense("y", y, x_values, offs)
    return getattr(_ops, op)(x_values, offs, y)


def jagged_dense_elementwise_add(x_values: torch.Tensor, x_offsets: OffsetsLike, y: torch.Tensor,
                                 validate: bool = True) -> torch.Tensor:
    """Dense ``y [B, N_0, ..., *inner]`` plus the jagged x padded with zeros (x truncated to y's
    shape).  ``x_offsets``: a tensor or a list of ``J`` (any number of jagged dimensions)."""
    return _jagged_dense("jagged_dense_elementwise_add", x_values, x_offsets, y, validate)


def jagged_dense_elementwise_add_jagged_output(
    x_values: torch.Tensor, x_offsets: OffsetsLike, y: torch.Tensor, validate: bool = True,
) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """Jagged ``x + y`` at x's positions (y counts as 0 past its shape): ``(values, offsets)``."""
    return _jagged_dense("jagged_dense_elementwise_add_jagged_output", x_values, x_offsets, y,
                         validate)


def jagged_dense_elementwise_mul(
    x_values: torch.Tensor, x_offsets: OffsetsLike, y: torch.Tensor, validate: bool = True,
) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """Jagged ``x * y`` at x's positions (0 past y's shape): ``(values, offsets)``."""
    return _jagged_dense("jagged_dense_elementwise_mul", x_values, x_offsets, y, validate)


def jagged_dense_dense_elementwise_add_jagged_output(
    x_values: torch.Tensor, x_offsets: OffsetsLike, y_0: torch.Tensor, y_1: torch.Tensor,
    validate: bool = True,
) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """Jagged ``x + y_0 + y_1`` at x's positions: ``(values, offsets)``."""
    offs = _jagged_input("x_values", x_values, "x_offsets", x_offsets, validate)
    _check_dense("y_0", y_0, x_values, offs)
    _check_dense("y_1", y_1, x_values, offs)
    return _ops.jagged_dense_dense_elementwise_add_jagged_output(x_values, offs, y_0, y_1)


def jagged_softmax(values: torch.Tensor, x_offsets: torch.Tensor, max_L: int,
                   validate: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """Softmax over each sequence (its first ``max_L`` rows), per column of ``values [T, D]``;
    rows past ``max_L`` are 0, and so is their gradient (on every backend: fbgemm's kernels leave
    them uninitialised, the registry zeroes them where fbgemm serves the op; the raw
    ``torch.ops.fbgemm.jagged_softmax*`` ops keep fbgemm's behaviour).  Returns
    ``(output, x_offsets)``."""
    validation.check_jagged("values", values, "x_offsets", x_offsets, validate, dim=2)
    validation.check_nonneg_int("max_L", max_L)
    return tuple(_ops.jagged_softmax(values, x_offsets, max_L))


def jagged_jagged_bmm(x_values: torch.Tensor, y_values: torch.Tensor, x_offsets: torch.Tensor,
                      max_L: int, validate: bool = True) -> torch.Tensor:
    """``out[b] = x_b^T @ y_b`` over each sequence's first ``max_L`` rows: ``[B, M, N]`` from
    jagged ``x [T, M]`` and ``y [T, N]`` sharing ``x_offsets``."""
    validation.check_jagged("x_values", x_values, "x_offsets", x_offsets, validate, dim=2)
    validation.check_tensor("y_values", y_values, dim=2)
    validation.check_same_dtype(x_values=x_values, y_values=y_values)
    validation.check_same_device(x_values=x_values, y_values=y_values)
    if y_values.shape[0] != x_values.shape[0]:
        raise ValueError(f"y_values: has {y_values.shape[0]} rows, x_values has "
                         f"{x_values.shape[0]}; they share x_offsets so must match")
    validation.check_nonneg_int("max_L", max_L)
    return _ops.jagged_jagged_bmm(x_values, y_values, x_offsets, max_L)


def jagged_dense_bmm(x_values: torch.Tensor, x_offsets: torch.Tensor, y: torch.Tensor, max_L: int,
                     validate: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """``out_b = x_b @ y[b]`` for jagged ``x [T, K]`` and dense ``y [B, K, N]`` (rows past
    ``max_L`` are 0).  Returns ``(out [T, N], x_offsets)``."""
    validation.check_jagged("x_values", x_values, "x_offsets", x_offsets, validate, dim=2)
    validation.check_tensor("y", y, dim=3)
    validation.check_same_dtype(x_values=x_values, y=y)
    validation.check_same_device(x_values=x_values, y=y)
    b = x_offsets.numel() - 1
    if y.shape[0] != b or y.shape[1] != x_values.shape[1]:
        raise ValueError(f"y: expected shape [B={b}, K={x_values.shape[1]}, N], got {tuple(y.shape)}")
    validation.check_nonneg_int("max_L", max_L)
    return _ops.jagged_dense_bmm(x_values, x_offsets, y, max_L)


def batched_dense_vec_jagged_2d_mul(v: torch.Tensor, a_values: torch.Tensor,
                                    a_offsets: torch.Tensor, validate: bool = True) -> torch.Tensor:
    """``out[b*H + h] = v[b*H + h, :L_b] @ a_b[:, h*D:(h+1)*D]``: ``v [B*H, N]``, jagged
    ``a [T, H*D]`` (truncated to N rows per sequence) -> ``[B*H, D]``."""
    validation.check_jagged("a_values", a_values, "a_offsets", a_offsets, validate, dim=2)
    validation.check_tensor("v", v, dim=2)
    validation.check_same_dtype(v=v, a_values=a_values)
    validation.check_same_device(v=v, a_values=a_values)
    b = a_offsets.numel() - 1
    if b == 0:
        if v.shape[0] != 0:
            raise ValueError(f"v: has {v.shape[0]} rows but the batch is empty")
    else:
        if v.shape[0] % b:
            raise ValueError(f"v: rows ({v.shape[0]}) must be a multiple of B={b} (B*H)")
        h = v.shape[0] // b
        if h == 0 or a_values.shape[1] % h:
            raise ValueError(f"a_values: width {a_values.shape[1]} must be a multiple of the "
                             f"H={h} heads implied by v [B*H, N]")
    return _ops.batched_dense_vec_jagged_2d_mul(v, a_values, a_offsets)


def jagged_index_select(values: torch.Tensor, lengths: torch.Tensor, indices: torch.Tensor,
                        num_dense_output_rows: Optional[int] = None,
                        validate: bool = True) -> List[torch.Tensor]:
    """Sequences ``indices`` of the jagged batch (``values [T, ...]``, ``lengths [B]``):
    ``[values, lengths]`` of the selection.  ``num_dense_output_rows`` (their total rows) saves a
    device sync when given."""
    validation.check_tensor("values", values, min_dim=1)
    validation.check_lengths("lengths", lengths, values.shape[0], validate)
    validation.check_tensor("indices", indices, dim=1, dtypes=validation.INDEX_DTYPES)
    validation.check_same_device(values=values, lengths=lengths, indices=indices)
    if validate and indices.numel():
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= lengths.numel():
            raise ValueError(f"indices: must lie in [0, {lengths.numel()}), got range [{lo}, {hi}]")
    if num_dense_output_rows is not None:
        validation.check_nonneg_int("num_dense_output_rows", num_dense_output_rows)
        if validate:
            rows = int(lengths.index_select(0, indices.to(torch.int64)).sum())
            if rows != num_dense_output_rows:
                raise ValueError(f"num_dense_output_rows: is {num_dense_output_rows}, but the "
                                 f"selected sequences have {rows} rows")
    return _ops.jagged_index_select(values, lengths, indices, num_dense_output_rows)


def jagged_slice(x_values: torch.Tensor, x_lengths: torch.Tensor, start: torch.Tensor,
                 slice_length: int, validate: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rows ``[start_b, start_b + slice_length)`` of each sequence, clipped at its end:
    ``(values, lengths)``.  ``0 <= start_b <= length_b``."""
    validation.check_tensor("x_values", x_values, min_dim=1)
    validation.check_lengths("x_lengths", x_lengths, x_values.shape[0], validate)
    validation.check_tensor("start", start, dim=1, dtypes=validation.INDEX_DTYPES)
    validation.check_same_device(x_values=x_values, x_lengths=x_lengths, start=start)
    if start.numel() != x_lengths.numel():
        raise ValueError(f"start: has {start.numel()} entries, x_lengths has {x_lengths.numel()}")
    validation.check_nonneg_int("slice_length", slice_length)
    if validate and start.numel():
        bad = (start < 0) | (start > x_lengths)
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0, 0])
            raise ValueError(f"start: must satisfy 0 <= start[b] <= x_lengths[b], but "
                             f"start[{i}]={int(start[i])}, x_lengths[{i}]={int(x_lengths[i])}")
    return _ops.jagged_slice(x_values, x_lengths, start, slice_length)
