"""Fused jagged HSTU attention: ``torchrec_ascend::hstu_mha`` and its backward op.

Public entry :func:`hstu_mha` validates once, then dispatches through the registry:

* ``triton`` (CUDA; Ascend through triton-ascend; CPU tensors only under ``TRITON_INTERPRET=1``):
  one program per (query tile, sequence, head), causal tile skipping, bias fused;
* ``cpu_kernel`` (``csrc/hstu*.cpp``): one tiled driver over per-CPU micro-kernels ("engines":
  AMX-BF16 or AVX512-BF16 tiles for bf16 with fp32 accumulation, AVX-512 or BLAS for fp32, BLAS
  for fp64); the engine of each dtype is chosen by the backend once per process by timing the
  candidates (:mod:`.hstu_engines` reports and forces it, ``ops.describe()`` shows it);
* ``reference`` (``ops/reference/hstu.py``): padded dense torch, the oracle.

The fused backends never build a padded tensor: work and memory follow ``sum_b n_b^2``, not
``B * N_max^2``, and the relative bias is computed inside the kernels from the small learned
tables (``pos_w [2 * max_seq_len - 1]``, ``ts_w [num_buckets + 1]``) and the timestamps.  The
autograd formula calls ``torchrec_ascend::hstu_mha_backward``, so the backend choice (and
:func:`~torchrec_ascend.ops.use_backend`) applies to the backward too.

Semantics (one sequence of length ``n``, one head; see docs/hstu.md)::

    s[i, j] = alpha * q_i . k_j + pos_w[max_seq_len - 1 + j - i]
                                + ts_w[bucket(ts[min(i + 1, n - 1)] - ts[j])]
    o_i     = sum_j valid(i, j) * silu(s[i, j]) / N * v_j        N = max_seq_len or n
"""

from __future__ import annotations

from typing import Literal, Optional

import torch

from ..options import choices
from . import validation
from .specs import hstu as _specs

__all__ = ["hstu_mha", "Normalization", "NORMALIZATIONS"]

_ops = torch.ops.torchrec_ascend
Normalization = Literal["max_len", "seq_len"]
"""HSTU's attention normaliser: divide by ``max_seq_len`` (the paper's) or each sequence's length."""
NORMALIZATIONS = choices(Normalization)

_specs.register_all()


# --------------------------------------------------------------------------- public API


