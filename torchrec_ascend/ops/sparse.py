"""Sparse-feature ops on TorchRec's training path: public entry points and registry specs.

A keyed sparse batch (TorchRec's KeyedJaggedTensor) is ``lengths [T * B]`` (or ``[T, B]``) plus
``values``/``indices`` (and optional per-value ``weights``): feature ``t``, sample ``b`` owns
``lengths[t * B + b]`` consecutive values.  Each public function validates its arguments (values
are read only with ``validate=True``, the default: that costs a device sync on npu/cuda) and then
dispatches ``torch.ops.torchrec_ascend.<op>`` through the registry; the op schemas are fbgemm's,
registered by :mod:`.specs.sparse`.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from . import validation
from .reference import sparse as ref
from .specs import sparse as _specs

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

_specs.register_all()
_ops = torch.ops.torchrec_ascend


_CUMSUM_DTYPES = validation.INDEX_DTYPES + validation.FLOAT_DTYPES


def _check_counts(t_in: torch.Tensor, max_dim: Optional[int]) -> None:
    validation.check_tensor("t_in", t_in, dtypes=_CUMSUM_DTYPES)
    if max_dim is not None and not 1 <= t_in.dim() <= max_dim:
        raise ValueError(f"t_in: expected 1..{max_dim} dims, got shape {tuple(t_in.shape)}")


def asynchronous_complete_cumsum(t_in: torch.Tensor) -> torch.Tensor:
    """``[0, cumsum(t_in)]`` along the last dim: lengths -> offsets (1-D or 2-D; int32/int64 or
    floating, in the input dtype, as fbgemm)."""
    _check_counts(t_in, 2)
    return _ops.asynchronous_complete_cumsum(t_in)


def asynchronous_exclusive_cumsum(t_in: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix sum over all entries (row-major, any shape), in the input dtype."""
    _check_counts(t_in, None)
    return _ops.asynchronous_exclusive_cumsum(t_in)


def asynchronous_inclusive_cumsum(t_in: torch.Tensor) -> torch.Tensor:
    """Inclusive prefix sum over all entries (row-major, any shape), in the input dtype."""
    _check_counts(t_in, None)
    return _ops.asynchronous_inclusive_cumsum(t_in)


# --------------------------------------------------------------------------- public API


def _check_weights(weights: Optional[torch.Tensor], values: torch.Tensor,
                   dtypes: Sequence[torch.dtype] = validation.FLOAT_DTYPES) -> None:
    if weights is None:
        return
    validation.check_tensor("weights", weights, dim=1, dtypes=dtypes)
    if weights.shape[0] != values.shape[0]:
        raise ValueError(f"weights: has {weights.shape[0]} entries but there are "
                         f"{values.shape[0]} values; one weight per value")


def _check_sum(name: str, given: Optional[int], actual: torch.Tensor, validate: bool) -> None:
    if given is None:
        return
    validation.check_nonneg_int(name, given)
    if validate and int(actual.sum()) != given:
        raise ValueError(f"{name}: is {given} but the selected lengths sum to {int(actual.sum())}")


def _permute_entry(name: str, lengths_dim: int, doc: str):
    op = getattr(_ops, name)

    def entry(permute: torch.Tensor, lengths: torch.Tensor, values: torch.Tensor,
              weights: Optional[torch.Tensor] = None, permuted_lengths_sum: Optional[int] = None,
              validate: bool = True) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        _check_permute_args(permute, lengths, values, weights, permuted_lengths_sum, validate,
                            lengths_dim)
        return op(permute, lengths, values, weights, permuted_lengths_sum)

    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = doc
    return entry


permute_2D_sparse_data = _permute_entry("permute_2D_sparse_data", 2, """Reorder the features (rows)
    of ``lengths [T_in, B]``: output feature ``t`` is input feature ``permute[t]`` (a subset and
    repeats are allowed), with its values and weights.

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
    """)
