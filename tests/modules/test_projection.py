"""modules.projection.project: x @ w and both gradients against a float64 reference, in fp32
and under bf16 autocast (the contiguous-x^T weight gradient), rows 0, 1 and many; the layout
choice; bad shapes and dtypes refused."""

from __future__ import annotations

import pytest
import torch

from torchrec_ascend.modules.projection import contiguous_transpose_helps, project


def _reference(x: torch.Tensor, w: torch.Tensor, dh: torch.Tensor):
    x64, w64, dh64 = x.double(), w.double(), dh.double()
    return x64 @ w64, dh64 @ w64.t(), x64.t() @ dh64


@pytest.mark.parametrize("rows", [0, 1, 37, 300])
@pytest.mark.parametrize("bf16", [False, True])
def test_product_and_gradients_match_float64(rows, bf16):
    g = torch.Generator().manual_seed(rows)
    x0 = torch.randn(rows, 48, generator=g)
    w0 = 0.1 * torch.randn(48, 80, generator=g)
    dh = torch.randn(rows, 80, generator=g)
    if bf16:  # the reference sees the operands autocast multiplies
        x0, w0, dh = (t.bfloat16().float() for t in (x0, w0, dh))
    x = x0.clone().requires_grad_()
    w = w0.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        h = project(x, w)
    assert h.dtype == (torch.bfloat16 if bf16 else torch.float32)
    h.backward(dh.to(h.dtype))
    ref_h, ref_dx, ref_dw = _reference(x0, w0, dh)
    tol = dict(rtol=2e-2, atol=2e-2) if bf16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h.double(), ref_h, **tol)
    assert x.grad.dtype == w.grad.dtype == torch.float32
    torch.testing.assert_close(x.grad.double(), ref_dx, **tol)
    torch.testing.assert_close(w.grad.double(), ref_dw, **tol)
    if rows == 0:
        assert not w.grad.any()


def test_bf16_gradients_equal_autocast_mm_within_rounding():
    g = torch.Generator().manual_seed(7)
    x0, w0 = torch.randn(500, 64, generator=g), torch.randn(64, 256, generator=g)
    dh = torch.randn(500, 256, generator=g).bfloat16()
    grads = []
    for fn in (project, torch.mm):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = fn(x, w)
        h.backward(dh)
        grads.append((h.float(), x.grad, w.grad))
    for ours, theirs in zip(*grads):
        # bf16 outputs: at most one bf16 rounding step apart (accumulation order)
        torch.testing.assert_close(ours, theirs, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("bf16", [False, True])
def test_transposed_weight_view_gets_its_gradient_in_the_parameters_layout(bf16):
    """``project(x, linear.weight.t())``: the gradient arriving at the ``[N, D]`` parameter is
    already contiguous (no layout copy in AccumulateGrad) and equals the float64 reference."""
    g = torch.Generator().manual_seed(11)
    x0 = torch.randn(90, 40, generator=g)
    p0 = 0.1 * torch.randn(24, 40, generator=g)  # [N, D], used as w = p.t() [D, N]
    dh = torch.randn(90, 24, generator=g)
    if bf16:
        x0, p0, dh = (t.bfloat16().float() for t in (x0, p0, dh))
    x, p = x0.clone().requires_grad_(), p0.clone().requires_grad_()
    arriving = []
    p.register_hook(lambda grad: arriving.append(grad))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        h = project(x, p.t())
    h.backward(dh.to(h.dtype))
    _, ref_dx, ref_dw = _reference(x0, p0.t(), dh)
    tol = dict(rtol=2e-2, atol=2e-2) if bf16 else dict(rtol=1e-5, atol=1e-5)
    assert len(arriving) == 1 and arriving[0].is_contiguous()
    assert arriving[0].dtype == torch.float32
    torch.testing.assert_close(p.grad.double(), ref_dw.t(), **tol)
    torch.testing.assert_close(x.grad.double(), ref_dx, **tol)


def test_layout_choice_and_errors():
    assert contiguous_transpose_helps(torch.zeros(2, 2, dtype=torch.bfloat16))
    assert not contiguous_transpose_helps(torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"expected x \[T, D\] and w \[D, N\]"):
        project(torch.zeros(3, 4), torch.zeros(5, 6))
    with pytest.raises(ValueError, match="outside autocast they must agree"):
        project(torch.zeros(3, 4), torch.zeros(4, 6, dtype=torch.float64))


@pytest.mark.parametrize("rows, cols", [(0, 5), (1, 1), (1, 17), (31, 15), (33, 16), (64, 512), (70, 130)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int32])
@pytest.mark.parametrize("isa_cap", [2, 0])
def test_transposed_copy_is_torchs_transpose(rows, cols, dtype, isa_cap):
    """The blocked kernel (AVX-512 body: 32-row blocks in 16-column steps; the plain loops with
    the ISA capped), odd and partial edges, against torch's strided copy, bit for bit."""
    from torchrec_ascend.modules.projection import transposed_copy
    from torchrec_ascend.ops import extension

    x = (torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows * 131 + cols)) * 100).to(dtype)
    ext = extension.extension()
    old = ext._set_isa_cap(isa_cap) if ext is not None else None
    try:
        y = transposed_copy(x)
        odd = transposed_copy(x[:, ::2])  # a non-contiguous input
    finally:
        if ext is not None:
            ext._set_isa_cap(old)
    assert y.is_contiguous() and y.dtype == dtype
    assert torch.equal(y, x.t().contiguous())
    assert torch.equal(odd, x[:, ::2].t().contiguous())
