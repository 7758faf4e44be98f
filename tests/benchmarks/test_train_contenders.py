"""benchmarks/train.py: which contenders a run times, given the GEMM peaks it measured."""

import torch

from benchmarks.train import runnable_contenders

CONTENDERS = [("hstu", "fp32"), ("hstu", "bf16"), ("sasrec", "fp32")]


def test_bf16_skipped_where_emulated():
    keep, skipped = runnable_contenders(CONTENDERS, {torch.float32: 40.0, torch.bfloat16: 1.1})
    assert keep == [("hstu", "fp32"), ("sasrec", "fp32")]
    assert list(skipped) == ["hstu/bf16"]
    assert "1.10 GFLOP/s" in skipped["hstu/bf16"] and "40.0" in skipped["hstu/bf16"]


def test_bf16_kept_where_native_or_close():
    for bf16 in (75.0, 10.0):  # faster than fp32; slower, but within 4x
        keep, skipped = runnable_contenders(CONTENDERS, {torch.float32: 40.0, torch.bfloat16: bf16})
        assert keep == CONTENDERS and skipped == {}