permute_1D_sparse_data = _permute_entry("permute_1D_sparse_data", 1, """Reorder the segments of
    1-D ``lengths [N]`` by ``permute [M]`` (int32): output segment ``i`` is input segment
    ``permute[i]``.  Same arguments and gradients as :func:`permute_2D_sparse_data`, with one
    length per segment.""")


def _check_permute_args(permute, lengths, values, weights, permuted_lengths_sum, validate, ldim):
    validation.check_tensor("permute", permute, dim=1, dtypes=(torch.int32,))
    validation.check_tensor("lengths", lengths, dim=ldim, dtypes=validation.INDEX_DTYPES)
    validation.check_tensor("values", values, min_dim=1)
    _check_weights(weights, values)
    validation.check_same_device(lengths=lengths, permute=permute, values=values, weights=weights)
    flat = lengths.reshape(-1)
    validation.check_lengths("lengths", flat, values.shape[0], validate)
    validation.check_index_range("permute", permute, 0, lengths.shape[0], validate)
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
    validation.check_tensor("lengths", lengths, dim=1, dtypes=validation.INDEX_DTYPES)
    validation.check_tensor("indices", indices, dim=1, dtypes=validation.INDEX_DTYPES)
    validation.check_tensor("block_sizes", block_sizes, dim=1, dtypes=(indices.dtype,))
    my_size = validation.check_nonneg_int("my_size", my_size)
    if my_size < 1:
        raise ValueError("my_size: must be >= 1 (the number of buckets)")
    _check_weights(weights, indices, (torch.float32, torch.float64))
    validation.check_same_device(lengths=lengths, indices=indices, block_sizes=block_sizes,
                              weights=weights, batch_size_per_feature=batch_size_per_feature,
                              total_num_blocks=total_num_blocks,
                              keep_orig_idx_per_feature=keep_orig_idx_per_feature)
    t_count = block_sizes.numel()
    if t_count == 0:
        raise ValueError("block_sizes: must have one entry per feature (at least one feature)")
    if batch_size_per_feature is not None:
        validation.check_tensor("batch_size_per_feature", batch_size_per_feature, dim=1,
                             dtypes=(lengths.dtype,))
        if batch_size_per_feature.numel() != t_count:
            raise ValueError(f"batch_size_per_feature: needs {t_count} entries (one per feature)")
        if validate and int(batch_size_per_feature.sum()) != lengths.numel():
            raise ValueError(f"batch_size_per_feature: sums to {int(batch_size_per_feature.sum())}"
                             f" but lengths has {lengths.numel()} entries")
    elif lengths.numel() % t_count:
        raise ValueError(f"lengths: {lengths.numel()} entries is not a multiple of the "
                         f"{t_count} features in block_sizes")
    validation.check_lengths("lengths", lengths, indices.numel(), validate)
    uneven = block_bucketize_pos is not None and len(block_bucketize_pos) > 0
    if uneven:
        if len(block_bucketize_pos) != t_count:
            raise ValueError(f"block_bucketize_pos: needs {t_count} tensors (one per feature), "
                             f"got {len(block_bucketize_pos)}")
        for t, pos in enumerate(block_bucketize_pos):
            validation.check_tensor(f"block_bucketize_pos[{t}]", pos, dim=1, dtypes=(indices.dtype,))
            validation.check_offsets(f"block_bucketize_pos[{t}]", pos, None, validate)
    for name, t in (("total_num_blocks", total_num_blocks),):
        if t is None:
            continue
        validation.check_tensor(name, t, dim=1, dtypes=(indices.dtype,))
        if t.numel() != t_count:
            raise ValueError(f"{name}: needs {t_count} entries (one per feature)")
        if not uneven and validate and bool((t % my_size != 0).any() | (t < my_size).any()):
            raise ValueError(f"total_num_blocks: every entry must be a positive multiple of "
                             f"my_size={my_size}, got {t.tolist()}")
    if keep_orig_idx_per_feature is not None:
        validation.check_tensor("keep_orig_idx_per_feature", keep_orig_idx_per_feature, dim=1,
                             dtypes=(torch.bool,))
        if keep_orig_idx_per_feature.numel() != t_count:
            raise ValueError(f"keep_orig_idx_per_feature: needs {t_count} entries")
    return _ops.block_bucketize_sparse_features(
        lengths, indices, bool(bucketize_pos), bool(sequence), block_sizes, my_size, weights,
        batch_size_per_feature, int(max_B), block_bucketize_pos, bool(keep_orig_idx),
        total_num_blocks, keep_orig_idx_per_feature)


