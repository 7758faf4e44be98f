"""``train.precision``: which dtype the dense part computes in.

``fp32``: everything in fp32.  ``bf16``: mixed precision -- the encoder under
``torch.autocast(dtype=bfloat16)`` (matmuls and the HSTU attention kernel in bf16), the sampled
softmax's logit GEMM from bf16 rows with fp32 output; fp32 master weights, gradients and
optimizer state, fp32 LayerNorms, L2 norms, logsumexp and loss
(:class:`torchrec_ascend.models.generative_retrieval.SequenceHead`).  ``auto``: bf16 on npu /
cuda; on CPU bf16 where the whole step is faster in it, measured: where the bf16 GEMM is
(:func:`torchrec_ascend.device.gemm_dtype_is_fast`: AVX512-BF16 or AMX-BF16 CPUs that win the
timing) *and* one HSTU layer's forward + backward is faster under bf16 autocast than in fp32
(:func:`bf16_step_is_faster`, once per process), else fp32.  fp16 is not offered: it would need
loss scaling.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Literal, Optional, Tuple

import torch
import torch.distributed as dist

from .. import device as _device
from ..options import check_choice, choices

__all__ = ["Precision", "PRECISIONS", "resolve_precision", "bf16_step_is_faster"]

Precision = Literal["auto", "fp32", "bf16"]
"""``train.precision``: the dense part's compute dtype (module docstring)."""
PRECISIONS = choices(Precision)


_STEP_CHOICE: Optional[Tuple[bool, str]] = None


def bf16_step_is_faster() -> Tuple[bool, str]:
    """``(faster, reason)``: whether one HSTU layer step -- forward + backward of an
    :class:`~torchrec_ascend.modules.hstu.HSTUBlock` (D 256, 4 heads, attention and linear dims
    64, time bias, 4 sequences of 256 tokens), the attention, projections, norms and gating a
    training step is made of -- runs faster under bf16 autocast than in fp32 on this CPU.  Timed
    by thread CPU time (1 thread) or wall time, 3 interleaved rounds after a warm-up, medians
    compared; once per process (about a second)."""
    global _STEP_CHOICE
    if _STEP_CHOICE is not None:
        return _STEP_CHOICE
    from ..modules.hstu import HSTUBlock, RelativeBias

    with torch.random.fork_rng(devices=[]):  # the caller's random stream is left as it was
        _STEP_CHOICE = _time_step(HSTUBlock, RelativeBias)
    return _STEP_CHOICE


def _time_step(HSTUBlock, RelativeBias) -> Tuple[bool, str]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    n, b, d = 256, 4, 256
    block = HSTUBlock(d, 4, 64, 64, n, dropout=0.1, relative_bias=RelativeBias(n))
    x = torch.randn(n * b, d, generator=g, requires_grad=True)
    offsets = torch.arange(0, n * b + 1, n)
    ts = torch.randint(1, 3600, (n * b,), generator=g).cumsum(0)
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter

    def step(dtype: torch.dtype) -> float:
        t0 = clock()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            y = block(x, offsets, ts, validate=False)
        y.float().sum().backward()
        return clock() - t0

    times = {torch.float32: [], torch.bfloat16: []}
    for r in range(4):  # round 0 warms up both
        for dt in ((torch.float32, torch.bfloat16) if r % 2 == 0 else (torch.bfloat16, torch.float32)):
            t = step(dt)
            if r:
                times[dt].append(t)
    f32, b16 = statistics.median(times[torch.float32]), statistics.median(times[torch.bfloat16])
    return b16 < f32, f"HSTU layer step fwd+bwd {1e3 * f32:.1f} ms fp32, {1e3 * b16:.1f} ms bf16"


def resolve_precision(precision: Precision, device: torch.device) -> Tuple[torch.dtype, str]:
    """``(compute dtype, reason)`` for ``train.precision`` on ``device``; the reason is one line
    for the log (for ``auto``: the measured GEMM rates behind the choice).  Under an initialised
    process group of several ranks ``auto`` is a collective: bf16 only if every rank measured
    it faster (the ranks must train alike)."""
    check_choice("precision", precision, Precision)
    if precision == "fp32":
        return torch.float32, "train.precision=fp32"
    if precision == "bf16":
        return torch.bfloat16, "train.precision=bf16"
    fast = _device.gemm_dtype_is_fast(torch.bfloat16, device)
    step_why = ""
    if fast and device.type == "cpu" and not os.environ.get(_device.ENV_GEMM_DTYPE, "").strip():
        fast, step_why = bf16_step_is_faster()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        # gloo reduces host tensors; nccl / hccl need the flag on the device
        on = "cpu" if dist.get_backend() == "gloo" else device
        flag = torch.tensor([1 if fast else 0], dtype=torch.int64, device=on)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        fast = bool(flag[0])
    why = (_device.gemm_capability(device).reason if device.type == "cpu"
           else f"{device.type}: bf16 tensor/cube units")
    if step_why:
        why = f"{why}; {step_why}"
    return (torch.bfloat16 if fast else torch.float32), f"train.precision=auto: {why}"