def hstu_mha(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    *,
    max_seq_len: int,
    alpha: float = 1.0,
    normalization: str = "max_len",
    num_targets: Optional[torch.Tensor] = None,
    contextual_seq_len: int = 0,
    pos_w: Optional[torch.Tensor] = None,
    ts_w: Optional[torch.Tensor] = None,
    timestamps: Optional[torch.Tensor] = None,
    validate: bool = True,
) -> torch.Tensor:
    """Fused jagged HSTU attention (no softmax, no padding).  Differentiable w.r.t. ``q``, ``k``,
    ``v``, ``pos_w`` and ``ts_w``.

    Args:
        q, k: ``[T, H, dqk]`` queries / keys of all sequences, back to back.
        v: ``[T, H, dv]`` values.
        offsets: ``[B + 1]`` int32/int64 sequence offsets (sequence ``b`` is rows
            ``offsets[b]:offsets[b + 1]``); every length must be ``<= max_seq_len``.
        max_seq_len: the model's maximum length: the normaliser of ``"max_len"`` and the centre
            of the position table.
        alpha: scale of ``q . k`` (HSTU uses ``1 / sqrt(dqk)``).
        normalization: ``"max_len"`` divides by ``max_seq_len``; ``"seq_len"`` by each
            sequence's own length.
        num_targets: optional ``[B]`` ints: the last ``num_targets[b]`` tokens of sequence ``b``
            are candidates -- they attend to the history and themselves, not to each other.
        contextual_seq_len: the first ``c`` tokens of each sequence are contextual: every token
            attends to them and they attend to every non-target token.
        pos_w: optional ``[2 * max_seq_len - 1]`` learned relative-position bias
            (``pos_w[max_seq_len - 1 + j - i]`` is added to score ``(i, j)``).
        ts_w: optional ``[num_buckets + 1]`` learned time-bucket bias; needs ``timestamps``.
        timestamps: ``[T]`` integer timestamps (``dt = ts[i + 1] - ts[j]``, the last token of a
            sequence uses its own time).
        validate: check values of offsets / num_targets (a device sync on npu/cuda).

    Returns:
        ``[T, H, dv]``.
    """
    validation.check_tensor("q", q, dim=3, dtypes=validation.FLOAT_DTYPES)
    validation.check_tensor("k", k, dim=3, dtypes=(q.dtype,))
    validation.check_tensor("v", v, dim=3, dtypes=(q.dtype,))
    if k.shape != q.shape:
        raise ValueError(f"k: shape {tuple(k.shape)} must equal q's {tuple(q.shape)}")
    if v.shape[:2] != q.shape[:2]:
        raise ValueError(f"v: shape {tuple(v.shape)} must be [T, H, dv] with T, H of q {tuple(q.shape)}")
    T = q.shape[0]
    validation.check_offsets("offsets", offsets, T, validate)
    B = offsets.numel() - 1
    if int(max_seq_len) < 1:
        raise ValueError(f"max_seq_len: must be >= 1, got {max_seq_len}")
    max_seq_len = int(max_seq_len)
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization: must be one of {NORMALIZATIONS}, got {normalization!r}")
    if int(contextual_seq_len) < 0:
        raise ValueError(f"contextual_seq_len: must be >= 0, got {contextual_seq_len}")
    lengths = offsets[1:] - offsets[:-1]
    if validate and B > 0:
        if int(offsets[-1]) != T:
            raise ValueError(f"offsets: last offset {int(offsets[-1])} must equal T={T} rows of q")
        if int(lengths.max()) > max_seq_len:
            raise ValueError(
                f"offsets: a sequence has length {int(lengths.max())} > max_seq_len={max_seq_len}")
    if num_targets is not None:
        validation.check_tensor("num_targets", num_targets, dim=1, dtypes=validation.INDEX_DTYPES)
        if num_targets.numel() != B:
            raise ValueError(f"num_targets: expected {B} entries (one per sequence), got {num_targets.numel()}")
        if validate and B > 0 and bool(((num_targets < 0) | (num_targets > lengths)).any()):
            raise ValueError("num_targets: each entry must be in [0, length of its sequence]")
        num_targets = num_targets.to(offsets.dtype).contiguous()
    if pos_w is not None:
        validation.check_tensor("pos_w", pos_w, dim=1, dtypes=(q.dtype,))
        if pos_w.numel() != 2 * max_seq_len - 1:
            raise ValueError(f"pos_w: expected {2 * max_seq_len - 1} entries (2 * max_seq_len - 1), "
                             f"got {pos_w.numel()}")
    if (ts_w is None) != (timestamps is None):
        raise ValueError("ts_w / timestamps: give both (time-bucket bias) or neither")
    if ts_w is not None:
        validation.check_tensor("ts_w", ts_w, dim=1, dtypes=(q.dtype,))
        if ts_w.numel() < 1:
            raise ValueError("ts_w: needs at least one bucket")
        validation.check_tensor("timestamps", timestamps, dim=1, dtypes=validation.INDEX_DTYPES)
        if timestamps.numel() != T:
            raise ValueError(f"timestamps: expected {T} entries (one per row of q), got {timestamps.numel()}")
        timestamps = timestamps.to(torch.int64).contiguous()
    validation.check_same_device(q=q, k=k, v=v, offsets=offsets, num_targets=num_targets,
                              pos_w=pos_w, ts_w=ts_w, timestamps=timestamps)
    return _ops.hstu_mha(
        q.contiguous(), k.contiguous(), v.contiguous(), offsets.contiguous(), float(alpha),
        max_seq_len, normalization == "seq_len", num_targets, int(contextual_seq_len),
        pos_w, ts_w, timestamps,
    )
