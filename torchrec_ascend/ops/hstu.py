"""Fused jagged HSTU attention: ``torchrec_ascend::hstu_mha`` and its backward op.

Public entry :func:`hstu_mha` validates once, then dispatches through the registry:

* ``triton`` (CUDA; Ascend through triton-ascend; CPU tensors only under ``TRITON_INTERPRET=1``):
  one program per (query tile, sequence, head), causal tile skipping, bias fused;
* ``cpu_kernel`` (``csrc/hstu.cpp``): OpenMP over (sequence, head, query tile), GEMMs on tiles;
  bfloat16 inputs run bf16 GEMMs (fp32 accumulation, SiLU in fp32) where that was measured faster
  (the CPU's bf16 GEMM, then the kernel itself: :func:`cpu_bf16_gemm`), else they are widened and
  computed in fp32;
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

from .. import device as _device
from ..options import choices
from . import extension, validation
from .specs import hstu as _specs

__all__ = ["hstu_mha", "Normalization", "NORMALIZATIONS"]  # cpu_bf16_gemm: a backend switch

_ops = torch.ops.torchrec_ascend
Normalization = Literal["max_len", "seq_len"]
"""HSTU's attention normaliser: divide by ``max_seq_len`` (the paper's) or each sequence's length."""
NORMALIZATIONS = choices(Normalization)

_specs.register_all()


# --------------------------------------------------------------------------- bf16 on CPU

_BF16_CHOSEN = False


def _bf16_kernel_is_faster(set_fn) -> bool:
    """Time the csrc kernel on one fixed bf16 problem (8 sequences of 384 tokens, 2 heads, d=64,
    forward + backward) with bf16 GEMMs and widened to fp32, interleaved over 3 rounds; True when
    the bf16 GEMMs win by 5%.  ~1 s, once per process."""
    import statistics
    import time

    g = torch.Generator().manual_seed(0)
    n, b, h, d = 384, 8, 2, 64
    q, k, v = (torch.randn(n * b, h, d, generator=g).to(torch.bfloat16) for _ in range(3))
    offsets = torch.arange(0, n * b + 1, n, dtype=torch.int64)
    grad = torch.ones_like(v)
    fwd, bwd = extension.kernel("hstu_mha_fwd"), extension.kernel("hstu_mha_bwd")
    args = (q, k, v, offsets, d ** -0.5, n, False, None, 0, None, None, None)

    def once(on: bool) -> float:
        set_fn(on)
        t0 = time.perf_counter()
        fwd(*args)
        bwd(grad, *args)
        return time.perf_counter() - t0

    times = {True: [], False: []}
    for r in range(4):  # round 0 warms up both
        for on in ((True, False) if r % 2 == 0 else (False, True)):
            dt = once(on)
            if r:
                times[on].append(dt)
    return statistics.median(times[True]) * 1.05 < statistics.median(times[False])


def cpu_bf16_gemm(enabled: Optional[bool] = None) -> bool:
    """Whether the csrc kernel computes bfloat16 inputs with bf16 GEMMs (else: widened to fp32).

    ``enabled=None``: the first call decides by measurement -- bf16 GEMMs only where the device's
    bf16 GEMM beats fp32 (``device.gemm_dtype_is_fast``) *and* the kernel itself then runs faster
    with them (:func:`_bf16_kernel_is_faster`; per-tile GEMM overheads can eat the gain); later
    calls return that choice.  ``True`` / ``False`` force it.  ``False`` where the extension is
    not built.
    """
    global _BF16_CHOSEN
    set_fn, get_fn = extension.kernel("hstu_set_bf16_gemm"), extension.kernel("hstu_bf16_gemm")
    if set_fn is None or get_fn is None:
        return False
    if enabled is None and not _BF16_CHOSEN:
        enabled = _device.gemm_dtype_is_fast(torch.bfloat16, "cpu") and _bf16_kernel_is_faster(set_fn)
    if enabled is not None:
        set_fn(bool(enabled))
        _BF16_CHOSEN = True
    return bool(get_fn())


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
    if q.dtype == torch.bfloat16 and q.device.type == "cpu" and not _BF16_CHOSEN:
        cpu_bf16_gemm()  # measured once: bf16 GEMMs in the csrc kernel where they are faster
    return _ops.hstu_mha(
        q.contiguous(), k.contiguous(), v.contiguous(), offsets.contiguous(), float(alpha),
        max_seq_len, normalization == "seq_len", num_targets, int(contextual_seq_len),
        pos_w, ts_w, timestamps,
    )
