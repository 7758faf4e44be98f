"""Sparse-feature ops on TorchRec's training path: public entry points and registry specs.

A keyed sparse batch (TorchRec's KeyedJaggedTensor) is ``lengths [T * B]`` (or ``[T, B]``) plus
``values``/``indices`` (and optional per-value ``weights``): feature ``t``, sample ``b`` owns
``lengths[t * B + b]`` consecutive values.  Each public function validates its arguments (values
are read only with ``validate=True``, the default: that costs a device sync on npu/cuda) and then
dispatches ``torch.ops.torchrec_ascend.<op>`` through the registry; the op schemas are fbgemm's.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from . import _checks
from .reference import sparse as ref
from .registry import OpSpec, register

__all__ = [
    "asynchronous_complete_cumsum",
    "asynchronous_exclusive_cumsum",
    "asynchronous_inclusive_cumsum",
    "permute_2D_sparse_data",
    "permute_1D_sparse_data",
    "block_bucketize_sparse_features",
    "invert_permute",
    "expand_into_jagged_permute",
    "bounds_check_indices",
    "BoundsCheckMode",
    "segment_sum_csr",
    "keyed_jagged_index_select_dim1",
    "offsets_range",
    "permute_pooled_embs",
    "permute_pooled_embs_auto_grad",
    "permute_pooled_embs_auto_grad_split",
]

_ops = torch.ops.torchrec_ascend


def _cumsum_fake(t_in):
    return t_in.new_empty(t_in.shape)


def _complete_cumsum_fake(t_in):
    return t_in.new_empty(tuple(t_in.shape[:-1]) + (t_in.shape[-1] + 1,))


register(OpSpec(
    name="asynchronous_complete_cumsum",
    schema="(Tensor t_in) -> Tensor",
    reference=ref.asynchronous_complete_cumsum,
    cpu_kernel="asynchronous_complete_cumsum_rows",  # 1-D and 2-D (csrc/sparse.cpp)
    fake=_complete_cumsum_fake,
    fbgemm=True,
    fbgemm_ascend=True,
))
register(OpSpec(
    name="asynchronous_exclusive_cumsum",
    schema="(Tensor t_in) -> Tensor",
    reference=ref.asynchronous_exclusive_cumsum,
    cpu_kernel="asynchronous_exclusive_cumsum",
    fake=_cumsum_fake,
    fbgemm=True,
    fbgemm_ascend=True,
))
register(OpSpec(
    name="asynchronous_inclusive_cumsum",
    schema="(Tensor t_in) -> Tensor",
    reference=ref.asynchronous_inclusive_cumsum,
    cpu_kernel="asynchronous_inclusive_cumsum",
    fake=_cumsum_fake,
    fbgemm=True,
    fbgemm_ascend=True,
))


def _check_counts(t_in: torch.Tensor, max_dim: int) -> None:
    _checks.check_tensor("t_in", t_in, dtypes=_checks.INDEX_DTYPES)
    if not 1 <= t_in.dim() <= max_dim:
        raise ValueError(f"t_in: expected 1..{max_dim} dims, got shape {tuple(t_in.shape)}")


def asynchronous_complete_cumsum(t_in: torch.Tensor) -> torch.Tensor:
    """``[0, cumsum(t_in)]`` along the last dim: lengths -> offsets (1-D or 2-D int input)."""
    _check_counts(t_in, 2)
    return _ops.asynchronous_complete_cumsum(t_in)


def asynchronous_exclusive_cumsum(t_in: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix sum of a 1-D int tensor (``cumsum - t_in``)."""
    _check_counts(t_in, 1)
    return _ops.asynchronous_exclusive_cumsum(t_in)


def asynchronous_inclusive_cumsum(t_in: torch.Tensor) -> torch.Tensor:
    """Inclusive prefix sum of a 1-D int tensor, in its dtype."""
    _check_counts(t_in, 1)
    return _ops.asynchronous_inclusive_cumsum(t_in)


# =========================================================================== training-path ops
# --------------------------------------------------------------------------- fake kernels


def _dyn(size: Optional[int]):
    return torch.library.get_ctx().new_dynamic_size() if size is None else size


def _permute_2d_fake(permute, lengths, values, weights=None, permuted_lengths_sum=None):
    n = _dyn(permuted_lengths_sum)
    out_w = None if weights is None else weights.new_empty((n,) + tuple(weights.shape[1:]))
    return (lengths.new_empty((permute.shape[0],) + tuple(lengths.shape[1:])),
            values.new_empty((n,) + tuple(values.shape[1:])), out_w)


def _permute_1d_fake(permute, lengths, values, weights=None, permuted_lengths_sum=None):
    n = _dyn(permuted_lengths_sum)
    out_w = None if weights is None else weights.new_empty((n,) + tuple(weights.shape[1:]))
    return lengths.new_empty(permute.shape), values.new_empty((n,) + tuple(values.shape[1:])), out_w


