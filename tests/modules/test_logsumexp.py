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


def test_bf16_is_torch_logsumexp():
    x0 = (torch.randn(9, 33, generator=torch.Generator().manual_seed(2)) * 4).bfloat16()
    a, b = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    ya, yb = logsumexp_rows(a), torch.logsumexp(b, dim=1)
    assert torch.equal(ya, yb)
    ya.sum().backward()
    yb.sum().backward()
    assert torch.equal(a.grad, b.grad)


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
        with pytest.raises(ValueError, match="bias: expected a float32 CPU tensor"):
            extension.kernel("logsumexp_rows")(torch.ones(2, 3), torch.ones(4))
        with pytest.raises(ValueError, match="x: expected a 2-D float32 CPU tensor"):
            extension.kernel("logsumexp_rows")(torch.ones(2, 3, dtype=torch.float64))
