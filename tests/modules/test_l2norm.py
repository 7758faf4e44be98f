"""modules/l2norm.py: l2_normalize (times a scale) against torch.nn.functional.normalize (value
and gradient, float64 and fp32), rows of norm 0, under and just over eps, and torch's
gradcheck."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torchrec_ascend.modules.l2norm import l2_normalize


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", [(0, 8), (1, 1), (37, 64), (3, 5, 7)])
@pytest.mark.parametrize("scale", [1.0, 20.0, -0.5])
def test_value_and_gradient_equal_f_normalize(dtype, shape, scale):
    g = torch.Generator().manual_seed(sum(shape))
    x0 = torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)
    if x0.shape[0] > 2:  # a zero row, a row under eps, one just over it
        x0[0] = 0
        x0[1] = 1e-3 / x0[1].norm() * x0[1] * 0.5
        x0[2] = 1e-3 / x0[2].norm() * x0[2] * 2.0
    dy = torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)
    a = x0.clone().requires_grad_()
    b = x0.clone().requires_grad_()
    ya, yb = l2_normalize(a, 1e-3, scale), F.normalize(b, dim=-1, eps=1e-3) * scale
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ya, yb, **tol)
    ya.backward(dy)
    yb.backward(dy)
    torch.testing.assert_close(a.grad, b.grad, **tol)


@pytest.mark.parametrize("scale", [1.0, 7.0])
def test_gradcheck(scale):
    x = torch.randn(6, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: l2_normalize(t, 1e-12, scale), (x,))


def test_scalar_and_bad_scale_refused():
    with pytest.raises(ValueError, match="at least one dimension"):
        l2_normalize(torch.tensor(1.0))
    for bad in (0.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="scale: expected a finite non-zero number"):
            l2_normalize(torch.ones(2, 3), scale=bad)


@pytest.mark.parametrize("shape", [(5, 45), (300, 512), (2, 3, 16), (4, 0)])
@pytest.mark.parametrize("row_kernels", [True, False])
def test_fp32_paths_against_float64(shape, row_kernels, monkeypatch):
    # fp32 on the CPU: the extension's one-pass row kernels (csrc/rows.cpp), or the torch code;
    # both against float64 F.normalize of the same values (a transposed, non-contiguous input too)
    from torchrec_ascend.modules import l2norm
    if row_kernels and not l2norm._row_kernels(torch.ones(1)):
        pytest.skip("extension not built")
    monkeypatch.setattr(l2norm, "_row_kernels", lambda x: row_kernels and x.dtype == torch.float32)
    g = torch.Generator().manual_seed(shape[-1] + 1)
    x0 = torch.randn(*shape, generator=g) * 3
    if shape[0] > 1 and shape[-1] > 0:
        x0[1] = 0  # clamped: dx = scale dy / eps
    dy = torch.randn(*shape, generator=g)
    for x in (x0, x0.transpose(0, -1).contiguous().transpose(0, -1)):
        a = x.clone().requires_grad_()
        y = l2_normalize(a, 1e-6, 20.0)
        y.backward(dy)
        b = x.double().requires_grad_()
        yb = F.normalize(b, dim=-1, eps=1e-6) * 20.0
        yb.backward(dy.double())
        assert y.dtype == torch.float32 and a.grad.dtype == torch.float32
        torch.testing.assert_close(y.double(), yb, rtol=2e-6, atol=1e-6)
        torch.testing.assert_close(a.grad.double(), b.grad, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("shape", [(0, 8), (1, 1), (37, 45), (300, 512)])
@pytest.mark.parametrize("row_kernels", [True, False])
def test_l2_normalized_dot_against_float64(shape, row_kernels, monkeypatch):
    # vecdot(q, F.normalize(x)) in float64: value, dq and dx; a zero row of x (clamped) included
    from torchrec_ascend.modules import l2norm
    from torchrec_ascend.modules.l2norm import l2_normalized_dot
    if row_kernels and not l2norm._row_kernels(torch.ones(1)):
        pytest.skip("extension not built")
    monkeypatch.setattr(l2norm, "_row_kernels", lambda t: row_kernels and t.dtype == torch.float32)
    g = torch.Generator().manual_seed(shape[0] + shape[1])
    q0, x0 = torch.randn(*shape, generator=g) * 2, torch.randn(*shape, generator=g) * 5
    if shape[0] > 2:
        x0[1] = 0
    gy = torch.randn(shape[0], generator=g)
    q, x = q0.clone().requires_grad_(), x0.clone().requires_grad_()
    y = l2_normalized_dot(q, x, 1e-12)
    y.backward(gy)
    qr, xr = q0.double().requires_grad_(), x0.double().requires_grad_()
    yr = torch.linalg.vecdot(qr, F.normalize(xr, dim=-1, eps=1e-12))
    yr.backward(gy.double())
    torch.testing.assert_close(y.double(), yr, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(q.grad.double(), qr.grad, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(x.grad.double(), xr.grad, rtol=2e-6, atol=2e-6)


def test_l2_normalized_dot_shapes():
    from torchrec_ascend.modules.l2norm import l2_normalized_dot
    with pytest.raises(ValueError, match="q, x: expected two"):
        l2_normalized_dot(torch.ones(3, 4), torch.ones(3, 5))


def test_row_kernels_refuse_mismatched_shapes():
    from torchrec_ascend.ops import extension
    if extension.kernel("l2_normalize_rows") is None:
        pytest.skip("csrc extension not built")
    with pytest.raises(ValueError, match=r"x: shape \[3, 5\] must equal q's \[3, 4\]"):
        extension.kernel("l2_dot_rows")(torch.ones(3, 4), torch.ones(3, 5), 1e-12)
    y, inv, clamped = extension.kernel("l2_normalize_rows")(torch.ones(3, 4), 1e-12, 1.0)
    with pytest.raises(ValueError, match=r"dy: shape \[2, 4\] must equal y's \[3, 4\]"):
        extension.kernel("l2_normalize_rows_bwd")(torch.ones(2, 4), y, inv, clamped, 1.0)