def _bbsf_fake(lengths, indices, bucketize_pos, sequence, block_sizes, my_size, weights=None,
               batch_size_per_feature=None, max_B=-1, block_bucketize_pos=None,
               keep_orig_idx=False, total_num_blocks=None, keep_orig_idx_per_feature=None):
    return (lengths.new_empty((lengths.shape[0] * my_size,)),
            indices.new_empty(indices.shape),
            None if weights is None else weights.new_empty(weights.shape),
            indices.new_empty(indices.shape) if bucketize_pos else None,
            indices.new_empty(indices.shape) if sequence else None)


def _invert_permute_fake(permute):
    return permute.new_empty(permute.shape)


def _expand_fake(permute, input_offset, output_offset, output_size):
    return input_offset.new_empty((output_size,))


def _bounds_check_fake(rows_per_table, indices, offsets, bounds_check_mode, warning, weights=None,
                       B_offsets=None, max_B=-1, b_t_map=None, info_B_num_bits=-1,
                       info_B_mask=-1, bounds_check_version=1, prefetch_pipeline=False):
    return None


def _segment_sum_fake(batch_size, csr_seg, values):
    return values.new_empty((csr_seg.shape[0] - 1,))


def _kjt_select_fake(values, lengths, offsets, indices, batch_size, weights=None,
                     selected_lengths_sum=None):
    n = _dyn(selected_lengths_sum)
    out = [values.new_empty((n,) + tuple(values.shape[1:])),
           lengths.new_empty((lengths.shape[0] // batch_size * indices.shape[0],))]
    if weights is not None:
        out.append(weights.new_empty((n,) + tuple(weights.shape[1:])))
    return out


def _offsets_range_fake(offsets, range_size):
    return offsets.new_empty((range_size,))


def _pooled_fake(pooled_embs, offset_dim_list, permute_list, inv_offset_dim_list, inv_permute_list):
    return pooled_embs.new_empty(pooled_embs.shape)


# --------------------------------------------------------------------------- autograd formulas
# Gradients flow to the float inputs (values / weights / pooled embeddings); the integer
# structure (lengths, offsets, permutes) gets None.


def _scatter_back(grad: Optional[torch.Tensor], src: torch.Tensor, n: int) -> Optional[torch.Tensor]:
    if grad is None:
        return None
    return grad.new_zeros((n,) + tuple(grad.shape[1:])).index_add_(0, src, grad)


def _permute_setup(ctx, inputs, output):
    permute, lengths, values = inputs[:3]
    weights = inputs[3] if len(inputs) > 3 else None
    ctx.save_for_backward(permute, lengths)
    ctx.n_values = values.shape[0]
    ctx.n_weights = None if weights is None else weights.shape[0]


def _permute_src(ctx, grad_values):
    permute, lengths = ctx.saved_tensors
    lengths2 = lengths.reshape(lengths.shape[0], -1)
    perm = permute.to(torch.int64)
    starts = ref._exclusive(lengths2.reshape(-1)).reshape(lengths2.shape).index_select(0, perm)
    return ref.expand_ranges(starts.reshape(-1), lengths2.index_select(0, perm).reshape(-1),
                             grad_values.shape[0])


def _permute_backward(ctx, grad_lengths, grad_values, grad_weights):
    src = _permute_src(ctx, grad_values)
    gw = None if ctx.n_weights is None else _scatter_back(grad_weights, src, ctx.n_weights)
    return None, None, _scatter_back(grad_values, src, ctx.n_values), gw, None


def _segment_sum_setup(ctx, inputs, output):
    batch_size, csr_seg, values = inputs
    ctx.batch_size = batch_size
    ctx.n_values = values.shape[0]
    ctx.save_for_backward(csr_seg)


def _segment_sum_backward(ctx, grad):
    (csr_seg,) = ctx.saved_tensors
    return None, None, ref.segment_sum_csr_backward(ctx.batch_size, csr_seg, grad, ctx.n_values)


def _kjt_select_setup(ctx, inputs, output):
    values, lengths, offsets, indices, batch_size = inputs[:5]
    ctx.save_for_backward(lengths, offsets, indices)
    ctx.batch_size = batch_size
    ctx.n_values = values.shape[0]


def _kjt_select_backward(ctx, grads):
    lengths, offsets, indices = ctx.saved_tensors
    grad_values = grads[0]
    if grad_values is None:
        return None, None, None, None, None, None, None
    g = ref.keyed_jagged_index_select_dim1_backward(
        grad_values, lengths, offsets, indices, ctx.batch_size, ctx.n_values)
    # like fbgemm, weights get no gradient
    return g, None, None, None, None, None, None


def _pooled_setup(ctx, inputs, output):
    _, offset_dim_list, permute_list, inv_offset_dim_list, inv_permute_list = inputs
    ctx.save_for_backward(offset_dim_list, permute_list, inv_offset_dim_list, inv_permute_list)


def _pooled_backward_of(name: str):
    def backward(ctx, grad):
        offset_dim_list, permute_list, inv_offset_dim_list, inv_permute_list = ctx.saved_tensors
        g = getattr(_ops, name)(grad, inv_offset_dim_list, inv_permute_list, offset_dim_list,
                                permute_list)
        return g, None, None, None, None

    backward.__name__ = f"{name}_backward"
    return backward


# --------------------------------------------------------------------------- specs

_PERMUTE_SCHEMA = ("(Tensor permute, Tensor lengths, Tensor values, Tensor? weights=None, "
                   "SymInt? permuted_lengths_sum=None) -> (Tensor, Tensor, Tensor?)")
_POOLED_SCHEMA = ("(Tensor pooled_embs, Tensor offset_dim_list, Tensor permute_list, "
                  "Tensor inv_offset_dim_list, Tensor inv_permute_list) -> Tensor")

register(OpSpec(
    name="permute_2D_sparse_data",
    schema=_PERMUTE_SCHEMA,
    reference=ref.permute_2D_sparse_data,
    cpu_kernel="permute_2D_sparse_data",
    fake=_permute_2d_fake,
    backward=_permute_backward,
    setup_context=_permute_setup,
    fbgemm=True,
    fbgemm_ascend=True,
))
register(OpSpec(
    name="permute_1D_sparse_data",
    schema=_PERMUTE_SCHEMA,
    reference=ref.permute_1D_sparse_data,
    cpu_kernel="permute_1D_sparse_data",
    fake=_permute_1d_fake,
    backward=_permute_backward,
    setup_context=_permute_setup,
    fbgemm=True,
    fbgemm_ascend=True,
))
register(OpSpec(
    name="block_bucketize_sparse_features",
    schema=("(Tensor lengths, Tensor indices, bool bucketize_pos, bool sequence, "
            "Tensor block_sizes, SymInt my_size, Tensor? weights=None, "
            "Tensor? batch_size_per_feature=None, SymInt max_B=-1, "
            "Tensor[]? block_bucketize_pos=None, bool keep_orig_idx=False, "
            "Tensor? total_num_blocks=None, Tensor? keep_orig_idx_per_feature=None) "
            "-> (Tensor, Tensor, Tensor?, Tensor?, Tensor?)"),
    reference=ref.block_bucketize_sparse_features,
    cpu_kernel="block_bucketize_sparse_features",
    fake=_bbsf_fake,
    fbgemm=True,
))
register(OpSpec(
    name="invert_permute",
    schema="(Tensor permute) -> Tensor",
    reference=ref.invert_permute,
    cpu_kernel="invert_permute",
    fake=_invert_permute_fake,
    fbgemm=True,
))
register(OpSpec(
    name="expand_into_jagged_permute",
    schema="(Tensor permute, Tensor input_offset, Tensor output_offset, SymInt output_size) -> Tensor",
    reference=ref.expand_into_jagged_permute,
    cpu_kernel="expand_into_jagged_permute",
    fake=_expand_fake,
    fbgemm=True,
))
register(OpSpec(
    name="bounds_check_indices",
    schema=("(Tensor rows_per_table, Tensor(a!) indices, Tensor(b!) offsets, "
            "int bounds_check_mode, Tensor(c!) warning, Tensor(d!)? weights=None, "
            "Tensor? B_offsets=None, SymInt max_B=-1, Tensor? b_t_map=None, "
            "int info_B_num_bits=-1, int info_B_mask=-1, int bounds_check_version=1, "
            "bool prefetch_pipeline=False) -> ()"),
    reference=ref.bounds_check_indices,
    cpu_kernel="bounds_check_indices",
    fake=_bounds_check_fake,
    fbgemm=True,
))
register(OpSpec(
    name="segment_sum_csr",
    schema="(SymInt batch_size, Tensor csr_seg, Tensor values) -> Tensor",
    reference=ref.segment_sum_csr,
    cpu_kernel="segment_sum_csr",
    fake=_segment_sum_fake,
    backward=_segment_sum_backward,
    setup_context=_segment_sum_setup,
    fbgemm=True,
    fbgemm_ascend=True,
))
register(OpSpec(
    name="keyed_jagged_index_select_dim1",
    schema=("(Tensor values, Tensor lengths, Tensor offsets, Tensor indices, SymInt batch_size, "
            "Tensor? weights=None, SymInt? selected_lengths_sum=None) -> Tensor[]"),
    reference=ref.keyed_jagged_index_select_dim1,
    cpu_kernel="keyed_jagged_index_select_dim1",
    fake=_kjt_select_fake,
    backward=_kjt_select_backward,
    setup_context=_kjt_select_setup,
    fbgemm=True,
))
register(OpSpec(
    name="offsets_range",
    schema="(Tensor offsets, SymInt range_size) -> Tensor",
    reference=ref.offsets_range,
    cpu_kernel="offsets_range",
    fake=_offsets_range_fake,
    fbgemm=True,
    fbgemm_ascend=True,
))
# permute_pooled_embs_split: what fbgemm's autograd kernel of ..._auto_grad_split calls on CPU
# (TorchRec's column-wise sharding), so it is replaceable too
for _name, _ascend in (("permute_pooled_embs", True), ("permute_pooled_embs_auto_grad", True),
                       ("permute_pooled_embs_auto_grad_split", False),
                       ("permute_pooled_embs_split", False)):
    register(OpSpec(
        name=_name,
        schema=_POOLED_SCHEMA,
        reference=ref.permute_pooled_embs,
        cpu_kernel="permute_pooled_embs",
        fake=_pooled_fake,
        backward=_pooled_backward_of(_name),
        setup_context=_pooled_setup,
        fbgemm=True,
        fbgemm_ascend=_ascend,
    ))


# --------------------------------------------------------------------------- public API


def _check_weights(weights: Optional[torch.Tensor], values: torch.Tensor,
                   dtypes: Sequence[torch.dtype] = _checks.FLOAT_DTYPES) -> None:
    if weights is None:
        return
    _checks.check_tensor("weights", weights, dim=1, dtypes=dtypes)
    if weights.shape[0] != values.shape[0]:
        raise ValueError(f"weights: has {weights.shape[0]} entries but there are "
                         f"{values.shape[0]} values; one weight per value")


def _check_sum(name: str, given: Optional[int], actual: torch.Tensor, validate: bool) -> None:
    if given is None:
        return
    _checks.check_nonneg_int(name, given)
    if validate and int(actual.sum()) != given:
        raise ValueError(f"{name}: is {given} but the selected lengths sum to {int(actual.sum())}")


def permute_2D_sparse_data(
    permute: torch.Tensor,
    lengths: torch.Tensor,
    values: torch.Tensor,
    weights: Optional[torch.Tensor] = None,
    permuted_lengths_sum: Optional[int] = None,
    validate: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Reorder the features (rows) of ``lengths [T_in, B]``: output feature ``t`` is input
    feature ``permute[t]`` (a subset and repeats are allowed), with its values and weights.

    Args:
        permute: ``[T]`` int32 feature order (fbgemm reads it as int32).
        lengths: ``[T_in, B]`` int32/int64 lengths.
        values: ``[sum(lengths)]`` values (any dtype).
        weights: optional ``[sum(lengths)]`` float per-value weights.
        permuted_lengths_sum: total output length, if known (saves a sync on devices).
        validate: check values: lengths >= 0 and summing to ``len(values)``, ``permute`` in range.

    Returns ``(permuted_lengths [T, B], permuted_values, permuted_weights or None)``.
    Differentiable w.r.t. ``values`` and ``weights`` (gradients are scattered back, so repeated
    features accumulate).
    """
    _check_permute_args(permute, lengths, values, weights, permuted_lengths_sum, validate, 2)
    return _ops.permute_2D_sparse_data(permute, lengths, values, weights, permuted_lengths_sum)


def permute_1D_sparse_data(
    permute: torch.Tensor,
    lengths: torch.Tensor,
    values: torch.Tensor,
    weights: Optional[torch.Tensor] = None,
    permuted_lengths_sum: Optional[int] = None,
    validate: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Reorder the segments of 1-D ``lengths [N]`` by ``permute [M]`` (int32): output segment
    ``i`` is input segment ``permute[i]``.  Same arguments and gradients as
    :func:`permute_2D_sparse_data`, with one length per segment."""
    _check_permute_args(permute, lengths, values, weights, permuted_lengths_sum, validate, 1)
    return _ops.permute_1D_sparse_data(permute, lengths, values, weights, permuted_lengths_sum)


def _check_permute_args(permute, lengths, values, weights, permuted_lengths_sum, validate, ldim):
    _checks.check_tensor("permute", permute, dim=1, dtypes=(torch.int32,))
    _checks.check_tensor("lengths", lengths, dim=ldim, dtypes=_checks.INDEX_DTYPES)
    _checks.check_tensor("values", values, min_dim=1)
    _check_weights(weights, values)
    _checks.check_same_device(lengths=lengths, permute=permute, values=values, weights=weights)
    flat = lengths.reshape(-1)
    _checks.check_lengths("lengths", flat, values.shape[0], validate)
    _checks.check_index_range("permute", permute, 0, lengths.shape[0], validate)
    if permuted_lengths_sum is not None:
        sel = lengths.index_select(0, permute.to(torch.int64)) if validate else lengths
        _check_sum("permuted_lengths_sum", permuted_lengths_sum, sel, validate)


def block_bucketize_sparse_features(
    lengths: torch.Tensor,
    indices: torch.Tensor,
    bucketize_pos: bool,
    sequence: bool,
    block_sizes: torch.Tensor,
    my_size: int,
    weights: Optional[torch.Tensor] = None,
    batch_size_per_feature: Optional[torch.Tensor] = None,
    max_B: int = -1,
    block_bucketize_pos: Optional[List[torch.Tensor]] = None,
    keep_orig_idx: bool = False,
    total_num_blocks: Optional[torch.Tensor] = None,
    keep_orig_idx_per_feature: Optional[torch.Tensor] = None,
    validate: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor],
           Optional[torch.Tensor]]:
    """Split each feature's ids over ``my_size`` buckets (row-wise sharding), fbgemm's rule
    (see :func:`torchrec_ascend.ops.reference.sparse.block_bucketize_sparse_features`).

    Args:
        lengths: ``[T * B]`` (or ``sum(batch_size_per_feature)``) int32/int64 lengths.
        indices: ``[sum(lengths)]`` ids, int32/int64; negative ids are read unsigned, as fbgemm.
        bucketize_pos: also return each id's position in its input bag.
        sequence: also return ``unbucketize_permute`` (input position -> output position).
        block_sizes: ``[T]`` rows per bucket, dtype of ``indices``.
        my_size: number of buckets (>= 1).
        weights: optional ``[sum(lengths)]`` float32/float64 weights (moved with the ids).
        batch_size_per_feature: ``[T]`` batch size of each feature (variable batch), lengths'
            dtype.
        max_B: largest batch size (only used by GPU kernels).
        block_bucketize_pos: uneven buckets: ``T`` tensors of ``my_size + 1`` boundaries
            (non-decreasing, starting at 0), dtype of ``indices``.
        keep_orig_idx: keep the ids unchanged (only bucket them).
        total_num_blocks: ``[T]`` blocks per feature (a multiple of ``my_size``).
        keep_orig_idx_per_feature: ``[T]`` bool, overrides ``keep_orig_idx`` per feature.
        validate: check values (lengths >= 0 and summing to ``len(indices)``, boundaries).

    Returns ``(new_lengths [my_size * len(lengths)], new_indices, new_weights, new_pos,
    unbucketize_permute)``; the last three are None unless asked for.  Not differentiable.
    """
    _checks.check_tensor("lengths", lengths, dim=1, dtypes=_checks.INDEX_DTYPES)
    _checks.check_tensor("indices", indices, dim=1, dtypes=_checks.INDEX_DTYPES)
    _checks.check_tensor("block_sizes", block_sizes, dim=1, dtypes=(indices.dtype,))
    my_size = _checks.check_nonneg_int("my_size", my_size)
    if my_size < 1:
        raise ValueError("my_size: must be >= 1 (the number of buckets)")
    _check_weights(weights, indices, (torch.float32, torch.float64))
    _checks.check_same_device(lengths=lengths, indices=indices, block_sizes=block_sizes,
                              weights=weights, batch_size_per_feature=batch_size_per_feature,
                              total_num_blocks=total_num_blocks,
                              keep_orig_idx_per_feature=keep_orig_idx_per_feature)
    t_count = block_sizes.numel()
    if t_count == 0:
        raise ValueError("block_sizes: must have one entry per feature (at least one feature)")
    if batch_size_per_feature is not None:
        _checks.check_tensor("batch_size_per_feature", batch_size_per_feature, dim=1,
                             dtypes=(lengths.dtype,))
        if batch_size_per_feature.numel() != t_count:
            raise ValueError(f"batch_size_per_feature: needs {t_count} entries (one per feature)")
        if validate and int(batch_size_per_feature.sum()) != lengths.numel():
            raise ValueError(f"batch_size_per_feature: sums to {int(batch_size_per_feature.sum())}"
                             f" but lengths has {lengths.numel()} entries")
    elif lengths.numel() % t_count:
        raise ValueError(f"lengths: {lengths.numel()} entries is not a multiple of the "
                         f"{t_count} features in block_sizes")
    _checks.check_lengths("lengths", lengths, indices.numel(), validate)
    uneven = block_bucketize_pos is not None and len(block_bucketize_pos) > 0
    if uneven:
        if len(block_bucketize_pos) != t_count:
            raise ValueError(f"block_bucketize_pos: needs {t_count} tensors (one per feature), "
                             f"got {len(block_bucketize_pos)}")
        for t, pos in enumerate(block_bucketize_pos):
            _checks.check_tensor(f"block_bucketize_pos[{t}]", pos, dim=1, dtypes=(indices.dtype,))
            _checks.check_offsets(f"block_bucketize_pos[{t}]", pos, None, validate)
    for name, t in (("total_num_blocks", total_num_blocks),):
        if t is None:
            continue
        _checks.check_tensor(name, t, dim=1, dtypes=(indices.dtype,))
        if t.numel() != t_count:
            raise ValueError(f"{name}: needs {t_count} entries (one per feature)")
        if not uneven and validate and bool((t % my_size != 0).any() | (t < my_size).any()):
            raise ValueError(f"total_num_blocks: every entry must be a positive multiple of "
                             f"my_size={my_size}, got {t.tolist()}")
    if keep_orig_idx_per_feature is not None:
        _checks.check_tensor("keep_orig_idx_per_feature", keep_orig_idx_per_feature, dim=1,
                             dtypes=(torch.bool,))
        if keep_orig_idx_per_feature.numel() != t_count:
            raise ValueError(f"keep_orig_idx_per_feature: needs {t_count} entries")
    return _ops.block_bucketize_sparse_features(
        lengths, indices, bool(bucketize_pos), bool(sequence), block_sizes, my_size, weights,
        batch_size_per_feature, int(max_B), block_bucketize_pos, bool(keep_orig_idx),
        total_num_blocks, keep_orig_idx_per_feature)


def invert_permute(permute: torch.Tensor, validate: bool = True) -> torch.Tensor:
    """The inverse permutation: ``out[permute[i]] = i`` (int32/int64 ``permute``)."""
    _checks.check_tensor("permute", permute, dim=1, dtypes=_checks.INDEX_DTYPES)
    _checks.check_permutation("permute", permute, validate)
    return _ops.invert_permute(permute)


def expand_into_jagged_permute(
    permute: torch.Tensor,
    input_offset: torch.Tensor,
    output_offset: torch.Tensor,
    output_size: int,
    validate: bool = True,
) -> torch.Tensor:
    """Expand a feature permute into a value permute: output segment ``t`` (bounds from
    ``output_offset``) reads input positions ``input_offset[permute[t]] + 0, 1, ...``.

    ``permute [T]``, ``input_offset``/``output_offset [T + 1]`` (complete cumsums of the
    per-feature lengths before/after permuting), all of one int dtype; ``output_size`` =
    ``output_offset[-1]``.
    """
    _checks.check_tensor("permute", permute, dim=1, dtypes=_checks.INDEX_DTYPES)
    _checks.check_same_dtype(permute=permute, input_offset=input_offset,
                             output_offset=output_offset)
    _checks.check_offsets("input_offset", input_offset, None, validate)
    _checks.check_offsets("output_offset", output_offset, None, validate)
    _checks.check_same_device(permute=permute, input_offset=input_offset,
                              output_offset=output_offset)
    if permute.numel() == 0:
        raise ValueError("permute: must not be empty")
    for name, off in (("input_offset", input_offset), ("output_offset", output_offset)):
        if off.numel() != permute.numel() + 1:
            raise ValueError(f"{name}: needs len(permute) + 1 = {permute.numel() + 1} entries, "
                             f"got {off.numel()}")
    output_size = _checks.check_nonneg_int("output_size", output_size)
    _checks.check_index_range("permute", permute, 0, permute.numel(), validate)
    if validate and int(output_offset[-1]) != output_size:
        raise ValueError(f"output_size: is {output_size} but output_offset ends at "
                         f"{int(output_offset[-1])}")
    return _ops.expand_into_jagged_permute(permute, input_offset, output_offset, output_size)


class BoundsCheckMode:
    """fbgemm's ``BoundsCheckMode`` values (ints, as the op takes them)."""

    FATAL = ref.FATAL
    WARNING = ref.WARNING
    IGNORE = ref.IGNORE
    NONE = ref.NONE
    V2_IGNORE = ref.V2_IGNORE
    V2_WARNING = ref.V2_WARNING
    V2_FATAL = ref.V2_FATAL


def bounds_check_indices(
    rows_per_table: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    bounds_check_mode: int,
    warning: torch.Tensor,
    weights: Optional[torch.Tensor] = None,
    B_offsets: Optional[torch.Tensor] = None,
    max_B: int = -1,
    b_t_map: Optional[torch.Tensor] = None,
    info_B_num_bits: int = -1,
    info_B_mask: int = -1,
    bounds_check_version: int = 1,
    prefetch_pipeline: bool = False,
) -> None:
    """Check (and, by mode, repair IN PLACE) the ids and offsets of a table-batched lookup.

    Bag ``k`` of table ``t`` is ``indices[offsets[k]:offsets[k + 1]]`` with ``B`` bags per table
    (``len(offsets) = T * B + 1``) or ``B_offsets [T + 1]`` (int32) bags per table (variable
    batch).  ``-1`` ids (pruned rows) are always accepted.  Modes (:class:`BoundsCheckMode`):

    * ``FATAL``: ``ValueError`` on the first bad offset or id; nothing is modified (this entry
      point runs the torch-composite check first, so the error is the same on every backend).
    * ``WARNING``: MUTATES ``offsets`` (last set to ``len(indices)``, then
      ``cummax(clamp(offsets, 0, len(indices)))``) and ``indices`` (out-of-range ids set to 0),
      and writes the number of fixes into ``warning[0]`` (reset first).
    * ``IGNORE``: the same repairs, ``warning`` untouched.  ``NONE``: nothing.
    * ``V2_*``: as the matching v1 mode (fbgemm's CPU kernel has no v2 path).

    ``weights`` is only checked for size; ``b_t_map``, ``info_B_*``, ``bounds_check_version`` and
    ``prefetch_pipeline`` are accepted for schema compatibility (GPU-only in fbgemm).  The
    argument checks here read no tensor values: checking the values is the op's job.
    """
    _checks.check_tensor("rows_per_table", rows_per_table, dim=1, dtypes=(torch.int64,))
    _checks.check_tensor("indices", indices, dim=1, dtypes=_checks.INDEX_DTYPES)
    _checks.check_tensor("offsets", offsets, dim=1, dtypes=_checks.INDEX_DTYPES)
    _checks.check_same_dtype(indices=indices, offsets=offsets)
    _checks.check_tensor("warning", warning, dtypes=(torch.int64,))
    if warning.numel() < 1:
        raise ValueError("warning: needs at least one element (the fix counter)")
    mode = int(bounds_check_mode)
    if not 0 <= mode <= 6:
        raise ValueError(f"bounds_check_mode: {mode} is not a BoundsCheckMode (0..6)")
    _checks.check_same_device(indices=indices, offsets=offsets, rows_per_table=rows_per_table,
                              warning=warning, weights=weights, B_offsets=B_offsets)
    if offsets.numel() == 0:
        raise ValueError("offsets: needs at least one element")
    t_count = rows_per_table.numel()
    if B_offsets is not None:
        _checks.check_tensor("B_offsets", B_offsets, dim=1, dtypes=(torch.int32,))
        if B_offsets.numel() != t_count + 1:
            raise ValueError(f"B_offsets: needs T + 1 = {t_count + 1} entries")
    elif t_count == 0 or (offsets.numel() - 1) % t_count:
        raise ValueError(f"offsets: {offsets.numel()} entries is not B * T + 1 for "
                         f"T={t_count} tables")
    if weights is not None and weights.numel() and weights.shape[0] != indices.numel():
        raise ValueError(f"weights: {weights.shape[0]} entries but {indices.numel()} indices")
    if mode in (BoundsCheckMode.FATAL, BoundsCheckMode.V2_FATAL):
        # FATAL modifies nothing: run the torch-composite check first so that a violation is a
        # ValueError naming the offset or id, whichever backend runs the op
        ref.bounds_check_indices(rows_per_table, indices, offsets, mode, warning, weights,
                                 B_offsets)
    _ops.bounds_check_indices(rows_per_table, indices, offsets, mode, warning, weights, B_offsets,
                              max_B, b_t_map, info_B_num_bits, info_B_mask, bounds_check_version,
                              prefetch_pipeline)


def segment_sum_csr(batch_size: int, csr_seg: torch.Tensor, values: torch.Tensor,
                    validate: bool = True) -> torch.Tensor:
    """``out[i] = values[csr_seg[i] * batch_size : csr_seg[i + 1] * batch_size].sum()``.
    Differentiable w.r.t. ``values``."""
    batch_size = _checks.check_nonneg_int("batch_size", batch_size)
    _checks.check_tensor("values", values, dim=1)
    _checks.check_offsets("csr_seg", csr_seg, None, validate)
    _checks.check_same_device(csr_seg=csr_seg, values=values)
    if validate and int(csr_seg[-1]) * batch_size > values.numel():
        raise ValueError(f"csr_seg: last entry {int(csr_seg[-1])} * batch_size {batch_size} "
                         f"exceeds the {values.numel()} values")
    return _ops.segment_sum_csr(batch_size, csr_seg, values)


def keyed_jagged_index_select_dim1(
    values: torch.Tensor,
    lengths: torch.Tensor,
    offsets: torch.Tensor,
    indices: torch.Tensor,
    batch_size: int,
    weights: Optional[torch.Tensor] = None,
    selected_lengths_sum: Optional[int] = None,
    validate: bool = True,
) -> List[torch.Tensor]:
    """Select samples ``indices`` (dim 1) of every key of a KJT (``lengths [K * batch_size]``,
    ``offsets`` its complete cumsum): returns ``[values, lengths]`` (+ ``weights``), key-major.
    Differentiable w.r.t. ``values`` (like fbgemm, not ``weights``)."""
    _checks.check_tensor("values", values, dim=1)
    _checks.check_tensor("lengths", lengths, dim=1, dtypes=_checks.INDEX_DTYPES)
    _checks.check_tensor("indices", indices, dim=1, dtypes=_checks.INDEX_DTYPES)
    batch_size = _checks.check_nonneg_int("batch_size", batch_size)
    if batch_size == 0 or lengths.numel() % batch_size:
        raise ValueError(f"batch_size: {batch_size} must be > 0 and divide len(lengths) = "
                         f"{lengths.numel()}")
    _check_weights(weights, values)
    _checks.check_same_device(values=values, lengths=lengths, offsets=offsets, indices=indices,
                              weights=weights)
    _checks.check_offsets("offsets", offsets, values.shape[0], validate)
    if offsets.numel() != lengths.numel() + 1:
        raise ValueError(f"offsets: needs len(lengths) + 1 = {lengths.numel() + 1} entries, got "
                         f"{offsets.numel()}")
    _checks.check_lengths("lengths", lengths, values.shape[0], validate)
    if validate and not torch.equal(offsets[1:] - offsets[:-1], lengths.to(offsets.dtype)):
        raise ValueError("offsets: must be the complete cumsum of lengths")
    _checks.check_index_range("indices", indices, 0, batch_size, validate)
    if selected_lengths_sum is not None:
        sel = lengths.reshape(-1, batch_size).index_select(1, indices.to(torch.int64)) \
            if validate else lengths
        _check_sum("selected_lengths_sum", selected_lengths_sum, sel, validate)
    return _ops.keyed_jagged_index_select_dim1(values, lengths, offsets, indices, batch_size,
                                               weights, selected_lengths_sum)


def offsets_range(offsets: torch.Tensor, range_size: int, validate: bool = True) -> torch.Tensor:
    """Position of every element within its segment: segment ``i`` spans
    ``[offsets[i], offsets[i + 1])``, the last one ends at ``range_size``.  ``offsets`` are the
    N start offsets (an exclusive cumsum), starting at 0."""
    _checks.check_tensor("offsets", offsets, dim=1, dtypes=_checks.INDEX_DTYPES)
    range_size = _checks.check_nonneg_int("range_size", range_size)
    if offsets.numel() == 0:
        if range_size:
            raise ValueError("offsets: empty, but range_size > 0 needs at least one segment")
    else:
        _checks.check_offsets("offsets", offsets, range_size, validate)
    return _ops.offsets_range(offsets, range_size)


def _check_pooled(pooled_embs, offset_dim_list, permute_list, inv_offset_dim_list,
                  inv_permute_list, validate):
    _checks.check_tensor("pooled_embs", pooled_embs, min_dim=2)
    for name, t in (("offset_dim_list", offset_dim_list), ("permute_list", permute_list),
                    ("inv_offset_dim_list", inv_offset_dim_list),
                    ("inv_permute_list", inv_permute_list)):
        _checks.check_tensor(name, t, dim=1, dtypes=(torch.int64,))
    _checks.check_same_device(pooled_embs=pooled_embs, offset_dim_list=offset_dim_list,
                              permute_list=permute_list, inv_offset_dim_list=inv_offset_dim_list,
                              inv_permute_list=inv_permute_list)
    t_count = permute_list.numel()
    for name, t, n in (("offset_dim_list", offset_dim_list, t_count + 1),
                       ("inv_offset_dim_list", inv_offset_dim_list, t_count + 1),
                       ("inv_permute_list", inv_permute_list, t_count)):
        if t.numel() != n:
            raise ValueError(f"{name}: needs {n} entries for {t_count} tables, got {t.numel()}")
    _checks.check_offsets("offset_dim_list", offset_dim_list, None, validate)
    _checks.check_permutation("permute_list", permute_list, validate)
    if not validate:
        return
    if int(offset_dim_list[-1]) != pooled_embs.shape[1]:
        raise ValueError(f"offset_dim_list: ends at {int(offset_dim_list[-1])} but pooled_embs "
                         f"has {pooled_embs.shape[1]} columns")
    inv = torch.empty_like(permute_list)
    inv[permute_list] = torch.arange(t_count, device=permute_list.device)
    if not torch.equal(inv, inv_permute_list):
        raise ValueError("inv_permute_list: must be the inverse of permute_list")
    dims = (offset_dim_list[1:] - offset_dim_list[:-1])[permute_list]
    expect = torch.cat([dims.new_zeros(1), torch.cumsum(dims, 0)])
    if not torch.equal(expect, inv_offset_dim_list):
        raise ValueError("inv_offset_dim_list: must be the complete cumsum of the permuted dims")


def _pooled_entry(name: str, doc: str):
    op = getattr(_ops, name)

    def entry(pooled_embs: torch.Tensor, offset_dim_list: torch.Tensor,
              permute_list: torch.Tensor, inv_offset_dim_list: torch.Tensor,
              inv_permute_list: torch.Tensor, validate: bool = True) -> torch.Tensor:
        _check_pooled(pooled_embs, offset_dim_list, permute_list, inv_offset_dim_list,
                      inv_permute_list, validate)
        return op(pooled_embs, offset_dim_list, permute_list, inv_offset_dim_list,
                  inv_permute_list)

    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = doc
    return entry


_POOLED_DOC = """Reorder the per-table column blocks of ``pooled_embs [B, sum D]``: output block
    ``t`` is input block ``permute_list[t]``.  ``offset_dim_list [T + 1]`` bounds the input
    blocks, ``inv_offset_dim_list``/``inv_permute_list`` the output ones (all int64; checked for
    consistency with ``validate``).  Differentiable w.r.t. ``pooled_embs`` (the backward is the
    inverse permute).{}"""

permute_pooled_embs = _pooled_entry("permute_pooled_embs", _POOLED_DOC.format(""))
permute_pooled_embs_auto_grad = _pooled_entry(
    "permute_pooled_embs_auto_grad", _POOLED_DOC.format("  fbgemm's autograd variant."))
permute_pooled_embs_auto_grad_split = _pooled_entry(
    "permute_pooled_embs_auto_grad_split",
    _POOLED_DOC.format("  fbgemm's split (per-device kernel) autograd variant: what TorchRec's "
                       "column-wise / grid output dist calls."))
