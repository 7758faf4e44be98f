"""Registration table of the fused HSTU attention ops (``hstu_mha`` and its backward op):
fake kernels, autograd formula and specs.  The autograd formula calls
``torchrec_ascend::hstu_mha_backward``, so the backend choice applies to the backward too.
"""

from __future__ import annotations

from typing import List

import torch

from .._util import triton_impl
from ..hstu_engines import engines_detail
from ..reference import hstu as ref
from ..registry import OpSpec, register

__all__ = ["SPECS", "register_all"]

_ops = torch.ops.torchrec_ascend

_ARGS = ("Tensor q, Tensor k, Tensor v, Tensor offsets, float alpha, int max_seq_len, "
         "bool norm_by_seq_len, Tensor? num_targets, int contextual_seq_len, Tensor? pos_w, "
         "Tensor? ts_w, Tensor? timestamps")


def hstu_mha_fake(q, k, v, offsets, alpha, max_seq_len, norm_by_seq_len, num_targets,
                  contextual_seq_len, pos_w, ts_w, timestamps):
    return q.new_empty((q.shape[0], q.shape[1], v.shape[2]))


def hstu_mha_backward_fake(grad_out, q, k, v, offsets, alpha, max_seq_len, norm_by_seq_len,
                           num_targets, contextual_seq_len, pos_w, ts_w, timestamps):
    dpos = torch.empty_like(pos_w) if pos_w is not None else q.new_empty((0,))
    dts = torch.empty_like(ts_w) if ts_w is not None else q.new_empty((0,))
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dpos, dts


def hstu_mha_setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1], inputs[2])
    ctx.rest = inputs[3:]


def hstu_mha_backward_grad(ctx, grad):
    """The autograd formula of ``hstu_mha`` (named ``_grad``: ``hstu_mha_backward`` is an op)."""
    q, k, v = ctx.saved_tensors
    rest = ctx.rest
    dq, dk, dv, dpos, dts = _ops.hstu_mha_backward(grad.contiguous(), q, k, v, *rest)
    pos_w, ts_w = rest[6], rest[7]
    return (dq, dk, dv, None, None, None, None, None, None,
            dpos if pos_w is not None else None, dts if ts_w is not None else None, None)


_BOTH = dict(fbgemm=False, detail=engines_detail)  # no fbgemm op; describe() names the engines

SPECS: List[OpSpec] = [
    OpSpec(
        name="hstu_mha",
        schema=f"({_ARGS}) -> Tensor",
        reference=ref.hstu_mha,
        triton=triton_impl("hstu", "hstu_mha_fwd"),
        cpu_kernel="hstu_mha_fwd",
        fake=hstu_mha_fake,
        backward=hstu_mha_backward_grad,
        setup_context=hstu_mha_setup_context,
        **_BOTH,
    ),
    OpSpec(
        name="hstu_mha_backward",
        schema=f"(Tensor grad_out, {_ARGS}) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
        reference=ref.hstu_mha_backward,
        triton=triton_impl("hstu", "hstu_mha_bwd"),
        cpu_kernel="hstu_mha_bwd",
        fake=hstu_mha_backward_fake,
        **_BOTH,
    ),
]


def register_all() -> None:
    """Register every spec of :data:`SPECS` (once: importing :mod:`torchrec_ascend.ops`)."""
    for s in SPECS:
        register(s)
