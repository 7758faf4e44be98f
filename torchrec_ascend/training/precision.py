"""``train.precision``: which dtype the dense part computes in.

``fp32``: everything in fp32.  ``bf16``: mixed precision -- the encoder under
``torch.autocast(dtype=bfloat16)`` (matmuls and the HSTU attention kernel in bf16), the sampled
softmax's logit GEMM from bf16 rows with fp32 output; fp32 master weights, gradients and
optimizer state, fp32 LayerNorms, L2 norms, logsumexp and loss
(:class:`torchrec_ascend.models.generative_retrieval.SequenceHead`).  ``auto``: bf16 where the
device's bf16 GEMM was *measured* faster than fp32 (:func:`torchrec_ascend.device.
gemm_dtype_is_fast`: npu / cuda, CPUs with AVX512-BF16 or AMX-BF16 that win the timing), else
fp32.  fp16 is not offered: it would need loss scaling.
"""

from __future__ import annotations

from typing import Literal, Tuple

import torch
import torch.distributed as dist

from .. import device as _device
from ..options import check_choice, choices

__all__ = ["Precision", "PRECISIONS", "resolve_precision"]

Precision = Literal["auto", "fp32", "bf16"]
"""``train.precision``: the dense part's compute dtype (module docstring)."""
PRECISIONS = choices(Precision)


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
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        # gloo reduces host tensors; nccl / hccl need the flag on the device
        on = "cpu" if dist.get_backend() == "gloo" else device
        flag = torch.tensor([1 if fast else 0], dtype=torch.int64, device=on)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        fast = bool(flag[0])
    why = (_device.gemm_capability(device).reason if device.type == "cpu"
           else f"{device.type}: bf16 tensor/cube units")
    return (torch.bfloat16 if fast else torch.float32), f"train.precision=auto: {why}"
