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
from .registry import OpSpec, choose, register

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

_ops = torch.ops.torchrec_ascend
OffsetsLike = Union[torch.Tensor, Sequence[torch.Tensor]]

OP_NAMES: List[str] = []
"""Every op this module registers (public ops and their ``_forward``/``_backward`` parts), in
registration order: what ``use_backend(..., ops=OP_NAMES)`` needs to force the whole family."""


def _register(s: OpSpec) -> OpSpec:
    OP_NAMES.append(s.name)
    return register(s)


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


_register(OpSpec(
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

_register(OpSpec(
    name="jagged_to_padded_dense_backward",
    schema="(Tensor grad_output, Tensor[] offsets, SymInt total_L) -> Tensor",
    reference=ref.jagged_to_padded_dense_backward,
    triton=triton_impl("jagged", "jagged_to_padded_dense_backward"),
    cpu_kernel="jagged_to_padded_dense_backward",
    fake=_j2d_bwd_fake,
    fbgemm=True,
    fbgemm_ascend=True,
))

_register(OpSpec(
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


def _clone_offsets(offsets: List[torch.Tensor]) -> List[torch.Tensor]:
    # outputs of a custom op may not alias its inputs: fbgemm hands back the offsets themselves
    return [o.clone() for o in offsets]


def _fake_offsets(offsets: List[torch.Tensor]) -> List[torch.Tensor]:
    return [o.new_empty(o.shape) for o in offsets]


def _no_grads(offsets: List[torch.Tensor]) -> list:
    return [None] * len(offsets)


# composite fbgemm names for the conversions (fbgemm: CompositeImplicitAutograd)


def _j2pd_composite(values, offsets, max_lengths, padding_value=0.0):
    return _ops.jagged_to_padded_dense_forward(values, offsets, max_lengths, padding_value)


def _d2j_composite(dense, x_offsets, total_L=None):
    return _ops.dense_to_jagged_forward(dense, x_offsets, total_L), _clone_offsets(x_offsets)


def _d2j_composite_fake(dense, x_offsets, total_L=None):
    return _d2j_fake(dense, x_offsets, total_L), _fake_offsets(x_offsets)


def _d2j_composite_backward(ctx, grad, _grad_offsets):
    return _d2j_backward(ctx, grad)


_register(OpSpec(
    name="jagged_to_padded_dense",
    schema="(Tensor values, Tensor[] offsets, SymInt[] max_lengths, float padding_value=0.) -> Tensor",
    reference=_j2pd_composite,
    fake=_j2d_fake,
    backward=_j2d_backward,
    setup_context=_j2d_setup,
    fbgemm=True,
    decomposes_in_fbgemm=True,
))

_register(OpSpec(
    name="dense_to_jagged",
    schema="(Tensor dense, Tensor[] x_offsets, SymInt? total_L=None) -> (Tensor, Tensor[])",
    reference=_d2j_composite,
    fake=_d2j_composite_fake,
    backward=_d2j_composite_backward,
    setup_context=_d2j_setup,
    fbgemm=True,
    decomposes_in_fbgemm=True,
))


# jagged_1d_to_dense / jagged_2d_to_dense: the older single-offsets names


def _j1d(values, offsets, max_sequence_length, padding_value):
    return _ops.jagged_to_padded_dense_forward(
        values, [offsets], [max_sequence_length], float(padding_value))


def _j1d_fake(values, offsets, max_sequence_length, padding_value):
    return values.new_empty((offsets.shape[0] - 1, max_sequence_length))


def _j2d2(values, offsets, max_sequence_length):
    return _ops.jagged_to_padded_dense_forward(values, [offsets], [max_sequence_length], 0.0)


def _j2d2_fake(values, offsets, max_sequence_length):
    return values.new_empty((offsets.shape[0] - 1, max_sequence_length, values.shape[1]))


def _single_off_setup(ctx, inputs, output):
    ctx.offsets = inputs[1]
    ctx.total_L = inputs[0].shape[0]


def _single_off_backward(ctx, grad):
    grad_values = _ops.jagged_to_padded_dense_backward(grad, [ctx.offsets], ctx.total_L)
    return grad_values, None, None, None


_register(OpSpec(
    name="jagged_1d_to_dense",
    schema="(Tensor values, Tensor offsets, SymInt max_sequence_length, int padding_value) -> Tensor",
    reference=_j1d,
    fake=_j1d_fake,
    backward=_single_off_backward,
    setup_context=_single_off_setup,
    fbgemm=True,
))

_register(OpSpec(
    name="jagged_2d_to_dense",
    schema="(Tensor values, Tensor offsets, SymInt max_sequence_length) -> Tensor",
    reference=_j2d2,
    fake=_j2d2_fake,
    backward=_single_off_backward,
    setup_context=_single_off_setup,
    fbgemm=True,
))


# stacked_jagged_2d_to_dense (+ the forward/backward pair fbgemm splits it into)

_STACKED_ARGS = "(Tensor values, Tensor lengths, int[] offset_per_key, int[] max_lengths_per_key, " \
    "int padding_value=0)"


def _stacked_fwd_fake(values, lengths, offset_per_key, max_lengths_per_key, padding_value=0):
    b = lengths.shape[1]
    padded = [values.new_empty((b, m, values.shape[1])) for m in max_lengths_per_key]
    offsets = [lengths.new_empty((b + 1,)) for _ in max_lengths_per_key]
    return padded, offsets


def _stacked_bwd_fake(B, D, total_L, grad_padded_values_per_key, offsets_tensor_per_key,
                      offset_per_key):
    return grad_padded_values_per_key[0].new_empty((total_L, D))


def _stacked(values, lengths, offset_per_key, max_lengths_per_key, padding_value=0):
    return _ops.stacked_jagged_2d_to_dense_forward(
        values, lengths, offset_per_key, max_lengths_per_key, padding_value)[0]


def _stacked_fake(values, lengths, offset_per_key, max_lengths_per_key, padding_value=0):
    return _stacked_fwd_fake(values, lengths, offset_per_key, max_lengths_per_key)[0]


def _stacked_setup(ctx, inputs, output):
    values, lengths, offset_per_key, max_lengths_per_key = inputs[:4]
    ctx.lengths = lengths
    ctx.offset_per_key = list(offset_per_key)
    ctx.shape = tuple(values.shape)
    ctx.max_lengths = list(max_lengths_per_key)


def _stacked_backward(ctx, grads):
    total_L, d = ctx.shape
    b = ctx.lengths.shape[1]
    grads = [g if g is not None else ctx.lengths.new_zeros((b, m, d), dtype=torch.float32)
             for g, m in zip(grads, ctx.max_lengths)]
    offsets = ref.stacked_offsets(ctx.lengths)
    grad_values = _ops.stacked_jagged_2d_to_dense_backward(
        b, d, total_L, grads, offsets, ctx.offset_per_key)
    return grad_values, None, None, None, None


_register(OpSpec(
    name="stacked_jagged_2d_to_dense_forward",
    schema=_STACKED_ARGS + " -> (Tensor[], Tensor[])",
    reference=ref.stacked_jagged_2d_to_dense_forward,
    fake=_stacked_fwd_fake,
    fbgemm=True,
))

_register(OpSpec(
    name="stacked_jagged_2d_to_dense_backward",
    schema="(int B, int D, int total_L, Tensor[] grad_padded_values_per_key, "
    "Tensor[] offsets_tensor_per_key, int[] offset_per_key) -> Tensor",
    reference=ref.stacked_jagged_2d_to_dense_backward,
    fake=_stacked_bwd_fake,
    fbgemm=True,
))

_register(OpSpec(
    name="stacked_jagged_2d_to_dense",
    schema=_STACKED_ARGS + " -> Tensor[]",
    reference=_stacked,
    fake=_stacked_fake,
    backward=_stacked_backward,
    setup_context=_stacked_setup,
    fbgemm=True,
))


# elementwise jagged (x) dense

_JD_ARGS = "(Tensor x_values, Tensor[] x_offsets, Tensor y)"


def _jd_setup(ctx, inputs, output):
    x_values, x_offsets, y = inputs[:3]
    ctx.offsets = x_offsets
    ctx.total_L = x_values.shape[0]
    ctx.max_len = y.shape[1]
    ctx.save_for_backward(x_values, y)


def _jd_add_fake(x_values, x_offsets, y):
    return torch.empty_like(y)


def _jd_add_backward(ctx, grad):
    grad_x = _ops.jagged_to_padded_dense_backward(grad, ctx.offsets, ctx.total_L)
    return grad_x, _no_grads(ctx.offsets), grad


def _jagged_like_fake(x_values, x_offsets, *dense):
    return torch.empty_like(x_values), _fake_offsets(x_offsets)


def _jd_add_jagged_backward(ctx, grad, _grad_offsets):
    grad_y = _ops.jagged_to_padded_dense_forward(grad, ctx.offsets, [ctx.max_len], 0.0)
    return grad, _no_grads(ctx.offsets), grad_y


def _jd_mul_backward(ctx, grad, *_grad_offsets):
    x_values, y = ctx.saved_tensors
    grad_x, grad_y = _ops.jagged_dense_elementwise_mul_backward(grad, ctx.offsets, y, x_values)
    return grad_x, _no_grads(ctx.offsets), grad_y


def _jd_mul(x_values, x_offsets, y):
    return _ops.jagged_dense_elementwise_mul_forward(x_values, x_offsets, y), _clone_offsets(x_offsets)


def _jdd_setup(ctx, inputs, output):
    x_values, x_offsets, y_0, y_1 = inputs
    ctx.offsets = x_offsets
    ctx.max_lens = (y_0.shape[1], y_1.shape[1])


def _jdd_backward(ctx, grad, *_grad_offsets):
    n0, n1 = ctx.max_lens
    g0 = _ops.jagged_to_padded_dense_forward(grad, ctx.offsets, [n0], 0.0)
    g1 = g0 if n1 == n0 else _ops.jagged_to_padded_dense_forward(grad, ctx.offsets, [n1], 0.0)
    return grad, _no_grads(ctx.offsets), g0, g1


def _jdd(x_values, x_offsets, y_0, y_1):
    out = _ops.jagged_dense_dense_elementwise_add_jagged_output_forward(x_values, x_offsets, y_0, y_1)
    return out, _clone_offsets(x_offsets)


_register(OpSpec(
    name="jagged_dense_elementwise_add",
    schema=_JD_ARGS + " -> Tensor",
    reference=ref.jagged_dense_elementwise_add,
    fake=_jd_add_fake,
    backward=_jd_add_backward,
    setup_context=_jd_setup,
    fbgemm=True,
))

_register(OpSpec(
    name="jagged_dense_elementwise_add_jagged_output",
    schema=_JD_ARGS + " -> (Tensor, Tensor[])",
    reference=ref.jagged_dense_elementwise_add_jagged_output,
    fake=_jagged_like_fake,
    backward=_jd_add_jagged_backward,
    setup_context=_jd_setup,
    fbgemm=True,
))

_register(OpSpec(
    name="jagged_dense_elementwise_mul_forward",
    schema=_JD_ARGS + " -> Tensor",
    reference=ref.jagged_dense_elementwise_mul_forward,
    fake=lambda x_values, x_offsets, y: torch.empty_like(x_values),
    backward=_jd_mul_backward,
    setup_context=_jd_setup,
    fbgemm=True,
))

_register(OpSpec(
    name="jagged_dense_elementwise_mul_backward",
    schema="(Tensor grad_output, Tensor[] x_offsets, Tensor y, Tensor x_values) -> (Tensor, Tensor)",
    reference=ref.jagged_dense_elementwise_mul_backward,
    fake=lambda grad_output, x_offsets, y, x_values: (torch.empty_like(grad_output),
                                                      torch.empty_like(y)),
    fbgemm=True,
))

_register(OpSpec(
    name="jagged_dense_elementwise_mul",
    schema=_JD_ARGS + " -> (Tensor, Tensor[])",
    reference=_jd_mul,
    fake=_jagged_like_fake,
    backward=_jd_mul_backward,
    setup_context=_jd_setup,
    fbgemm=True,
))

_register(OpSpec(
    name="jagged_dense_dense_elementwise_add_jagged_output_forward",
    schema="(Tensor x_values, Tensor[] x_offsets, Tensor y_0, Tensor y_1) -> Tensor",
    reference=ref.jagged_dense_dense_elementwise_add_jagged_output_forward,
    fake=lambda x_values, x_offsets, y_0, y_1: torch.empty_like(x_values),
    backward=_jdd_backward,
    setup_context=_jdd_setup,
    fbgemm=True,
))

_register(OpSpec(
    name="jagged_dense_dense_elementwise_add_jagged_output",
    schema="(Tensor x_values, Tensor[] x_offsets, Tensor y_0, Tensor y_1) -> (Tensor, Tensor[])",
    reference=_jdd,
    fake=_jagged_like_fake,
    backward=_jdd_backward,
    setup_context=_jdd_setup,
    fbgemm=True,
))


# jagged_softmax


def _softmax_setup(ctx, inputs, output):
    _, x_offsets, max_L = inputs
    ctx.offsets = x_offsets
    ctx.max_L = max_L
    ctx.save_for_backward(output[0] if isinstance(output, (tuple, list)) else output)


def _zero_past_max_L(op: str, t: torch.Tensor, offsets: torch.Tensor, max_L: int) -> torch.Tensor:
    """fbgemm's softmax kernels leave the rows past ``max_L`` uninitialised; where fbgemm runs
    ``op``, set them to 0 (the value every other backend writes)."""
    device = t.device.type
    if device not in ("cpu", "cuda") or choose(op, device)[0] != "fbgemm":
        return t
    _, pos = ref.jagged_rows(offsets, t.shape[0])
    return t.masked_fill((pos >= max_L).unsqueeze(1), 0)


def _softmax_backward(ctx, grad, *_grad_offsets):
    (out,) = ctx.saved_tensors
    grad_values = _ops.jagged_softmax_backward(grad, out, ctx.offsets, ctx.max_L)
    grad_values = _zero_past_max_L("jagged_softmax_backward", grad_values, ctx.offsets, ctx.max_L)
    return grad_values, None, None


def _softmax(values, x_offsets, max_L):
    return _ops.jagged_softmax_forward(values, x_offsets, max_L), x_offsets.clone()


_register(OpSpec(
    name="jagged_softmax_forward",
    schema="(Tensor values, Tensor x_offsets, int max_L) -> Tensor",
    reference=ref.jagged_softmax_forward,
    triton=triton_impl("jagged", "jagged_softmax_forward"),
    fake=lambda values, x_offsets, max_L: torch.empty_like(values),
    backward=_softmax_backward,
    setup_context=_softmax_setup,
    fbgemm=True,
))

_register(OpSpec(
    name="jagged_softmax_backward",
    schema="(Tensor grad_output, Tensor output, Tensor x_offsets, int max_L) -> Tensor",
    reference=ref.jagged_softmax_backward,
    triton=triton_impl("jagged", "jagged_softmax_backward"),
    fake=lambda grad_output, output, x_offsets, max_L: torch.empty_like(grad_output),
    fbgemm=True,
))

_register(OpSpec(
    name="jagged_softmax",
    schema="(Tensor values, Tensor x_offsets, int max_L) -> (Tensor, Tensor)",
    reference=_softmax,
    fake=lambda values, x_offsets, max_L: (torch.empty_like(values), torch.empty_like(x_offsets)),
    backward=_softmax_backward,
    setup_context=_softmax_setup,
    fbgemm=True,
))


# jagged_jagged_bmm / jagged_dense_bmm: each one's backward is made of the two forwards


def _jj_setup(ctx, inputs, output):
    x_values, y_values, x_offsets, max_L = inputs
    ctx.offsets, ctx.max_L = x_offsets, max_L
    ctx.save_for_backward(x_values, y_values)


def _jj_backward(ctx, grad):
    x_values, y_values = ctx.saved_tensors
    grad_x = grad_y = None
    if ctx.needs_input_grad[0]:
        grad_x = _ops.jagged_dense_bmm_forward(
            y_values, ctx.offsets, grad.transpose(1, 2).contiguous(), ctx.max_L)
    if ctx.needs_input_grad[1]:
        grad_y = _ops.jagged_dense_bmm_forward(x_values, ctx.offsets, grad.contiguous(), ctx.max_L)
    return grad_x, grad_y, None, None


def _jj_fake(x_values, y_values, x_offsets, max_L):
    return x_values.new_empty((x_offsets.shape[0] - 1, x_values.shape[1], y_values.shape[1]))


def _jdb_setup(ctx, inputs, output):
    x_values, x_offsets, y, max_L = inputs
    ctx.offsets, ctx.max_L = x_offsets, max_L
    ctx.save_for_backward(x_values, y)


def _jdb_backward(ctx, grad, *_grad_offsets):
    x_values, y = ctx.saved_tensors
    grad = grad.contiguous()
    grad_x = grad_y = None
    if ctx.needs_input_grad[0]:
        grad_x = _ops.jagged_dense_bmm_forward(grad, ctx.offsets, y.transpose(1, 2).contiguous(),
                                               ctx.max_L)
    if ctx.needs_input_grad[2]:
        grad_y = _ops.jagged_jagged_bmm_forward(x_values, grad, ctx.offsets, ctx.max_L)
    return grad_x, None, grad_y, None


def _jdb_fake(x_values, x_offsets, y, max_L):
    return x_values.new_empty((x_values.shape[0], y.shape[2]))


def _jdb(x_values, x_offsets, y, max_L):
    return _ops.jagged_dense_bmm_forward(x_values, x_offsets, y, max_L), x_offsets.clone()


_register(OpSpec(
    name="jagged_jagged_bmm_forward",
    schema="(Tensor x_values, Tensor y_values, Tensor x_offsets, int max_L) -> Tensor",
    reference=ref.jagged_jagged_bmm_forward,
    triton=triton_impl("jagged", "jagged_jagged_bmm_forward"),
    cpu_kernel="jagged_jagged_bmm_forward",
    fake=_jj_fake,
    backward=_jj_backward,
    setup_context=_jj_setup,
    fbgemm=True,
))

_register(OpSpec(
    name="jagged_jagged_bmm",
    schema="(Tensor x_values, Tensor y_values, Tensor x_offsets, int max_L) -> Tensor",
    reference=lambda x_values, y_values, x_offsets, max_L: _ops.jagged_jagged_bmm_forward(
        x_values, y_values, x_offsets, max_L),
    fake=_jj_fake,
    backward=_jj_backward,
    setup_context=_jj_setup,
    fbgemm=True,
))

_register(OpSpec(
    name="jagged_dense_bmm_forward",
    schema="(Tensor x_values, Tensor x_offsets, Tensor y, int max_L) -> Tensor",
    reference=ref.jagged_dense_bmm_forward,
    triton=triton_impl("jagged", "jagged_dense_bmm_forward"),
    cpu_kernel="jagged_dense_bmm_forward",
    fake=_jdb_fake,
    backward=_jdb_backward,
    setup_context=_jdb_setup,
    fbgemm=True,
))

_register(OpSpec(
    name="jagged_dense_bmm",
    schema="(Tensor x_values, Tensor x_offsets, Tensor y, int max_L) -> (Tensor, Tensor)",
    reference=_jdb,
    fake=lambda x_values, x_offsets, y, max_L: (_jdb_fake(x_values, x_offsets, y, max_L),
                                                torch.empty_like(x_offsets)),
    backward=_jdb_backward,
    setup_context=_jdb_setup,
    fbgemm=True,
))


# batched_dense_vec_jagged_2d_mul


def _bdv_setup(ctx, inputs, output):
    v, a_values, a_offsets = inputs
    ctx.offsets = a_offsets
    ctx.save_for_backward(v, a_values)


def _bdv_backward(ctx, grad):
    v, a_values = ctx.saved_tensors
    grad_v, grad_a = _ops.batched_dense_vec_jagged_2d_mul_backward(
        grad.contiguous(), v, a_values, ctx.offsets)
    return grad_v, grad_a, None


def _bdv_fake(v, a_values, a_offsets):
    b = a_offsets.shape[0] - 1
    h = ref.heads(v.shape[0], b)
    return v.new_empty((v.shape[0], a_values.shape[1] // h if h else 0))


_register(OpSpec(
    name="batched_dense_vec_jagged_2d_mul_forward",
    schema="(Tensor v, Tensor a_values, Tensor a_offsets) -> Tensor",
    reference=ref.batched_dense_vec_jagged_2d_mul_forward,
    fake=_bdv_fake,
    backward=_bdv_backward,
    setup_context=_bdv_setup,
    fbgemm=True,
))

_register(OpSpec(
    name="batched_dense_vec_jagged_2d_mul_backward",
    schema="(Tensor grad_output, Tensor v, Tensor a_values, Tensor a_offsets) -> (Tensor, Tensor)",
    reference=ref.batched_dense_vec_jagged_2d_mul_backward,
    fake=lambda grad_output, v, a_values, a_offsets: (torch.empty_like(v),
                                                      torch.empty_like(a_values)),
    fbgemm=True,
))

_register(OpSpec(
    name="batched_dense_vec_jagged_2d_mul",
    schema="(Tensor v, Tensor a_values, Tensor a_offsets) -> Tensor",
    reference=lambda v, a_values, a_offsets: _ops.batched_dense_vec_jagged_2d_mul_forward(
        v, a_values, a_offsets),
    fake=_bdv_fake,
    backward=_bdv_backward,
    setup_context=_bdv_setup,
    fbgemm=True,
))


# jagged_index_select / jagged_slice: row gathers whose backward scatters the rows back


def _select_setup(ctx, inputs, output):
    values, lengths, indices = inputs[:3]
    ctx.lengths, ctx.indices, ctx.total = lengths, indices, values.shape[0]


def _select_backward(ctx, grads):
    grad = grads[0]
    src, _ = ref.jagged_index_select_rows(ctx.lengths, ctx.indices, grad.shape[0])
    return ref.scatter_rows_back(grad, src, ctx.total), None, None, None


def _select_fake(values, lengths, indices, num_dense_output_rows=None):
    rows = num_dense_output_rows
    if rows is None:
        rows = torch.library.get_ctx().new_dynamic_size()
    return [values.new_empty((rows,) + tuple(values.shape[1:])), lengths.new_empty(indices.shape)]


def _slice_setup(ctx, inputs, output):
    x_values, x_lengths, start, slice_length = inputs
    ctx.lengths, ctx.start, ctx.slice_length = x_lengths, start, slice_length
    ctx.total = x_values.shape[0]


def _slice_backward(ctx, grad, _grad_lengths):
    src, _ = ref.jagged_slice_rows(ctx.lengths, ctx.start, ctx.slice_length)
    return ref.scatter_rows_back(grad, src, ctx.total), None, None, None


def _slice_fake(x_values, x_lengths, start, slice_length):
    rows = torch.library.get_ctx().new_dynamic_size()
    return x_values.new_empty((rows,) + tuple(x_values.shape[1:])), torch.empty_like(x_lengths)


_register(OpSpec(
    name="jagged_index_select",
    schema="(Tensor values, Tensor lengths, Tensor indices, int? num_dense_output_rows=None) "
    "-> Tensor[]",
    reference=ref.jagged_index_select,
    fake=_select_fake,
    backward=_select_backward,
    setup_context=_select_setup,
    fbgemm=True,
    decomposes_in_fbgemm=True,
))

_register(OpSpec(
    name="jagged_slice",
    schema="(Tensor x_values, Tensor x_lengths, Tensor start, int slice_length) -> (Tensor, Tensor)",
    reference=ref.jagged_slice,
    fake=_slice_fake,
    backward=_slice_backward,
    setup_context=_slice_setup,
    fbgemm=True,
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


def _offsets1(name: str, offsets: OffsetsLike) -> List[torch.Tensor]:
    """A one-element offsets list (a bare tensor is wrapped)."""
    return _offsets_list(offsets, name)


def _check_dense(name: str, y: torch.Tensor, x_values: torch.Tensor, b: int) -> None:
    """Dense partner ``[B, N, *inner]`` of a jagged ``[T, *inner]``."""
    _checks.check_tensor(name, y, dim=x_values.dim() + 1)
    _checks.check_same_dtype(x_values=x_values, **{name: y})
    _checks.check_same_device(x_values=x_values, **{name: y})
    if y.shape[0] != b or tuple(y.shape[2:]) != tuple(x_values.shape[1:]):
        raise ValueError(
            f"{name}: expected shape [B={b}, N, {', '.join(map(str, x_values.shape[1:]))}] "
            f"matching x_values, got {tuple(y.shape)}"
        )


def jagged_1d_to_dense(values: torch.Tensor, offsets: torch.Tensor, max_sequence_length: int,
                       padding_value: int = 0, validate: bool = True) -> torch.Tensor:
    """Pad 1-D jagged ``values [T]`` to ``[B, max_sequence_length]`` with ``padding_value``."""
    _checks.check_tensor("values", values, dim=1)
    _checks.check_offsets("offsets", offsets, values.shape[0], validate)
    _checks.check_same_device(values=values, offsets=offsets)
    _checks.check_nonneg_int("max_sequence_length", max_sequence_length)
    return _ops.jagged_1d_to_dense(values, offsets, max_sequence_length, int(padding_value))


def jagged_2d_to_dense(values: torch.Tensor, offsets: torch.Tensor, max_sequence_length: int,
                       validate: bool = True) -> torch.Tensor:
    """Pad 2-D jagged ``values [T, D]`` to ``[B, max_sequence_length, D]`` with zeros."""
    _checks.check_tensor("values", values, dim=2)
    _checks.check_offsets("offsets", offsets, values.shape[0], validate)
    _checks.check_same_device(values=values, offsets=offsets)
    _checks.check_nonneg_int("max_sequence_length", max_sequence_length)
    return _ops.jagged_2d_to_dense(values, offsets, max_sequence_length)


def stacked_jagged_2d_to_dense(
    values: torch.Tensor, lengths: torch.Tensor, offset_per_key: Sequence[int],
    max_lengths_per_key: Sequence[int], padding_value: int = 0, validate: bool = True,
) -> List[torch.Tensor]:
    """Pad each key of a keyed jagged batch: key ``k`` owns rows
    ``offset_per_key[k]:offset_per_key[k+1]`` of ``values [T, D]`` with lengths ``lengths[k]``
    (``lengths [K, B]``); returns ``K`` tensors ``[B, max_lengths_per_key[k], D]``."""
    _checks.check_tensor("values", values, dim=2, dtypes=_checks.FLOAT_DTYPES)
    _checks.check_tensor("lengths", lengths, dim=2, dtypes=_checks.INDEX_DTYPES)
    _checks.check_same_device(values=values, lengths=lengths)
    k = lengths.shape[0]
    offset_per_key = [int(o) for o in offset_per_key]
    max_lengths_per_key = [int(m) for m in max_lengths_per_key]
    if len(offset_per_key) != k + 1:
        raise ValueError(f"offset_per_key: expected K + 1 = {k + 1} entries, got {len(offset_per_key)}")
    _checks.check_max_lengths("max_lengths_per_key", max_lengths_per_key, k)
    if offset_per_key[0] != 0 or any(b < a for a, b in zip(offset_per_key, offset_per_key[1:])) \
            or offset_per_key[-1] > values.shape[0]:
        raise ValueError(f"offset_per_key: must start at 0, be non-decreasing and end <= "
                         f"{values.shape[0]} (rows of values), got {offset_per_key}")
    if validate:
        _checks.check_lengths("lengths", lengths.reshape(-1), None, True)
        sums = lengths.sum(1).tolist()
        spans = [b - a for a, b in zip(offset_per_key, offset_per_key[1:])]
        if sums != spans:
            raise ValueError(f"lengths: per-key sums {sums} must equal the spans of "
                             f"offset_per_key {spans}")
    return _ops.stacked_jagged_2d_to_dense(values, lengths, offset_per_key, max_lengths_per_key,
                                           int(padding_value))


def jagged_dense_elementwise_add(x_values: torch.Tensor, x_offsets: OffsetsLike, y: torch.Tensor,
                                 validate: bool = True) -> torch.Tensor:
    """Dense ``y [B, N, *inner]`` plus the jagged x padded with zeros (x truncated to N)."""
    offs = _offsets1("x_offsets", x_offsets)
    _checks.check_jagged("x_values", x_values, "x_offsets", offs[0], validate)
    _check_dense("y", y, x_values, offs[0].numel() - 1)
    return _ops.jagged_dense_elementwise_add(x_values, offs, y)


def jagged_dense_elementwise_add_jagged_output(
    x_values: torch.Tensor, x_offsets: OffsetsLike, y: torch.Tensor, validate: bool = True,
) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """Jagged ``x + y`` at x's positions (y counts as 0 past its N): ``(values, [offsets])``."""
    offs = _offsets1("x_offsets", x_offsets)
    _checks.check_jagged("x_values", x_values, "x_offsets", offs[0], validate)
    _check_dense("y", y, x_values, offs[0].numel() - 1)
    return _ops.jagged_dense_elementwise_add_jagged_output(x_values, offs, y)


def jagged_dense_elementwise_mul(
    x_values: torch.Tensor, x_offsets: OffsetsLike, y: torch.Tensor, validate: bool = True,
) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """Jagged ``x * y`` at x's positions (0 past y's N): ``(values, [offsets])``."""
    offs = _offsets1("x_offsets", x_offsets)
    _checks.check_jagged("x_values", x_values, "x_offsets", offs[0], validate)
    _check_dense("y", y, x_values, offs[0].numel() - 1)
    return _ops.jagged_dense_elementwise_mul(x_values, offs, y)


def jagged_dense_dense_elementwise_add_jagged_output(
    x_values: torch.Tensor, x_offsets: OffsetsLike, y_0: torch.Tensor, y_1: torch.Tensor,
    validate: bool = True,
) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """Jagged ``x + y_0 + y_1`` at x's positions: ``(values, [offsets])``."""
    offs = _offsets1("x_offsets", x_offsets)
    _checks.check_jagged("x_values", x_values, "x_offsets", offs[0], validate)
    _check_dense("y_0", y_0, x_values, offs[0].numel() - 1)
    _check_dense("y_1", y_1, x_values, offs[0].numel() - 1)
    return _ops.jagged_dense_dense_elementwise_add_jagged_output(x_values, offs, y_0, y_1)


def jagged_softmax(values: torch.Tensor, x_offsets: torch.Tensor, max_L: int,
                   validate: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """Softmax over each sequence (its first ``max_L`` rows), per column of ``values [T, D]``;
    rows past ``max_L`` are 0, and so is their gradient (fbgemm's kernels leave them
    uninitialised: the raw ``torch.ops.*.jagged_softmax*`` ops on the fbgemm backend keep that
    behaviour, this entry point zeroes them).  Returns ``(output, x_offsets)``."""
    _checks.check_jagged("values", values, "x_offsets", x_offsets, validate, dim=2)
    _checks.check_nonneg_int("max_L", max_L)
    out, offsets = _ops.jagged_softmax(values, x_offsets, max_L)
    return _zero_past_max_L("jagged_softmax", out, x_offsets, max_L), offsets


def jagged_jagged_bmm(x_values: torch.Tensor, y_values: torch.Tensor, x_offsets: torch.Tensor,
                      max_L: int, validate: bool = True) -> torch.Tensor:
    """``out[b] = x_b^T @ y_b`` over each sequence's first ``max_L`` rows: ``[B, M, N]`` from
    jagged ``x [T, M]`` and ``y [T, N]`` sharing ``x_offsets``."""
    _checks.check_jagged("x_values", x_values, "x_offsets", x_offsets, validate, dim=2)
    _checks.check_tensor("y_values", y_values, dim=2)
    _checks.check_same_dtype(x_values=x_values, y_values=y_values)
    _checks.check_same_device(x_values=x_values, y_values=y_values)
    if y_values.shape[0] != x_values.shape[0]:
        raise ValueError(f"y_values: has {y_values.shape[0]} rows, x_values has "
                         f"{x_values.shape[0]}; they share x_offsets so must match")
    _checks.check_nonneg_int("max_L", max_L)
    return _ops.jagged_jagged_bmm(x_values, y_values, x_offsets, max_L)


def jagged_dense_bmm(x_values: torch.Tensor, x_offsets: torch.Tensor, y: torch.Tensor, max_L: int,
                     validate: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """``out_b = x_b @ y[b]`` for jagged ``x [T, K]`` and dense ``y [B, K, N]`` (rows past
    ``max_L`` are 0).  Returns ``(out [T, N], x_offsets)``."""
    _checks.check_jagged("x_values", x_values, "x_offsets", x_offsets, validate, dim=2)
    _checks.check_tensor("y", y, dim=3)
    _checks.check_same_dtype(x_values=x_values, y=y)
    _checks.check_same_device(x_values=x_values, y=y)
    b = x_offsets.numel() - 1
    if y.shape[0] != b or y.shape[1] != x_values.shape[1]:
        raise ValueError(f"y: expected shape [B={b}, K={x_values.shape[1]}, N], got {tuple(y.shape)}")
    _checks.check_nonneg_int("max_L", max_L)
    return _ops.jagged_dense_bmm(x_values, x_offsets, y, max_L)


def batched_dense_vec_jagged_2d_mul(v: torch.Tensor, a_values: torch.Tensor,
                                    a_offsets: torch.Tensor, validate: bool = True) -> torch.Tensor:
    """``out[b*H + h] = v[b*H + h, :L_b] @ a_b[:, h*D:(h+1)*D]``: ``v [B*H, N]``, jagged
    ``a [T, H*D]`` (truncated to N rows per sequence) -> ``[B*H, D]``."""
    _checks.check_jagged("a_values", a_values, "a_offsets", a_offsets, validate, dim=2)
    _checks.check_tensor("v", v, dim=2)
    _checks.check_same_dtype(v=v, a_values=a_values)
    _checks.check_same_device(v=v, a_values=a_values)
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
    _checks.check_tensor("values", values, min_dim=1)
    _checks.check_lengths("lengths", lengths, values.shape[0], validate)
    _checks.check_tensor("indices", indices, dim=1, dtypes=_checks.INDEX_DTYPES)
    _checks.check_same_device(values=values, lengths=lengths, indices=indices)
    if validate and indices.numel():
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= lengths.numel():
            raise ValueError(f"indices: must lie in [0, {lengths.numel()}), got range [{lo}, {hi}]")
    if num_dense_output_rows is not None:
        _checks.check_nonneg_int("num_dense_output_rows", num_dense_output_rows)
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
    _checks.check_tensor("x_values", x_values, min_dim=1)
    _checks.check_lengths("x_lengths", x_lengths, x_values.shape[0], validate)
    _checks.check_tensor("start", start, dim=1, dtypes=_checks.INDEX_DTYPES)
    _checks.check_same_device(x_values=x_values, x_lengths=x_lengths, start=start)
    if start.numel() != x_lengths.numel():
        raise ValueError(f"start: has {start.numel()} entries, x_lengths has {x_lengths.numel()}")
    _checks.check_nonneg_int("slice_length", slice_length)
    if validate and start.numel():
        bad = (start < 0) | (start > x_lengths)
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0, 0])
            raise ValueError(f"start: must satisfy 0 <= start[b] <= x_lengths[b], but "
                             f"start[{i}]={int(start[i])}, x_lengths[{i}]={int(x_lengths[i])}")
    return _ops.jagged_slice(x_values, x_lengths, start, slice_length)
