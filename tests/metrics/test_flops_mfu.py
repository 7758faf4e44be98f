"""FLOP formulas against torch's FlopCounterMode; the measured GEMM peak and MFU arithmetic."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from torchrec_ascend.metrics import (
    measure_peak_gemm_flops,
    mfu,
    sampled_softmax_flops,
    sasrec_forward_flops,
    training_flops,
)


def test_sasrec_formula_vs_flop_counter():
    d, f, heads, n = 32, 64, 2, 11
    layer = nn.TransformerEncoderLayer(d, heads, f, 0.0, batch_first=True, norm_first=True)
    layer.train()  # the non-fused path: every matmul visible to the counter
    x = torch.randn(1, n, d)
    mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
    with FlopCounterMode(display=False) as fc:
        layer(x, src_mask=mask)
    counted = fc.get_total_flops()
    # projections + FFN are counted exactly; attention is charged n x n by the counter (or not
    # at all, when the fused SDPA kernel hides it), the formula counts causal pairs n(n+1)/2
    pairs = n * (n + 1) // 2
    formula = sasrec_forward_flops([n], d, 1, f)
    assert formula - 4 * d * pairs in (counted, counted - 4 * d * n * n)
    assert formula == sasrec_forward_flops(torch.tensor([n]), d, 1, f)
    assert sasrec_forward_flops([n, 0, 3], d, 2, f) == 2 * (formula + sasrec_forward_flops([3], d, 1, f))


def test_sampled_softmax_flops_vs_counter():
    t, d, r = 13, 8, 21
    q, pool = torch.randn(t, d), torch.randn(r, d)
    with FlopCounterMode(display=False) as fc:
        q @ pool.t()
        (q * torch.randn(t, d)).sum(-1)  # positive logits: elementwise, not counted by torch
    # the positive logit is counted by the formula as one more column: 2 T D
    assert sampled_softmax_flops(t, d, r) == fc.get_total_flops() + 2 * t * d


def test_peak_and_mfu():
    peak = measure_peak_gemm_flops(n=256, repeat=2)
    assert peak > 1e8  # any CPU does > 0.1 GFLOP/s fp32
    assert mfu(2e9, 2.0, 1e9) == pytest.approx(1.0)
    assert training_flops(5.0) == 15.0
    with pytest.raises(ValueError):
        mfu(1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="lengths"):
        sasrec_forward_flops([-1], 4, 1, 4)
