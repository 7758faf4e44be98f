"""Model FLOPs and MFU (model FLOP utilisation).

MFU = (model FLOPs of the step / step seconds) / device peak FLOP/s.  "Model FLOPs" count only
the matrix multiplies the model needs (2 FLOPs per multiply-add), on the jagged tokens the batch
really has (no padding, causal pairs only), forward plus backward = 3 x forward:

* HSTU: :meth:`torchrec_ascend.modules.hstu.HSTUEncoder.flops` (the formula lives with the
  module: UVQK projection, causal QK^T and AV over ``P = sum n_i (n_i + 1) / 2`` pairs, output
  projection).  Below, ``T = sum n_i`` tokens and ``P`` as there.
* SASRec layer (softmax attention, FFN width ``F``):
  ``8 T D^2`` (QKV + output) ``+ 4 P D`` (QK^T, AV) ``+ 4 T D F`` (FFN).
* Sampled softmax: ``2 T D (1 + R)`` for ``R`` negatives scored per token.

Embedding look-ups, norms and element-wise ops are not counted (they are bandwidth, not FLOPs).
The device peak is a published number on accelerators when known, otherwise (and always on CPU)
the rate of a large fp32 GEMM measured in the same process (:func:`measure_peak_gemm_flops`).
"""

from __future__ import annotations

from typing import Sequence, Union

import torch

Lengths = Union[torch.Tensor, Sequence[int]]


def _tokens_pairs(lengths: Lengths) -> tuple:
    n = torch.as_tensor(lengths, dtype=torch.float64)
    if n.dim() != 1:
        raise ValueError(f"lengths: expected a 1-D sequence of lengths, got shape {tuple(n.shape)}")
    if n.numel() and float(n.min()) < 0:
        raise ValueError("lengths: must be non-negative")
    return float(n.sum()), float((n * (n + 1) / 2).sum())


def sasrec_forward_flops(lengths: Lengths, embedding_dim: int, num_layers: int,
                         ffn_dim: int) -> float:
    """Forward matmul FLOPs of a SASRec (softmax attention) stack over jagged sequences."""
    t, p = _tokens_pairs(lengths)
    d = embedding_dim
    return num_layers * (8 * t * d * d + 4 * p * d + 4 * t * d * ffn_dim)


def sampled_softmax_flops(num_tokens: int, embedding_dim: int, num_negatives: int) -> float:
    """Forward FLOPs of scoring each token against its positive and ``num_negatives`` items."""
    return 2.0 * num_tokens * embedding_dim * (1 + num_negatives)


def training_flops(forward_flops: float) -> float:
    """Forward + backward (backward = 2 x forward for matmuls)."""
    return 3.0 * forward_flops


def measure_peak_gemm_flops(n: int = 2048, repeat: int = 3, dtype: torch.dtype = torch.float32,
                            device: Union[str, torch.device] = "cpu") -> float:
    """FLOP/s of an ``n x n`` GEMM in ``dtype``, the best of ``repeat`` timed rounds
    (:func:`torchrec_ascend.device.measure_gemm_gflops`, torch.utils.benchmark)."""
    from .. import device as _dev

    return _dev.measure_gemm_gflops(device, (dtype,), n=n, rounds=repeat, min_run_time=0.1)[dtype] * 1e9


# published dense peaks (FLOP/s) for the compute dtype used in training, by device-name substring
_KNOWN_PEAKS = {
    ("H100", torch.bfloat16): 989e12,
    ("H200", torch.bfloat16): 989e12,
    ("A100", torch.bfloat16): 312e12,
    ("910B", torch.float16): 313e12,
    ("910B", torch.bfloat16): 313e12,
}


def device_peak_flops(device: Union[str, torch.device] = "cpu",
                      dtype: torch.dtype = torch.float32, gemm_size: int = 2048) -> float:
    """Peak FLOP/s to divide by: published for known accelerators, otherwise a measured
    ``gemm_size``-cubed GEMM (:func:`measure_peak_gemm_flops`)."""
    dev = torch.device(device)
    if dev.type != "cpu":
        name = ""
        try:
            mod = getattr(torch, dev.type)
            name = mod.get_device_name(dev.index or 0)
        except Exception:
            pass
        for (key, dt), v in _KNOWN_PEAKS.items():
            if key in name and dt == dtype:
                return v
    return measure_peak_gemm_flops(n=gemm_size, dtype=dtype, device=dev)


def mfu(flops: float, seconds: float, peak_flops: float) -> float:
    """Model FLOP utilisation in [0, 1] (may exceed 1 only if ``peak_flops`` is wrong)."""
    if seconds <= 0 or peak_flops <= 0:
        raise ValueError(f"seconds ({seconds}) and peak_flops ({peak_flops}) must be positive")
    return flops / seconds / peak_flops
