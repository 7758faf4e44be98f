"""Registration table of the sparse-feature ops (TorchRec's training path): fake kernels,
autograd formulas and specs.

Names: ``<op>_fake`` is an op's fake (meta) kernel, ``<op>_setup_context`` / ``<op>_backward`` its
autograd formula (shared ones are named for what they serve).  Gradients flow to the float inputs
(values / weights / pooled embeddings); the integer structure (lengths, offsets, permutes) gets
None.  The schemas are fbgemm's.  :data:`SPECS` lists every op in registration order;
:func:`register_all` registers them.
"""

from __future__ import annotations

from typing import List, Optional

import torch

from ..measured import SCATTER_PREFETCH
from ..reference import sparse as ref
from ..registry import OpSpec, register

__all__ = ["SPECS", "register_all"]

_ops = torch.ops.torchrec_ascend


# --------------------------------------------------------------------------- fake kernels


def cumsum_fake(t_in):
    """Fake kernel of the exclusive / inclusive cumsums (same shape)."""
    return t_in.new_empty(t_in.shape)


def asynchronous_complete_cumsum_fake(t_in):
    return t_in.new_empty(tuple(t_in.shape[:-1]) + (t_in.shape[-1] + 1,))


def _dynamic_size(size: Optional[int]):
    return torch.library.get_ctx().new_dynamic_size() if size is None else size


def permute_2D_sparse_data_fake(permute, lengths, values, weights=None,
                                permuted_lengths_sum=None):
    n = _dynamic_size(permuted_lengths_sum)
    out_w = None if weights is None else weights.new_empty((n,) + tuple(weights.shape[1:]))
    return (lengths.new_empty((permute.shape[0],) + tuple(lengths.shape[1:])),
            values.new_empty((n,) + tuple(values.shape[1:])), out_w)


def permute_1D_sparse_data_fake(permute, lengths, values, weights=None,
                                permuted_lengths_sum=None):
    n = _dynamic_size(permuted_lengths_sum)
    out_w = None if weights is None else weights.new_empty((n,) + tuple(weights.shape[1:]))
    return lengths.new_empty(permute.shape), values.new_empty((n,) + tuple(values.shape[1:])), out_w


def block_bucketize_sparse_features_fake(lengths, indices, bucketize_pos, sequence, block_sizes,
                                         my_size, weights=None, batch_size_per_feature=None,
                                         max_B=-1, block_bucketize_pos=None, keep_orig_idx=False,
                                         total_num_blocks=None, keep_orig_idx_per_feature=None):
    return (lengths.new_empty((lengths.shape[0] * my_size,)),
            indices.new_empty(indices.shape),
            None if weights is None else weights.new_empty(weights.shape),
            indices.new_empty(indices.shape) if bucketize_pos else None,
            indices.new_empty(indices.shape) if sequence else None)


def invert_permute_fake(permute):
    return permute.new_empty(permute.shape)


def expand_into_jagged_permute_fake(permute, input_offset, output_offset, output_size):
    return input_offset.new_empty((output_size,))


def bounds_check_indices_fake(rows_per_table, indices, offsets, bounds_check_mode, warning,
                              weights=None, B_offsets=None, max_B=-1, b_t_map=None,
                              info_B_num_bits=-1, info_B_mask=-1, bounds_check_version=1,
                              prefetch_pipeline=False):
    return None


def segment_sum_csr_fake(batch_size, csr_seg, values):
    return values.new_empty((csr_seg.shape[0] - 1,))


