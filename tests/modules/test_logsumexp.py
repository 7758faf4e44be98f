"""modules/logsumexp.py: logsumexp_rows against float64 torch.logsumexp (value and gradient), on
the extension's row kernels (csrc/rows.cpp) and on the torch path."""

from __future__ import annotations

import pytest
import torch

from torchrec_ascend.modules import logsumexp as lse_mod
from torchrec_ascend.modules.logsumexp import logsumexp_rows
from torchrec_ascend.ops import extension

KERNEL = extension.kernel("logsumexp_rows") is not None


@pytest.mark.parametrize("shape", [(0, 5), (1, 1), (7, 45), (300, 512), (3, 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_value_and_gradient_against_float64(shape, dtype):
    g = torch.Generator().manual_seed(shape[0] * 7 + shape[1])
    x0 = (torch.randn(*shape, generator=g) * 6).to(dtype)
    if shape[0] > 3 and shape[1] > 2:
        x0[1, :2] = -1e30                   # masked entries: exactly 0 gradient
        x0[2] = float("-inf")               # a row of -inf: -inf
        x0[3, 1] = 80.0                     # a large logit next to small ones
    x = x0.clone().requires_grad_()
    y = logsumexp_rows(x)
    if dtype == torch.float32 and KERNEL:
        assert type(y.grad_fn).__name__ == "_LogSumExpRowsBackward"
    gy = torch.randn(shape[0], generator=g).to(dtype)
    y.backward(gy)
    xr = x0.double().requires_grad_()
    yr = torch.logsumexp(xr, dim=1)
    yr.backward(gy.double())
    tol = {torch.float64: 1e-12, torch.float32: 3e-6}[dtype]
    fin = torch.isfinite(yr)
    assert torch.equal(torch.isfinite(y), fin) and bool((y[~fin] == yr[~fin].to(dtype)).all())
    torch.testing.assert_close(y.double()[fin], yr.detach()[fin], rtol=tol, atol=tol)
    rows = fin.nonzero().squeeze(1)
    torch.testing.assert_close(x.grad.double()[rows], xr.grad[rows], rtol=tol, atol=tol)
    if shape[0] > 3 and shape[1] > 2:
        assert bool((x.grad[1, :2] == 0).all())
        if dtype == torch.float32 and KERNEL:
            assert bool((x.grad[2] == 0).all())  # torch's own gradient there is nan


def test_bf16_rows_against_float64():
    # bf16 logits (the half GEMM's own output): lse in fp32 of the exact bf16 values, the
    # gradient in bf16 (one rounding of the fp32 value)
    g = torch.Generator().manual_seed(2)
    x0 = (torch.randn(9, 33, generator=g) * 4).bfloat16()
    bias = torch.randn(33, generator=g)
    gy = torch.randn(9, generator=g)
    x = x0.clone().requires_grad_()
    y = logsumexp_rows(x, bias)
    y.backward(gy)
    assert y.dtype == torch.float32 and x.grad.dtype == torch.bfloat16
    xr = (x0.double() + bias.double()).requires_grad_()
    yr = torch.logsumexp(xr, dim=1)
    yr.backward(gy.double())
    torch.testing.assert_close(y.double(), yr.detach(), rtol=3e-6, atol=3e-6)
    torch.testing.assert_close(x.grad.double(), xr.grad, rtol=4e-3, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("use_kernel", [True, False])
def test_bias_and_exclusions_against_float64(dtype, use_kernel, monkeypatch):
    # bias + excluded entries (CSR, rows with none, one, several, and a row wholly excluded)
    from torchrec_ascend.modules.logsumexp import RowExclusions
    if not use_kernel:
        monkeypatch.setattr(lse_mod, "_kernel_takes", lambda x, b: False)
    g = torch.Generator().manual_seed(5)
    N, C = 6, 40
    x0 = (torch.randn(N, C, generator=g) * 3).to(dtype)
    bias = torch.randn(C, generator=g)
    per_row = [[], [3], [0, 39, 7], [], list(range(C)), [5, 5]]
    ptr = torch.tensor([0] + [len(r) for r in per_row]).cumsum(0)
    cols = torch.tensor([c for r in per_row for c in r], dtype=torch.int64)
    ex = RowExclusions(ptr, cols)
    gy = torch.randn(N, generator=g)
    x = x0.clone().requires_grad_()
    y = logsumexp_rows(x, bias, ex)
    y.backward(gy)
    ref = x0.double() + bias.double()
    rows, cs = ex.pairs()
    ref[rows, cs] = float("-inf")
    xr = ref.clone().requires_grad_()
    yr = torch.logsumexp(xr, dim=1)
    yr.backward(gy.double())
    assert float(y[4]) == float("-inf")
    keep = [0, 1, 2, 3, 5]
    torch.testing.assert_close(y.double()[keep], yr.detach()[keep], rtol=3e-6, atol=3e-6)
    tol = 4e-3 if dtype == torch.bfloat16 else 3e-6
    torch.testing.assert_close(x.grad.double()[keep], xr.grad[keep], rtol=tol, atol=1e-6)
    assert bool((x.grad[rows, cs] == 0).all())


@pytest.mark.skipif(not KERNEL, reason="extension not built")
def test_kernel_and_torch_paths_agree(monkeypatch):
    g = torch.Generator().manual_seed(11)
    x0 = torch.randn(64, 130, generator=g) * 3
    x0[:, 7] = -1e30
    gy = torch.randn(64, generator=g)
    out = []
    for use_kernel in (True, False):
        if not use_kernel:
            monkeypatch.setattr(lse_mod.extension, "kernel", lambda name: None)
        x = x0.clone().requires_grad_()
        y = logsumexp_rows(x)
        y.backward(gy)
        out.append((y.detach(), x.grad))
    torch.testing.assert_close(out[0][0], out[1][0], rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(out[0][1], out[1][1], rtol=2e-6, atol=1e-7)


def test_bad_input():
    with pytest.raises(ValueError, match="x: expected a 2-D tensor"):
        logsumexp_rows(torch.ones(3))
    if KERNEL:
        with pytest.raises(ValueError, match=r"bias: expected a 1-D float32 CPU tensor \[3\], got float32 \[4\]"):
            extension.kernel("logsumexp_rows")(torch.ones(2, 3), torch.ones(4))
        with pytest.raises(ValueError, match="x: expected a 2-D float32 or bfloat16 CPU tensor"):
            extension.kernel("logsumexp_rows")(torch.ones(2, 3, dtype=torch.float64))
        with pytest.raises(ValueError, match="ex_cols: columns must be in"):
            extension.kernel("logsumexp_rows")(torch.ones(2, 3), None, torch.tensor([0, 1, 1]), torch.tensor([3]))
        with pytest.raises(ValueError, match="ex_ptr: must not decrease"):
            extension.kernel("logsumexp_rows")(torch.ones(2, 3), None, torch.tensor([0, 2, 1]), torch.tensor([0]))
        with pytest.raises(ValueError, match=r"ex_ptr: expected a 1-D int64 CPU tensor \[3\], got int64 \[2\]"):
            extension.kernel("logsumexp_rows")(torch.ones(2, 3), None, torch.tensor([0, 1]), torch.tensor([0]))
        with pytest.raises(ValueError, match="ex_cols: expected a 1-D int64 CPU tensor, got float32"):
            extension.kernel("logsumexp_rows")(torch.ones(2, 3), None, torch.tensor([0, 1, 1]), torch.tensor([0.0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nan_propagates_like_torch(dtype):
    x = torch.randn(3, 20, generator=torch.Generator().manual_seed(1)).to(dtype)
    x[1, 4] = float("nan")
    x[2, 7] = -float("nan")
    y = logsumexp_rows(x)
    assert torch.isfinite(y[0]) and torch.isnan(y[1]) and torch.isnan(y[2])
