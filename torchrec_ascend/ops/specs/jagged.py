"""Registration table of the jagged op family: fake kernels, autograd formulas and specs.

Names: ``<op>_fake`` is an op's fake (meta) kernel, ``<op>_setup_context`` / ``<op>_backward`` its
autograd formula; a composite (fbgemm's public name over its ``_forward`` / ``_backward`` pair)
reuses the pair's formula.  The table :data:`SPECS` lists every op in registration order;
:func:`register_all` registers them (importing :mod:`torchrec_ascend.ops` does it once).

Jagged tensors take any number of jagged dimensions in the conversions and the elementwise ops
(``offsets`` is a list of ``J`` tensors, the dense partner ``[B, N_0, ..., N_{J-1}, D]``); the
csrc kernels cover every case (so they are the dispatcher's direct CPU kernels), the Triton
kernels one jagged dimension in fp32/fp16/bf16 (their :class:`Limit`): other calls go on to the
next backend.
"""

from __future__ import annotations

from typing import List, Sequence

import torch

from .._util import triton_impl
from ..reference import jagged as ref
from ..registry import Limit, OpSpec, register

__all__ = ["SPECS", "OP_NAMES", "register_all"]

_ops = torch.ops.torchrec_ascend


_TRITON_FLOAT = (torch.float32, torch.float16, torch.bfloat16)


def _triton_jagged_limit(offsets_arg: int, tensor_arg: int) -> Limit:
    return Limit("one jagged dimension, fp32/fp16/bf16",
                 lambda *args: len(args[offsets_arg]) == 1
                 and args[tensor_arg].dtype in _TRITON_FLOAT)