def keyed_jagged_index_select_dim1_fake(values, lengths, offsets, indices, batch_size,
                                        weights=None, selected_lengths_sum=None):
    n = _dynamic_size(selected_lengths_sum)
    out = [values.new_empty((n,) + tuple(values.shape[1:])),
           lengths.new_empty((lengths.shape[0] // batch_size * indices.shape[0],))]
    if weights is not None:
        out.append(weights.new_empty((n,) + tuple(weights.shape[1:])))
    return out


def offsets_range_fake(offsets, range_size):
    return offsets.new_empty((range_size,))


def permute_pooled_embs_fake(pooled_embs, offset_dim_list, permute_list, inv_offset_dim_list,
                             inv_permute_list):
    return pooled_embs.new_empty(pooled_embs.shape)


# --------------------------------------------------------------------------- contracts
# fbgemm's argument rules on the raw ops (the csrc direct kernels check the same in C++)


def asynchronous_complete_cumsum_contract(t_in):
    """fbgemm: 1-D or 2-D input (RuntimeError)."""
    if t_in.dim() not in (1, 2):
        raise RuntimeError(f"asynchronous_complete_cumsum: t_in must be 1-D or 2-D, got "
                           f"{t_in.dim()}-D")


def block_bucketize_sparse_features_contract(lengths, indices, bucketize_pos, sequence,
                                             block_sizes, my_size, weights=None,
                                             batch_size_per_feature=None, max_B=-1,
                                             block_bucketize_pos=None, keep_orig_idx=False,
                                             total_num_blocks=None,
                                             keep_orig_idx_per_feature=None):
    """fbgemm: every ``total_num_blocks[t]`` is a multiple of ``my_size`` (RuntimeError)."""
    if total_num_blocks is None:
        return
    for t, v in enumerate(total_num_blocks.tolist()):
        if int(v) % int(my_size):
            raise RuntimeError(f"block_bucketize_sparse_features: total_num_blocks[{t}] = {v} "
                               f"must be a multiple of my_size ({int(my_size)})")


def bounds_check_indices_fbgemm_fixup(kernel, args):
    """fbgemm's FATAL error does not name the bad offset or id: where fbgemm's kernel rejects a
    FATAL call (it modifies nothing then), the reference check raises our ValueError naming it."""
    try:
        return kernel(*args)
    except RuntimeError:
        if int(args[3]) not in (ref.FATAL, ref.V2_FATAL):
            raise
        try:
            ref.bounds_check_indices(*args)
        except ValueError as ours:
            raise ours from None
        raise


# --------------------------------------------------------------------------- autograd formulas
# Gradients flow to the float inputs (values / weights / pooled embeddings); the integer
# structure (lengths, offsets, permutes) gets None.


def _scatter_back(grad: Optional[torch.Tensor], src: torch.Tensor, n: int) -> Optional[torch.Tensor]:
    if grad is None:
        return None
    return grad.new_zeros((n,) + tuple(grad.shape[1:])).index_add_(0, src, grad)


def _permute_setup(ctx, inputs, segment_lengths: torch.Tensor) -> None:
    permute, _, values = inputs[:3]
    weights = inputs[3] if len(inputs) > 3 else None
    ctx.save_for_backward(permute, segment_lengths)
    ctx.n_values = values.shape[0]
    ctx.n_weights = None if weights is None else weights.shape[0]


def permute_2D_sparse_data_setup_context(ctx, inputs, output):
    _permute_setup(ctx, inputs, inputs[1])  # a feature is a row of lengths [T, B]


def permute_1D_sparse_data_setup_context(ctx, inputs, output):
    _permute_setup(ctx, inputs, inputs[1].reshape(-1, 1))  # every entry is a segment


def permute_sparse_data_backward(ctx, grad_lengths, grad_values, grad_weights):
    permute, lengths = ctx.saved_tensors
    _, src = ref.permuted_sources(permute, lengths, grad_values.shape[0])
    gw = None if ctx.n_weights is None else _scatter_back(grad_weights, src, ctx.n_weights)
    return None, None, _scatter_back(grad_values, src, ctx.n_values), gw, None


def segment_sum_csr_setup_context(ctx, inputs, output):
    batch_size, csr_seg, values = inputs
    ctx.batch_size = batch_size
    ctx.n_values = values.shape[0]
    ctx.save_for_backward(csr_seg)


def segment_sum_csr_backward(ctx, grad):
    (csr_seg,) = ctx.saved_tensors
    return None, None, ref.segment_sum_csr_backward(ctx.batch_size, csr_seg, grad, ctx.n_values)


def keyed_jagged_index_select_dim1_setup_context(ctx, inputs, output):
    values, lengths, offsets, indices, batch_size = inputs[:5]
    ctx.save_for_backward(lengths, offsets, indices)
    ctx.batch_size = batch_size
    ctx.n_values = values.shape[0]


def keyed_jagged_index_select_dim1_backward(ctx, grads):
    lengths, offsets, indices = ctx.saved_tensors
    grad_values = grads[0]
    if grad_values is None:
        return None, None, None, None, None, None, None
    g = ref.keyed_jagged_index_select_dim1_backward(
        grad_values, lengths, offsets, indices, ctx.batch_size, ctx.n_values)
    # like fbgemm, weights get no gradient
    return g, None, None, None, None, None, None


def permute_pooled_embs_setup_context(ctx, inputs, output):
    _, offset_dim_list, permute_list, inv_offset_dim_list, inv_permute_list = inputs
    ctx.save_for_backward(offset_dim_list, permute_list, inv_offset_dim_list, inv_permute_list)


def permute_pooled_embs_backward_of(name: str):
    def backward(ctx, grad):
        offset_dim_list, permute_list, inv_offset_dim_list, inv_permute_list = ctx.saved_tensors
        g = getattr(_ops, name)(grad, inv_offset_dim_list, inv_permute_list, offset_dim_list,
                                permute_list)
        return g, None, None, None, None

    backward.__name__ = f"{name}_backward"
    return backward


# --------------------------------------------------------------------------- the table


_PERMUTE_SCHEMA = ("(Tensor permute, Tensor lengths, Tensor values, Tensor? weights=None, "
                   "SymInt? permuted_lengths_sum=None) -> (Tensor, Tensor, Tensor?)")
_POOLED_SCHEMA = ("(Tensor pooled_embs, Tensor offset_dim_list, Tensor permute_list, "
                  "Tensor inv_offset_dim_list, Tensor inv_permute_list) -> Tensor")

SPECS: List[OpSpec] = [
    OpSpec(
        name="asynchronous_complete_cumsum",
        schema="(Tensor t_in) -> Tensor",
        reference=ref.asynchronous_complete_cumsum,
        cpu_kernel="asynchronous_complete_cumsum_rows",  # 1-D and 2-D (csrc/sparse.cpp)
        fake=asynchronous_complete_cumsum_fake,
        contract=asynchronous_complete_cumsum_contract,
        fbgemm=True,
        fbgemm_ascend=True,
    ),
    OpSpec(
        name="asynchronous_exclusive_cumsum",
        schema="(Tensor t_in) -> Tensor",
        reference=ref.asynchronous_exclusive_cumsum,
        cpu_kernel="asynchronous_exclusive_cumsum",
        fake=cumsum_fake,
        fbgemm=True,
        fbgemm_ascend=True,
    ),
    OpSpec(
        name="asynchronous_inclusive_cumsum",
        schema="(Tensor t_in) -> Tensor",
        reference=ref.asynchronous_inclusive_cumsum,
        cpu_kernel="asynchronous_inclusive_cumsum",
        fake=cumsum_fake,
        fbgemm=True,
        fbgemm_ascend=True,
    ),
    OpSpec(
        name="permute_2D_sparse_data",
        schema=_PERMUTE_SCHEMA,
        reference=ref.permute_2D_sparse_data,
        cpu_kernel="permute_2D_sparse_data",
        fake=permute_2D_sparse_data_fake,
        backward=permute_sparse_data_backward,
        setup_context=permute_2D_sparse_data_setup_context,
        fbgemm=True,
        fbgemm_ascend=True,
    ),
    OpSpec(
        name="permute_1D_sparse_data",
        schema=_PERMUTE_SCHEMA,
        reference=ref.permute_1D_sparse_data,
        cpu_kernel="permute_1D_sparse_data",
        fake=permute_1D_sparse_data_fake,
        backward=permute_sparse_data_backward,
        setup_context=permute_1D_sparse_data_setup_context,
        fbgemm=True,
        fbgemm_ascend=True,
    ),
    OpSpec(
        name="block_bucketize_sparse_features",
        schema=("(Tensor lengths, Tensor indices, bool bucketize_pos, bool sequence, "
                "Tensor block_sizes, SymInt my_size, Tensor? weights=None, "
                "Tensor? batch_size_per_feature=None, SymInt max_B=-1, "
                "Tensor[]? block_bucketize_pos=None, bool keep_orig_idx=False, "
                "Tensor? total_num_blocks=None, Tensor? keep_orig_idx_per_feature=None) "
                "-> (Tensor, Tensor, Tensor?, Tensor?, Tensor?)"),
        reference=ref.block_bucketize_sparse_features,
        cpu_kernel="block_bucketize_sparse_features",
        fake=block_bucketize_sparse_features_fake,
        contract=block_bucketize_sparse_features_contract,
        fbgemm=True,
    ),
    OpSpec(
        name="invert_permute",
        schema="(Tensor permute) -> Tensor",
        reference=ref.invert_permute,
        cpu_kernel="invert_permute",
        fake=invert_permute_fake,
        fbgemm=True,
        detail=SCATTER_PREFETCH,
    ),
    OpSpec(
        name="expand_into_jagged_permute",
        schema="(Tensor permute, Tensor input_offset, Tensor output_offset, SymInt output_size) -> Tensor",
        reference=ref.expand_into_jagged_permute,
        cpu_kernel="expand_into_jagged_permute",
        fake=expand_into_jagged_permute_fake,
        fbgemm=True,
    ),
    OpSpec(
        name="bounds_check_indices",
        schema=("(Tensor rows_per_table, Tensor(a!) indices, Tensor(b!) offsets, "
                "int bounds_check_mode, Tensor(c!) warning, Tensor(d!)? weights=None, "
                "Tensor? B_offsets=None, SymInt max_B=-1, Tensor? b_t_map=None, "
                "int info_B_num_bits=-1, int info_B_mask=-1, int bounds_check_version=1, "
                "bool prefetch_pipeline=False) -> ()"),
        reference=ref.bounds_check_indices,
        cpu_kernel="bounds_check_indices",
        fake=bounds_check_indices_fake,
        fbgemm_fixup=bounds_check_indices_fbgemm_fixup,
        fbgemm=True,
    ),
    OpSpec(
        name="segment_sum_csr",
        schema="(SymInt batch_size, Tensor csr_seg, Tensor values) -> Tensor",
        reference=ref.segment_sum_csr,
        cpu_kernel="segment_sum_csr",
        fake=segment_sum_csr_fake,
        backward=segment_sum_csr_backward,
        setup_context=segment_sum_csr_setup_context,
        fbgemm=True,
        fbgemm_ascend=True,
    ),
    OpSpec(
        name="keyed_jagged_index_select_dim1",
        schema=("(Tensor values, Tensor lengths, Tensor offsets, Tensor indices, SymInt batch_size, "
                "Tensor? weights=None, SymInt? selected_lengths_sum=None) -> Tensor[]"),
        reference=ref.keyed_jagged_index_select_dim1,
        cpu_kernel="keyed_jagged_index_select_dim1",
        fake=keyed_jagged_index_select_dim1_fake,
        backward=keyed_jagged_index_select_dim1_backward,
        setup_context=keyed_jagged_index_select_dim1_setup_context,
        fbgemm=True,
    ),
    OpSpec(
        name="offsets_range",
        schema="(Tensor offsets, SymInt range_size) -> Tensor",
        reference=ref.offsets_range,
        cpu_kernel="offsets_range",
        fake=offsets_range_fake,
        fbgemm=True,
        fbgemm_ascend=True,
    ),
]

# permute_pooled_embs_split: what fbgemm's autograd kernel of ..._auto_grad_split calls on CPU
# (TorchRec's column-wise sharding), so it is replaceable too
SPECS += [
    OpSpec(
        name=name,
        schema=_POOLED_SCHEMA,
        reference=ref.permute_pooled_embs,
        cpu_kernel="permute_pooled_embs",
        fake=permute_pooled_embs_fake,
        backward=permute_pooled_embs_backward_of(name),
        setup_context=permute_pooled_embs_setup_context,
        fbgemm=True,
        fbgemm_ascend=ascend,
    )
    for name, ascend in (("permute_pooled_embs", True), ("permute_pooled_embs_auto_grad", True),
                         ("permute_pooled_embs_auto_grad_split", False),
                         ("permute_pooled_embs_split", False))
]


def register_all() -> None:
    """Register every spec of :data:`SPECS` (once: importing :mod:`torchrec_ascend.ops`)."""
    for s in SPECS:
        register(s)