def invert_permute(permute: torch.Tensor, validate: bool = True) -> torch.Tensor:
    """The inverse permutation: ``out[permute[i]] = i`` (int32/int64 ``permute``)."""
    validation.check_tensor("permute", permute, dim=1, dtypes=validation.INDEX_DTYPES)
    validation.check_permutation("permute", permute, validate)
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
    validation.check_tensor("permute", permute, dim=1, dtypes=validation.INDEX_DTYPES)
    validation.check_same_dtype(permute=permute, input_offset=input_offset,
                             output_offset=output_offset)
    validation.check_offsets("input_offset", input_offset, None, validate)
    validation.check_offsets("output_offset", output_offset, None, validate)
    validation.check_same_device(permute=permute, input_offset=input_offset,
                              output_offset=output_offset)
    if permute.numel() == 0:
        raise ValueError("permute: must not be empty")
    for name, off in (("input_offset", input_offset), ("output_offset", output_offset)):
        if off.numel() != permute.numel() + 1:
            raise ValueError(f"{name}: needs len(permute) + 1 = {permute.numel() + 1} entries, "
                             f"got {off.numel()}")
    output_size = validation.check_nonneg_int("output_size", output_size)
    validation.check_index_range("permute", permute, 0, permute.numel(), validate)
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

    * ``FATAL``: ``ValueError`` on the first bad offset or id; nothing is modified (the same
      error on every backend: where fbgemm's kernel serves the op, the registry words its error
      as ours).
    * ``WARNING``: MUTATES ``offsets`` (last set to ``len(indices)``, then
      ``cummax(clamp(offsets, 0, len(indices)))``) and ``indices`` (out-of-range ids set to 0),
      and writes the number of fixes into ``warning[0]`` (reset first).
    * ``IGNORE``: the same repairs, ``warning`` untouched.  ``NONE``: nothing.
    * ``V2_*``: as the matching v1 mode (fbgemm's CPU kernel has no v2 path).

    ``weights`` is only checked for size; ``b_t_map``, ``info_B_*``, ``bounds_check_version`` and
    ``prefetch_pipeline`` are accepted for schema compatibility (GPU-only in fbgemm).  The
    argument checks here read no tensor values: checking the values is the op's job.
    """
    validation.check_tensor("rows_per_table", rows_per_table, dim=1, dtypes=(torch.int64,))
    validation.check_tensor("indices", indices, dim=1, dtypes=validation.INDEX_DTYPES)
    validation.check_tensor("offsets", offsets, dim=1, dtypes=validation.INDEX_DTYPES)
    validation.check_same_dtype(indices=indices, offsets=offsets)
    validation.check_tensor("warning", warning, dtypes=(torch.int64,))
    if warning.numel() < 1:
        raise ValueError("warning: needs at least one element (the fix counter)")
    mode = int(bounds_check_mode)
    if not 0 <= mode <= 6:
        raise ValueError(f"bounds_check_mode: {mode} is not a BoundsCheckMode (0..6)")
    validation.check_same_device(indices=indices, offsets=offsets, rows_per_table=rows_per_table,
                              warning=warning, weights=weights, B_offsets=B_offsets)
    if offsets.numel() == 0:
        raise ValueError("offsets: needs at least one element")
    t_count = rows_per_table.numel()
    if B_offsets is not None:
        validation.check_tensor("B_offsets", B_offsets, dim=1, dtypes=(torch.int32,))
        if B_offsets.numel() != t_count + 1:
            raise ValueError(f"B_offsets: needs T + 1 = {t_count + 1} entries")
    elif t_count == 0 or (offsets.numel() - 1) % t_count:
        raise ValueError(f"offsets: {offsets.numel()} entries is not B * T + 1 for "
                         f"T={t_count} tables")
    if weights is not None and weights.numel() and weights.shape[0] != indices.numel():
        raise ValueError(f"weights: {weights.shape[0]} entries but {indices.numel()} indices")
    _ops.bounds_check_indices(rows_per_table, indices, offsets, mode, warning, weights, B_offsets,
                              max_B, b_t_map, info_B_num_bits, info_B_mask, bounds_check_version,
                              prefetch_pipeline)


def segment_sum_csr(batch_size: int, csr_seg: torch.Tensor, values: torch.Tensor,
                    validate: bool = True) -> torch.Tensor:
    """``out[i] = values[csr_seg[i] * batch_size : csr_seg[i + 1] * batch_size].sum()``.
    Differentiable w.r.t. ``values``."""
    batch_size = validation.check_nonneg_int("batch_size", batch_size)
    validation.check_tensor("values", values, dim=1)
    validation.check_offsets("csr_seg", csr_seg, None, validate)
    validation.check_same_device(csr_seg=csr_seg, values=values)
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
    validation.check_tensor("values", values, dim=1)
    validation.check_tensor("lengths", lengths, dim=1, dtypes=validation.INDEX_DTYPES)
    validation.check_tensor("indices", indices, dim=1, dtypes=validation.INDEX_DTYPES)
    batch_size = validation.check_nonneg_int("batch_size", batch_size)
    if batch_size == 0 or lengths.numel() % batch_size:
        raise ValueError(f"batch_size: {batch_size} must be > 0 and divide len(lengths) = "
                         f"{lengths.numel()}")
    _check_weights(weights, values)
    validation.check_same_device(values=values, lengths=lengths, offsets=offsets, indices=indices,
                              weights=weights)
    validation.check_offsets("offsets", offsets, values.shape[0], validate)
    if offsets.numel() != lengths.numel() + 1:
        raise ValueError(f"offsets: needs len(lengths) + 1 = {lengths.numel() + 1} entries, got "
                         f"{offsets.numel()}")
    validation.check_lengths("lengths", lengths, values.shape[0], validate)
    if validate and not torch.equal(offsets[1:] - offsets[:-1], lengths.to(offsets.dtype)):
        raise ValueError("offsets: must be the complete cumsum of lengths")
    validation.check_index_range("indices", indices, 0, batch_size, validate)
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
    validation.check_tensor("offsets", offsets, dim=1, dtypes=validation.INDEX_DTYPES)
    range_size = validation.check_nonneg_int("range_size", range_size)
    if offsets.numel() == 0:
        if range_size:
            raise ValueError("offsets: empty, but range_size > 0 needs at least one segment")
    else:
        validation.check_offsets("offsets", offsets, range_size, validate)
    return _ops.offsets_range(offsets, range_size)


def _check_pooled(pooled_embs, offset_dim_list, permute_list, inv_offset_dim_list,
                  inv_permute_list, validate):
    validation.check_tensor("pooled_embs", pooled_embs, min_dim=2)
    for name, t in (("offset_dim_list", offset_dim_list), ("permute_list", permute_list),
                    ("inv_offset_dim_list", inv_offset_dim_list),
                    ("inv_permute_list", inv_permute_list)):
        validation.check_tensor(name, t, dim=1, dtypes=(torch.int64,))
    validation.check_same_device(pooled_embs=pooled_embs, offset_dim_list=offset_dim_list,
                              permute_list=permute_list, inv_offset_dim_list=inv_offset_dim_list,
                              inv_permute_list=inv_permute_list)
    t_count = permute_list.numel()
    for name, t, n in (("offset_dim_list", offset_dim_list, t_count + 1),
                       ("inv_offset_dim_list", inv_offset_dim_list, t_count + 1),
                       ("inv_permute_list", inv_permute_list, t_count)):
        if t.numel() != n:
            raise ValueError(f"{name}: needs {n} entries for {t_count} tables, got {t.numel()}")
    validation.check_offsets("offset_dim_list", offset_dim_list, None, validate)
    validation.check_permutation("permute_list", permute_list, validate)
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
