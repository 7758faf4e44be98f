"""modules/row_padding.py: padding rows appended to a jagged batch as sequences of their own
change nothing for the real rows (forward and gradients, every mask and bias), and the CPU's half
GEMMs see row counts that are multiples of device.GEMM_ROW_MULTIPLE."""

from __future__ import annotations

import pytest
import torch

from torchrec_ascend.device import GEMM_ROW_MULTIPLE, gemm_row_multiple
from torchrec_ascend.modules import hstu as hstu_mod
from torchrec_ascend.modules.hstu import HSTUStack
from torchrec_ascend.modules.row_padding import pad_jagged, row_multiple


@pytest.mark.parametrize("rows, multiple, max_len", [(0, 64, 8), (1, 64, 8), (63, 64, 100), (64, 64, 8),
                                                      (65, 64, 8), (10, 1, 8), (70, 16, 5)])
@pytest.mark.parametrize("off_dtype", [torch.int32, torch.int64])
def test_pad_jagged_appends_zero_rows_as_short_sequences(rows, multiple, max_len, off_dtype):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 6, generator=g)
    cut = sorted(torch.randint(0, rows + 1, (2,), generator=g).tolist())
    offsets = torch.tensor([0, *cut, rows], dtype=off_dtype)
    ts = torch.arange(rows, dtype=torch.int64) * 7 + 3
    nt = torch.tensor([0, 1, 0], dtype=torch.int64)
    b = pad_jagged(x, offsets, ts, nt, multiple, max_len)
    padded = -rows % multiple
    assert b.rows == rows and b.x.shape == (rows + padded, 6) and b.x.shape[0] % multiple == 0
    assert torch.equal(b.x[:rows], x) and not b.x[rows:].any()
    assert b.offsets.dtype == off_dtype and torch.equal(b.offsets[:4], offsets)
    lens = (b.offsets[4:] - b.offsets[3:-1]).tolist()
    assert sum(lens) == padded and all(0 < n <= max_len for n in lens)
    assert b.timestamps.shape == (rows + padded,) and torch.equal(b.timestamps[:rows], ts)
    assert (b.timestamps[rows:] == (ts[-1] if rows else 0)).all()
    assert torch.equal(b.num_targets[:3], nt) and not b.num_targets[3:].any()
    assert b.num_targets.numel() == b.offsets.numel() - 1


def test_pad_jagged_without_optional_inputs():
    b = pad_jagged(torch.ones(3, 2), torch.tensor([0, 3]), None, None, 4, 8)
    assert b.timestamps is None and b.num_targets is None and b.offsets.tolist() == [0, 3, 4]


def test_row_multiple_follows_the_gemm_dtype():
    x = torch.zeros(2, 2)
    assert row_multiple(x) == 1
    assert row_multiple(x.bfloat16()) == GEMM_ROW_MULTIPLE
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert row_multiple(x) == GEMM_ROW_MULTIPLE
    assert gemm_row_multiple("cpu", torch.float32) == 1
    assert gemm_row_multiple("cuda", torch.bfloat16) == 1


@pytest.mark.parametrize("contextual", [0, 2])
def test_stack_with_padding_rows_equals_the_stack_without(monkeypatch, contextual):
    """fp32 (float64-exact enough): the stack forced to pad to 64 rows with max_seq_len 8 (so the
    padding is several sequences) vs no padding -- outputs and every gradient agree, with
    candidates (num_targets), contextual tokens and both relative biases on."""
    torch.manual_seed(0)
    stack = HSTUStack(2, 16, 2, 8, 8, max_seq_len=8, contextual_seq_len=contextual)
    lens = [8, 1, 5, 0, 7]
    offsets = torch.tensor([0] + lens).cumsum(0)
    T = int(offsets[-1])
    x = torch.randn(T, 16, requires_grad=True)
    ts = torch.cumsum(torch.randint(1, 500, (T,)), 0)
    nt = torch.tensor([2, 0, 1, 0, 3])
    g = torch.randn(T, 16)
    out = {}
    for multiple in (1, 64):
        monkeypatch.setattr(hstu_mod, "row_multiple", lambda _x, m=multiple: m)
        stack.zero_grad()
        x.grad = None
        y = stack(x, offsets, ts, nt)
        assert y.shape == (T, 16)
        y.backward(g)
        out[multiple] = [y.detach(), x.grad.clone()] + [p.grad.clone() for p in stack.parameters()]
    for a, b in zip(out[1], out[64]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows, padded", [(5, 8), (0, 4), (7, 7), (1, 64)])
def test_real_rows_value_and_gradient(rows, padded):
    # real_rows(x, rows) is x[:rows]; its gradient (written into uninitialised memory) is the
    # slice's: the incoming rows, zeros for the padding rows
    from torchrec_ascend.modules.row_padding import real_rows
    g = torch.Generator().manual_seed(rows + padded)
    x0 = torch.randn(padded, 3, generator=g, dtype=torch.float64)
    gy = torch.randn(rows, 3, generator=g, dtype=torch.float64)
    a, b = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    ya, yb = real_rows(a, rows), b[:rows]
    assert torch.equal(ya, yb)
    ya.backward(gy)
    yb.backward(gy)
    assert torch.equal(a.grad, b.grad)
    assert (real_rows(a, padded) is a) == True