def _clone_offsets(offsets: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    # outputs of a custom op may not alias its inputs: fbgemm hands back the offsets themselves
    return [o.clone() for o in offsets]


def _fake_offsets(offsets: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    return [o.new_empty(o.shape) for o in offsets]


def _no_grads(offsets: Sequence[torch.Tensor]) -> list:
    return [None] * len(offsets)


def _dense_dims(t: torch.Tensor, offsets: Sequence[torch.Tensor]) -> List[int]:
    return list(t.shape[1:1 + len(offsets)])


# --------------------------------------------------------------------------- contracts
# fbgemm's argument rules on the raw ops (raised on every backend, as fbgemm does)


def _total_rows(offsets: Sequence[torch.Tensor], total_L) -> int:
    if total_L is not None:
        return int(total_L)
    last = offsets[-1]
    return int(last.max()) if last.numel() else 0


def dense_to_jagged_contract(dense, x_offsets, total_L=None):
    """fbgemm: the values rows (``total_L``, or the largest last-dimension offset) are >= 0."""
    total = _total_rows(x_offsets, total_L)
    if total < 0:
        raise ValueError(f"total_L: must be >= 0, got {total}"
                         + ("" if total_L is not None else " (the largest offset of the last "
                            "jagged dimension)"))


def jagged_to_padded_dense_backward_contract(grad_output, offsets, total_L):
    if int(total_L) < 0:
        raise ValueError(f"total_L: must be >= 0, got {int(total_L)}")


# --------------------------------------------------------------------------- conversions


def jagged_to_padded_dense_forward_fake(values, offsets, max_lengths, padding_value=0.0):
    return values.new_empty((offsets[0].shape[0] - 1, *max_lengths) + tuple(values.shape[1:]))


def jagged_to_padded_dense_forward_setup_context(ctx, inputs, output):
    values, offsets = inputs[:2]
    ctx.offsets = offsets
    ctx.total_L = values.shape[0]


def jagged_to_padded_dense_forward_backward(ctx, grad):
    grad_values = _ops.jagged_to_padded_dense_backward(grad, ctx.offsets, ctx.total_L)
    return grad_values, _no_grads(ctx.offsets), None, None


def jagged_to_padded_dense_backward_fake(grad_output, offsets, total_L):
    return grad_output.new_empty((total_L,) + tuple(grad_output.shape[1 + len(offsets):]))


def dense_to_jagged_forward_fake(dense, x_offsets, total_L=None):
    if total_L is None:
        total_L = torch.library.get_ctx().new_dynamic_size()
    return dense.new_empty((total_L,) + tuple(dense.shape[1 + len(x_offsets):]))


def dense_to_jagged_forward_setup_context(ctx, inputs, output):
    dense, offsets = inputs[:2]
    ctx.offsets = offsets
    ctx.max_lengths = _dense_dims(dense, offsets)


def dense_to_jagged_forward_backward(ctx, grad, *_grad_offsets):
    grad_dense = _ops.jagged_to_padded_dense_forward(grad, ctx.offsets, ctx.max_lengths, 0.0)
    return grad_dense, _no_grads(ctx.offsets), None


def jagged_to_padded_dense(values, offsets, max_lengths, padding_value=0.0):
    return _ops.jagged_to_padded_dense_forward(values, offsets, max_lengths, padding_value)


def dense_to_jagged(dense, x_offsets, total_L=None):
    return _ops.dense_to_jagged_forward(dense, x_offsets, total_L), _clone_offsets(x_offsets)


def dense_to_jagged_fake(dense, x_offsets, total_L=None):
    return dense_to_jagged_forward_fake(dense, x_offsets, total_L), _fake_offsets(x_offsets)


# jagged_1d_to_dense / jagged_2d_to_dense: fbgemm's older single-offsets names


def jagged_1d_to_dense_reference(values, offsets, max_sequence_length, padding_value):
    return _ops.jagged_to_padded_dense_forward(
        values, [offsets], [max_sequence_length], float(padding_value))


def jagged_1d_to_dense_fake(values, offsets, max_sequence_length, padding_value):
    return values.new_empty((offsets.shape[0] - 1, max_sequence_length))


def jagged_2d_to_dense_reference(values, offsets, max_sequence_length):
    return _ops.jagged_to_padded_dense_forward(values, [offsets], [max_sequence_length], 0.0)


def jagged_2d_to_dense_fake(values, offsets, max_sequence_length):
    return values.new_empty((offsets.shape[0] - 1, max_sequence_length, values.shape[1]))


def jagged_nd_to_dense_setup_context(ctx, inputs, output):
    ctx.offsets = inputs[1]
    ctx.total_L = inputs[0].shape[0]


def jagged_nd_to_dense_backward(ctx, grad):
    grad_values = _ops.jagged_to_padded_dense_backward(grad, [ctx.offsets], ctx.total_L)
    return grad_values, None, None, None


# stacked_jagged_2d_to_dense (+ the forward / backward pair fbgemm splits it into)

_STACKED_ARGS = ("(Tensor values, Tensor lengths, int[] offset_per_key, "
                 "int[] max_lengths_per_key, int padding_value=0)")


def stacked_jagged_2d_to_dense_forward_fake(values, lengths, offset_per_key, max_lengths_per_key,
                                            padding_value=0):
    b = lengths.shape[1]
    padded = [values.new_empty((b, m, values.shape[1])) for m in max_lengths_per_key]
    offsets = [lengths.new_empty((b + 1,)) for _ in max_lengths_per_key]
    return padded, offsets


def stacked_jagged_2d_to_dense_backward_fake(B, D, total_L, grad_padded_values_per_key,
                                             offsets_tensor_per_key, offset_per_key):
    return grad_padded_values_per_key[0].new_empty((total_L, D))


def stacked_jagged_2d_to_dense_reference(values, lengths, offset_per_key, max_lengths_per_key,
                                         padding_value=0):
    return _ops.stacked_jagged_2d_to_dense_forward(
        values, lengths, offset_per_key, max_lengths_per_key, padding_value)[0]


def stacked_jagged_2d_to_dense_fake(values, lengths, offset_per_key, max_lengths_per_key,
                                    padding_value=0):
    return stacked_jagged_2d_to_dense_forward_fake(values, lengths, offset_per_key,
                                                   max_lengths_per_key)[0]


def stacked_jagged_2d_to_dense_setup_context(ctx, inputs, output):
    values, lengths, offset_per_key, max_lengths_per_key = inputs[:4]
    ctx.lengths = lengths
    ctx.offset_per_key = list(offset_per_key)
    ctx.shape = tuple(values.shape)
    ctx.dtype = values.dtype
    ctx.max_lengths = list(max_lengths_per_key)


def stacked_jagged_2d_to_dense_backward(ctx, grads):
    total_L, d = ctx.shape
    b = ctx.lengths.shape[1]
    grads = [g if g is not None else torch.zeros((b, m, d), dtype=ctx.dtype,
                                                   device=ctx.lengths.device)
             for g, m in zip(grads, ctx.max_lengths)]
    offsets = ref.stacked_offsets(ctx.lengths)
    grad_values = _ops.stacked_jagged_2d_to_dense_backward(
        b, d, total_L, grads, offsets, ctx.offset_per_key)
    return grad_values, None, None, None, None


# --------------------------------------------------------------------------- elementwise

_JD_ARGS = "(Tensor x_values, Tensor[] x_offsets, Tensor y)"


def jagged_dense_setup_context(ctx, inputs, output):
    """Shared by the jagged (x) dense ops: offsets, total rows, the dense dims, x and y."""
    x_values, x_offsets, y = inputs[:3]
    ctx.offsets = x_offsets
    ctx.total_L = x_values.shape[0]
    ctx.max_lengths = _dense_dims(y, x_offsets)
    ctx.save_for_backward(x_values, y)


def jagged_dense_elementwise_add_fake(x_values, x_offsets, y):
    return torch.empty_like(y)


def jagged_dense_elementwise_add_backward(ctx, grad):
    grad_x = _ops.jagged_to_padded_dense_backward(grad, ctx.offsets, ctx.total_L)
    return grad_x, _no_grads(ctx.offsets), grad


def jagged_output_fake(x_values, x_offsets, *dense):
    """Fake kernel of the ops returning ``(jagged values like x, offsets)``."""
    return torch.empty_like(x_values), _fake_offsets(x_offsets)


def jagged_dense_elementwise_add_jagged_output_backward(ctx, grad, *_grad_offsets):
    grad_y = _ops.jagged_to_padded_dense_forward(grad, ctx.offsets, ctx.max_lengths, 0.0)
    return grad, _no_grads(ctx.offsets), grad_y


def jagged_dense_elementwise_mul_forward_fake(x_values, x_offsets, y):
    return torch.empty_like(x_values)


def jagged_dense_elementwise_mul_forward_backward(ctx, grad, *_grad_offsets):
    x_values, y = ctx.saved_tensors
    grad_x, grad_y = _ops.jagged_dense_elementwise_mul_backward(grad, ctx.offsets, y, x_values)
    return grad_x, _no_grads(ctx.offsets), grad_y


def jagged_dense_elementwise_mul_backward_fake(grad_output, x_offsets, y, x_values):
    return torch.empty_like(grad_output), torch.empty_like(y)


def jagged_dense_elementwise_mul(x_values, x_offsets, y):
    return (_ops.jagged_dense_elementwise_mul_forward(x_values, x_offsets, y),
            _clone_offsets(x_offsets))


def jagged_dense_dense_elementwise_add_jagged_output_forward_fake(x_values, x_offsets, y_0, y_1):
    return torch.empty_like(x_values)


def jagged_dense_dense_elementwise_add_jagged_output_setup_context(ctx, inputs, output):
    x_values, x_offsets, y_0, y_1 = inputs
    ctx.offsets = x_offsets
    ctx.max_lengths = (_dense_dims(y_0, x_offsets), _dense_dims(y_1, x_offsets))


def jagged_dense_dense_elementwise_add_jagged_output_backward(ctx, grad, *_grad_offsets):
    n0, n1 = ctx.max_lengths
    g0 = _ops.jagged_to_padded_dense_forward(grad, ctx.offsets, n0, 0.0)
    g1 = g0 if n1 == n0 else _ops.jagged_to_padded_dense_forward(grad, ctx.offsets, n1, 0.0)
    return grad, _no_grads(ctx.offsets), g0, g1


def jagged_dense_dense_elementwise_add_jagged_output(x_values, x_offsets, y_0, y_1):
    out = _ops.jagged_dense_dense_elementwise_add_jagged_output_forward(x_values, x_offsets,
                                                                        y_0, y_1)
    return out, _clone_offsets(x_offsets)


# --------------------------------------------------------------------------- softmax


def _zero_past_max_L(t: torch.Tensor, offsets: torch.Tensor, max_L: int) -> torch.Tensor:
    _, pos = ref.jagged_rows(offsets, t.shape[0])
    return t.masked_fill((pos >= max_L).unsqueeze(1), 0)


# fbgemm's softmax kernels leave the rows past max_L uninitialised: where fbgemm serves one of
# the softmax ops, the registry runs its fix-up, which sets them to 0 (what our backends write)


def jagged_softmax_forward_fbgemm_fixup(kernel, args):
    values, x_offsets, max_L = args
    return _zero_past_max_L(kernel(*args), x_offsets, max_L)


def jagged_softmax_fbgemm_fixup(kernel, args):
    values, x_offsets, max_L = args
    out, offsets = kernel(*args)
    return _zero_past_max_L(out, x_offsets, max_L), offsets


def jagged_softmax_backward_fbgemm_fixup(kernel, args):
    grad_output, output, x_offsets, max_L = args
    return _zero_past_max_L(kernel(*args), x_offsets, max_L)


def jagged_softmax_setup_context(ctx, inputs, output):
    _, x_offsets, max_L = inputs
    ctx.offsets = x_offsets
    ctx.max_L = max_L
    ctx.save_for_backward(output[0] if isinstance(output, (tuple, list)) else output)


def jagged_softmax_backward(ctx, grad, *_grad_offsets):
    (out,) = ctx.saved_tensors
    return _ops.jagged_softmax_backward(grad, out, ctx.offsets, ctx.max_L), None, None


def jagged_softmax(values, x_offsets, max_L):
    return _ops.jagged_softmax_forward(values, x_offsets, max_L), x_offsets.clone()


def jagged_softmax_fake(values, x_offsets, max_L):
    return torch.empty_like(values), torch.empty_like(x_offsets)


def jagged_softmax_forward_fake(values, x_offsets, max_L):
    return torch.empty_like(values)


def jagged_softmax_backward_fake(grad_output, output, x_offsets, max_L):
    return torch.empty_like(grad_output)


# --------------------------------------------------------------------------- batched GEMMs
# each one's backward is made of the two forwards


def jagged_jagged_bmm_setup_context(ctx, inputs, output):
    x_values, y_values, x_offsets, max_L = inputs
    ctx.offsets, ctx.max_L = x_offsets, max_L
    ctx.save_for_backward(x_values, y_values)


def jagged_jagged_bmm_backward(ctx, grad):
    x_values, y_values = ctx.saved_tensors
    grad_x = grad_y = None
    if ctx.needs_input_grad[0]:
        grad_x = _ops.jagged_dense_bmm_forward(
            y_values, ctx.offsets, grad.transpose(1, 2).contiguous(), ctx.max_L)
    if ctx.needs_input_grad[1]:
        grad_y = _ops.jagged_dense_bmm_forward(x_values, ctx.offsets, grad.contiguous(), ctx.max_L)
    return grad_x, grad_y, None, None


def jagged_jagged_bmm_fake(x_values, y_values, x_offsets, max_L):
    return x_values.new_empty((x_offsets.shape[0] - 1, x_values.shape[1], y_values.shape[1]))


def jagged_jagged_bmm(x_values, y_values, x_offsets, max_L):
    return _ops.jagged_jagged_bmm_forward(x_values, y_values, x_offsets, max_L)


def jagged_dense_bmm_setup_context(ctx, inputs, output):
    x_values, x_offsets, y, max_L = inputs
    ctx.offsets, ctx.max_L = x_offsets, max_L
    ctx.save_for_backward(x_values, y)


def jagged_dense_bmm_backward(ctx, grad, *_grad_offsets):
    x_values, y = ctx.saved_tensors
    grad = grad.contiguous()
    grad_x = grad_y = None
    if ctx.needs_input_grad[0]:
        grad_x = _ops.jagged_dense_bmm_forward(grad, ctx.offsets, y.transpose(1, 2).contiguous(),
                                               ctx.max_L)
    if ctx.needs_input_grad[2]:
        grad_y = _ops.jagged_jagged_bmm_forward(x_values, grad, ctx.offsets, ctx.max_L)
    return grad_x, None, grad_y, None


def jagged_dense_bmm_forward_fake(x_values, x_offsets, y, max_L):
    return x_values.new_empty((x_values.shape[0], y.shape[2]))


def jagged_dense_bmm_fake(x_values, x_offsets, y, max_L):
    return jagged_dense_bmm_forward_fake(x_values, x_offsets, y, max_L), torch.empty_like(x_offsets)


def jagged_dense_bmm(x_values, x_offsets, y, max_L):
    return _ops.jagged_dense_bmm_forward(x_values, x_offsets, y, max_L), x_offsets.clone()


def batched_dense_vec_jagged_2d_mul_setup_context(ctx, inputs, output):
    v, a_values, a_offsets = inputs
    ctx.offsets = a_offsets
    ctx.save_for_backward(v, a_values)


def batched_dense_vec_jagged_2d_mul_backward(ctx, grad):
    v, a_values = ctx.saved_tensors
    grad_v, grad_a = _ops.batched_dense_vec_jagged_2d_mul_backward(
        grad.contiguous(), v, a_values, ctx.offsets)
    return grad_v, grad_a, None


def batched_dense_vec_jagged_2d_mul_fake(v, a_values, a_offsets):
    b = a_offsets.shape[0] - 1
    h = ref.heads(v.shape[0], b)
    return v.new_empty((v.shape[0], a_values.shape[1] // h if h else 0))


def batched_dense_vec_jagged_2d_mul_backward_fake(grad_output, v, a_values, a_offsets):
    return torch.empty_like(v), torch.empty_like(a_values)


def batched_dense_vec_jagged_2d_mul(v, a_values, a_offsets):
    return _ops.batched_dense_vec_jagged_2d_mul_forward(v, a_values, a_offsets)


# --------------------------------------------------------------------------- selection
# row gathers whose backward scatters the rows back


def jagged_index_select_setup_context(ctx, inputs, output):
    values, lengths, indices = inputs[:3]
    ctx.lengths, ctx.indices, ctx.total = lengths, indices, values.shape[0]


def jagged_index_select_backward(ctx, grads):
    grad = grads[0]
    src, _ = ref.jagged_index_select_rows(ctx.lengths, ctx.indices, grad.shape[0])
    return ref.scatter_rows_back(grad, src, ctx.total), None, None, None


def jagged_index_select_fake(values, lengths, indices, num_dense_output_rows=None):
    rows = num_dense_output_rows
    if rows is None:
        rows = torch.library.get_ctx().new_dynamic_size()
    return [values.new_empty((rows,) + tuple(values.shape[1:])), lengths.new_empty(indices.shape)]


def jagged_slice_setup_context(ctx, inputs, output):
    x_values, x_lengths, start, slice_length = inputs
    ctx.lengths, ctx.start, ctx.slice_length = x_lengths, start, slice_length
    ctx.total = x_values.shape[0]


def jagged_slice_backward(ctx, grad, _grad_lengths):
    src, _ = ref.jagged_slice_rows(ctx.lengths, ctx.start, ctx.slice_length)
    return ref.scatter_rows_back(grad, src, ctx.total), None, None, None


def jagged_slice_fake(x_values, x_lengths, start, slice_length):
    rows = torch.library.get_ctx().new_dynamic_size()
    return x_values.new_empty((rows,) + tuple(x_values.shape[1:])), torch.empty_like(x_lengths)


# --------------------------------------------------------------------------- the table

SPECS: List[OpSpec] = [
    # conversions
    OpSpec(
        name="jagged_to_padded_dense_forward",
        schema="(Tensor values, Tensor[] offsets, SymInt[] max_lengths, "
               "float padding_value=0.) -> Tensor",
        reference=ref.jagged_to_padded_dense_forward,
        triton=triton_impl("jagged", "jagged_to_padded_dense_forward"),
        cpu_kernel="jagged_to_padded_dense_forward",
        fake=jagged_to_padded_dense_forward_fake,
        backward=jagged_to_padded_dense_forward_backward,
        setup_context=jagged_to_padded_dense_forward_setup_context,
        fbgemm=True, fbgemm_ascend=True,
        limits={"triton": _triton_jagged_limit(1, 0)},
    ),
    OpSpec(
        name="jagged_to_padded_dense_backward",
        schema="(Tensor grad_output, Tensor[] offsets, SymInt total_L) -> Tensor",
        reference=ref.jagged_to_padded_dense_backward,
        triton=triton_impl("jagged", "jagged_to_padded_dense_backward"),
        cpu_kernel="jagged_to_padded_dense_backward",
        fake=jagged_to_padded_dense_backward_fake,
        contract=jagged_to_padded_dense_backward_contract,
        fbgemm=True, fbgemm_ascend=True,
        limits={"triton": _triton_jagged_limit(1, 0)},
    ),
    OpSpec(
        name="dense_to_jagged_forward",
        schema="(Tensor dense, Tensor[] x_offsets, SymInt? total_L=None) -> Tensor",
        reference=ref.dense_to_jagged_forward,
        triton=triton_impl("jagged", "dense_to_jagged_forward"),
        cpu_kernel="dense_to_jagged_forward",
        fake=dense_to_jagged_forward_fake,
        backward=dense_to_jagged_forward_backward,
        setup_context=dense_to_jagged_forward_setup_context,
        contract=dense_to_jagged_contract,
        fbgemm=True, fbgemm_ascend=True,
        limits={"triton": _triton_jagged_limit(1, 0)},
    ),
    OpSpec(
        name="jagged_to_padded_dense",
        schema="(Tensor values, Tensor[] offsets, SymInt[] max_lengths, "
               "float padding_value=0.) -> Tensor",
        reference=jagged_to_padded_dense,
        cpu_kernel="jagged_to_padded_dense_forward",
        fake=jagged_to_padded_dense_forward_fake,
        backward=jagged_to_padded_dense_forward_backward,
        setup_context=jagged_to_padded_dense_forward_setup_context,
        fbgemm=True, decomposes_in_fbgemm=True,
    ),
    OpSpec(
        name="dense_to_jagged",
        schema="(Tensor dense, Tensor[] x_offsets, SymInt? total_L=None) -> (Tensor, Tensor[])",
        reference=dense_to_jagged,
        cpu_kernel="dense_to_jagged",
        fake=dense_to_jagged_fake,
        backward=dense_to_jagged_forward_backward,
        setup_context=dense_to_jagged_forward_setup_context,
        contract=dense_to_jagged_contract,
        fbgemm=True, decomposes_in_fbgemm=True,
    ),
    OpSpec(
        name="jagged_1d_to_dense",
        schema="(Tensor values, Tensor offsets, SymInt max_sequence_length, "
               "int padding_value) -> Tensor",
        reference=jagged_1d_to_dense_reference,
        cpu_kernel="jagged_1d_to_dense",
        fake=jagged_1d_to_dense_fake,
        backward=jagged_nd_to_dense_backward,
        setup_context=jagged_nd_to_dense_setup_context,
        fbgemm=True,
    ),
    OpSpec(
        name="jagged_2d_to_dense",
        schema="(Tensor values, Tensor offsets, SymInt max_sequence_length) -> Tensor",
        reference=jagged_2d_to_dense_reference,
        cpu_kernel="jagged_2d_to_dense",
        fake=jagged_2d_to_dense_fake,
        backward=jagged_nd_to_dense_backward,
        setup_context=jagged_nd_to_dense_setup_context,
        fbgemm=True,
    ),
    OpSpec(
        name="stacked_jagged_2d_to_dense_forward",
        schema=_STACKED_ARGS + " -> (Tensor[], Tensor[])",
        reference=ref.stacked_jagged_2d_to_dense_forward,
        cpu_kernel="stacked_jagged_2d_to_dense_forward",
        fake=stacked_jagged_2d_to_dense_forward_fake,
        fbgemm=True,
    ),
    OpSpec(
        name="stacked_jagged_2d_to_dense_backward",
        schema="(int B, int D, int total_L, Tensor[] grad_padded_values_per_key, "
               "Tensor[] offsets_tensor_per_key, int[] offset_per_key) -> Tensor",
        reference=ref.stacked_jagged_2d_to_dense_backward,
        cpu_kernel="stacked_jagged_2d_to_dense_backward",
        fake=stacked_jagged_2d_to_dense_backward_fake,
        fbgemm=True,
    ),
    OpSpec(
        name="stacked_jagged_2d_to_dense",
        schema=_STACKED_ARGS + " -> Tensor[]",
        reference=stacked_jagged_2d_to_dense_reference,
        cpu_kernel="stacked_jagged_2d_to_dense",
        fake=stacked_jagged_2d_to_dense_fake,
        backward=stacked_jagged_2d_to_dense_backward,
        setup_context=stacked_jagged_2d_to_dense_setup_context,
        fbgemm=True,
    ),
    # elementwise jagged (x) dense
    OpSpec(
        name="jagged_dense_elementwise_add",
        schema=_JD_ARGS + " -> Tensor",
        reference=ref.jagged_dense_elementwise_add,
        cpu_kernel="jagged_dense_elementwise_add",
        fake=jagged_dense_elementwise_add_fake,
        backward=jagged_dense_elementwise_add_backward,
        setup_context=jagged_dense_setup_context,
        fbgemm=True,
    ),
    OpSpec(
        name="jagged_dense_elementwise_add_jagged_output",
        schema=_JD_ARGS + " -> (Tensor, Tensor[])",
        reference=ref.jagged_dense_elementwise_add_jagged_output,
        cpu_kernel="jagged_dense_elementwise_add_jagged_output",
        fake=jagged_output_fake,
        backward=jagged_dense_elementwise_add_jagged_output_backward,
        setup_context=jagged_dense_setup_context,
        fbgemm=True,
    ),
    OpSpec(
        name="jagged_dense_elementwise_mul_forward",
        schema=_JD_ARGS + " -> Tensor",
        reference=ref.jagged_dense_elementwise_mul_forward,
        cpu_kernel="jagged_dense_elementwise_mul_forward",
        fake=jagged_dense_elementwise_mul_forward_fake,
        backward=jagged_dense_elementwise_mul_forward_backward,
        setup_context=jagged_dense_setup_context,
        fbgemm=True,
    ),
    OpSpec(
        name="jagged_dense_elementwise_mul_backward",
        schema="(Tensor grad_output, Tensor[] x_offsets, Tensor y, Tensor x_values) "
               "-> (Tensor, Tensor)",
        reference=ref.jagged_dense_elementwise_mul_backward,
        cpu_kernel="jagged_dense_elementwise_mul_backward",
        fake=jagged_dense_elementwise_mul_backward_fake,
        fbgemm=True,
    ),
    OpSpec(
        name="jagged_dense_elementwise_mul",
        schema=_JD_ARGS + " -> (Tensor, Tensor[])",
        reference=jagged_dense_elementwise_mul,
        cpu_kernel="jagged_dense_elementwise_mul",
        fake=jagged_output_fake,
        backward=jagged_dense_elementwise_mul_forward_backward,
        setup_context=jagged_dense_setup_context,
        fbgemm=True,
    ),
    OpSpec(
        name="jagged_dense_dense_elementwise_add_jagged_output_forward",
        schema="(Tensor x_values, Tensor[] x_offsets, Tensor y_0, Tensor y_1) -> Tensor",
        reference=ref.jagged_dense_dense_elementwise_add_jagged_output_forward,
        cpu_kernel="jagged_dense_dense_elementwise_add_jagged_output_forward",
        fake=jagged_dense_dense_elementwise_add_jagged_output_forward_fake,
        backward=jagged_dense_dense_elementwise_add_jagged_output_backward,
        setup_context=jagged_dense_dense_elementwise_add_jagged_output_setup_context,
        fbgemm=True,
    ),
    OpSpec(
        name="jagged_dense_dense_elementwise_add_jagged_output",
        schema="(Tensor x_values, Tensor[] x_offsets, Tensor y_0, Tensor y_1) "
               "-> (Tensor, Tensor[])",
        reference=jagged_dense_dense_elementwise_add_jagged_output,
        cpu_kernel="jagged_dense_dense_elementwise_add_jagged_output",
        fake=jagged_output_fake,
        backward=jagged_dense_dense_elementwise_add_jagged_output_backward,
        setup_context=jagged_dense_dense_elementwise_add_jagged_output_setup_context,
        fbgemm=True,
    ),
    # softmax
    OpSpec(
        name="jagged_softmax_forward",
        schema="(Tensor values, Tensor x_offsets, int max_L) -> Tensor",
        reference=ref.jagged_softmax_forward,
        cpu_kernel="jagged_softmax_forward",
        triton=triton_impl("jagged", "jagged_softmax_forward"),
        fake=jagged_softmax_forward_fake,
        backward=jagged_softmax_backward,
        setup_context=jagged_softmax_setup_context,
        fbgemm_fixup=jagged_softmax_forward_fbgemm_fixup,
        fbgemm=True,
    ),
    OpSpec(
        name="jagged_softmax_backward",
        schema="(Tensor grad_output, Tensor output, Tensor x_offsets, int max_L) -> Tensor",
        reference=ref.jagged_softmax_backward,
        cpu_kernel="jagged_softmax_backward",
        triton=triton_impl("jagged", "jagged_softmax_backward"),
        fake=jagged_softmax_backward_fake,
        fbgemm_fixup=jagged_softmax_backward_fbgemm_fixup,
        fbgemm=True,
    ),
    OpSpec(
        name="jagged_softmax",
        schema="(Tensor values, Tensor x_offsets, int max_L) -> (Tensor, Tensor)",
        reference=jagged_softmax,
        cpu_kernel="jagged_softmax",
        fake=jagged_softmax_fake,
        backward=jagged_softmax_backward,
        setup_context=jagged_softmax_setup_context,
        fbgemm_fixup=jagged_softmax_fbgemm_fixup,
        fbgemm=True,
    ),
    # batched GEMMs
    OpSpec(
        name="jagged_jagged_bmm_forward",
        schema="(Tensor x_values, Tensor y_values, Tensor x_offsets, int max_L) -> Tensor",
        reference=ref.jagged_jagged_bmm_forward,
        triton=triton_impl("jagged", "jagged_jagged_bmm_forward"),
        cpu_kernel="jagged_jagged_bmm_forward",
        fake=jagged_jagged_bmm_fake,
        backward=jagged_jagged_bmm_backward,
        setup_context=jagged_jagged_bmm_setup_context,
        fbgemm=True,
    ),
    OpSpec(
        name="jagged_jagged_bmm",
        schema="(Tensor x_values, Tensor y_values, Tensor x_offsets, int max_L) -> Tensor",
        reference=jagged_jagged_bmm,
        cpu_kernel="jagged_jagged_bmm_forward",
        fake=jagged_jagged_bmm_fake,
        backward=jagged_jagged_bmm_backward,
        setup_context=jagged_jagged_bmm_setup_context,
        fbgemm=True,
    ),
    OpSpec(
        name="jagged_dense_bmm_forward",
        schema="(Tensor x_values, Tensor x_offsets, Tensor y, int max_L) -> Tensor",
        reference=ref.jagged_dense_bmm_forward,
        triton=triton_impl("jagged", "jagged_dense_bmm_forward"),
        cpu_kernel="jagged_dense_bmm_forward",
        fake=jagged_dense_bmm_forward_fake,
        backward=jagged_dense_bmm_backward,
        setup_context=jagged_dense_bmm_setup_context,
        fbgemm=True,
    ),
    OpSpec(
        name="jagged_dense_bmm",
        schema="(Tensor x_values, Tensor x_offsets, Tensor y, int max_L) -> (Tensor, Tensor)",
        reference=jagged_dense_bmm,
        cpu_kernel="jagged_dense_bmm",
        fake=jagged_dense_bmm_fake,
        backward=jagged_dense_bmm_backward,
        setup_context=jagged_dense_bmm_setup_context,
        fbgemm=True,
    ),
    OpSpec(
        name="batched_dense_vec_jagged_2d_mul_forward",
        schema="(Tensor v, Tensor a_values, Tensor a_offsets) -> Tensor",
        reference=ref.batched_dense_vec_jagged_2d_mul_forward,
        cpu_kernel="batched_dense_vec_jagged_2d_mul_forward",
        fake=batched_dense_vec_jagged_2d_mul_fake,
        backward=batched_dense_vec_jagged_2d_mul_backward,
        setup_context=batched_dense_vec_jagged_2d_mul_setup_context,
        fbgemm=True,
    ),
    OpSpec(
        name="batched_dense_vec_jagged_2d_mul_backward",
        schema="(Tensor grad_output, Tensor v, Tensor a_values, Tensor a_offsets) "
               "-> (Tensor, Tensor)",
        reference=ref.batched_dense_vec_jagged_2d_mul_backward,
        cpu_kernel="batched_dense_vec_jagged_2d_mul_backward",
        fake=batched_dense_vec_jagged_2d_mul_backward_fake,
        fbgemm=True,
    ),
    OpSpec(
        name="batched_dense_vec_jagged_2d_mul",
        schema="(Tensor v, Tensor a_values, Tensor a_offsets) -> Tensor",
        reference=batched_dense_vec_jagged_2d_mul,
        cpu_kernel="batched_dense_vec_jagged_2d_mul_forward",
        fake=batched_dense_vec_jagged_2d_mul_fake,
        backward=batched_dense_vec_jagged_2d_mul_backward,
        setup_context=batched_dense_vec_jagged_2d_mul_setup_context,
        fbgemm=True,
    ),
    # selection
    OpSpec(
        name="jagged_index_select",
        schema="(Tensor values, Tensor lengths, Tensor indices, "
               "int? num_dense_output_rows=None) -> Tensor[]",
        reference=ref.jagged_index_select,
        cpu_kernel="jagged_index_select",
        fake=jagged_index_select_fake,
        backward=jagged_index_select_backward,
        setup_context=jagged_index_select_setup_context,
        fbgemm=True, decomposes_in_fbgemm=True,
    ),
    OpSpec(
        name="jagged_slice",
        schema="(Tensor x_values, Tensor x_lengths, Tensor start, int slice_length) "
               "-> (Tensor, Tensor)",
        reference=ref.jagged_slice,
        cpu_kernel="jagged_slice",
        fake=jagged_slice_fake,
        backward=jagged_slice_backward,
        setup_context=jagged_slice_setup_context,
        fbgemm=True,
    ),
]

OP_NAMES: List[str] = [s.name for s in SPECS]
"""Every op of the family (public ops and their ``_forward`` / ``_backward`` parts), in
registration order: what ``use_backend(..., ops=OP_NAMES)`` needs to force the whole family."""


def register_all() -> None:
    """Register every spec of :data:`SPECS` (once: importing :mod:`torchrec_ascend.ops`)."""
    for s in SPECS:
        register(s)
