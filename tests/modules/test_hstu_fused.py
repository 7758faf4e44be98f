"""modules/hstu_fused.py: the fused CPU kernels of an HSTU layer's elementwise part against the
torch code they replace (float64 references), forward and backward, fp32 and bf16; dropout masks
reproducible from the seed and Bernoulli(1 - p) in distribution."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torchrec_ascend.modules import hstu_fused
from torchrec_ascend.ops import extension

pytestmark = pytest.mark.skipif(extension.kernel("hstu_norm_gate") is None, reason="csrc extension not built")

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def _rand(*shape, dtype, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T, widths", [(0, [4, 4, 8, 8]), (1, [16, 16, 32, 32]), (37, [24, 24, 40, 40]),
                                       (130, [512, 512, 512, 512])])
def test_silu_split_matches_torch(dtype, T, widths):
    h = _rand(T, sum(widths), dtype=dtype, seed=T).requires_grad_()
    parts = hstu_fused.silu_split(h, widths)
    assert all(p.is_contiguous() and p.dtype == dtype for p in parts)
    h64 = h.detach().double().requires_grad_()
    want = torch.split(F.silu(h64), widths, dim=1)
    grads = [_rand(T, w, dtype=dtype, seed=100 + i) for i, w in enumerate(widths)]
    for p, w in zip(parts, want):
        torch.testing.assert_close(p.double(), w, **TOL[dtype])
    torch.autograd.backward(parts, grads)
    torch.autograd.backward(want, [g.double() for g in grads])
    torch.testing.assert_close(h.grad.double(), h64.grad, **TOL[dtype])


def test_bf16_silu_split_is_within_one_rounding_of_float64():
    """bf16 in and out: the kernel's bf16-accuracy sigmoid (|rel err| < 4e-4) keeps every output
    within the bf16 rounding (2^-8 relative) of the float64 value of the same bf16 input, plus
    that error -- a tolerance a wrong formula or a lost lane would not meet."""
    h = (4 * _rand(257, 128, dtype=torch.float32, seed=5)).bfloat16()  # |z| up to ~16
    h[0, :8] = torch.tensor([0.0, -0.0, 30.0, -30.0, 1e-3, -1e-3, 88.0, -88.0]).bfloat16()
    widths = [32, 32, 32, 32]
    parts = hstu_fused.silu_split(h.clone().requires_grad_(), widths)
    z = h.double()
    want = z * torch.sigmoid(z)
    got = torch.cat([p.detach() for p in parts], 1).double()
    assert ((got - want).abs() <= (2 ** -8 + 5e-4) * want.abs() + 1e-30).all()
    g = _rand(257, 128, dtype=torch.float32, seed=6).bfloat16()
    hh = h.clone().requires_grad_()
    torch.autograd.backward(hstu_fused.silu_split(hh, widths), list(g.split(widths, 1)))
    sg = torch.sigmoid(z)
    want_dh = g.double() * sg * (1 + z * (1 - sg))
    err = (hh.grad.double() - want_dh).abs()
    assert (err <= 2 ** -8 * want_dh.abs() + 1e-3 * g.double().abs() + 1e-30).all(), err.max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T, D", [(0, 8), (1, 16), (33, 40), (70, 512)])
def test_norm_gate_without_dropout_matches_torch(dtype, T, D):
    attn = (_rand(T, D, dtype=dtype, seed=1) * 3 + 0.5).requires_grad_()
    u = _rand(T, D, dtype=dtype, seed=2).requires_grad_()
    y = hstu_fused.norm_gate(attn, u, 0.3, training=False)  # eval: no dropout
    assert y.dtype == dtype
    a64, u64 = attn.detach().double().requires_grad_(), u.detach().double().requires_grad_()
    want = u64 * F.layer_norm(a64, (D,), eps=1e-6)
    torch.testing.assert_close(y.double(), want, **TOL[dtype])
    g = _rand(T, D, dtype=dtype, seed=3)
    y.backward(g)
    want.backward(g.double())
    torch.testing.assert_close(attn.grad.double(), a64.grad, **TOL[dtype])
    torch.testing.assert_close(u.grad.double(), u64.grad, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_gate_dropout_uses_one_mask_forward_and_backward(dtype):
    """With dropout the kept elements equal the no-dropout result / (1 - p), the dropped ones
    are 0, and the backward applies the same mask (recovered from the output)."""
    T, D, p = 64, 96, 0.25
    attn = _rand(T, D, dtype=dtype, seed=4).requires_grad_()
    u = (_rand(T, D, dtype=dtype, seed=5).abs() + 0.1).requires_grad_()  # no zero u: y == 0 <=> dropped
    torch.manual_seed(11)
    y = hstu_fused.norm_gate(attn, u, p, training=True)
    kept = y != 0
    full = hstu_fused.norm_gate(attn.detach(), u.detach(), p, training=False)
    torch.testing.assert_close(y[kept].double(), (full[kept] / (1 - p)).double(), **TOL[dtype])
    assert abs(kept.double().mean().item() - (1 - p)) < 0.03
    g = _rand(T, D, dtype=dtype, seed=6)
    y.backward(g)
    a64, u64 = attn.detach().double().requires_grad_(), u.detach().double().requires_grad_()
    want = u64 * F.layer_norm(a64, (D,), eps=1e-6) * kept.double() / (1 - p)
    want.backward(g.double())
    torch.testing.assert_close(attn.grad.double(), a64.grad, **TOL[dtype])
    torch.testing.assert_close(u.grad.double(), u64.grad, **TOL[dtype])
    # the same torch seed gives the same mask
    torch.manual_seed(11)
    y2 = hstu_fused.norm_gate(attn.detach(), u.detach(), p, training=True)
    assert torch.equal(y2 != 0, kept)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_distribution_and_backward(dtype):
    x = torch.ones(400, 250, dtype=dtype, requires_grad=True)
    p = 0.2
    y = hstu_fused.dropout(x, p, training=True)
    kept = y != 0
    torch.testing.assert_close(y[kept].double(), torch.full_like(y[kept], 1 / (1 - p)).double(), **TOL[dtype])
    rate = kept.double().mean().item()
    assert abs(rate - (1 - p)) < 0.005, rate  # 100k draws: 4 sigma ~ 0.005
    # neighbours are not correlated (a broken hash repeats patterns)
    same = (kept[:, 1:] == kept[:, :-1]).double().mean().item()
    assert abs(same - ((1 - p) ** 2 + p ** 2)) < 0.01, same
    g = torch.randn(400, 250).to(dtype)
    y.backward(g)
    torch.testing.assert_close(x.grad.double(), (g.double() * kept.double() / (1 - p)), **TOL[dtype])
    assert hstu_fused.dropout(x, p, training=False) is x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T, D", [(0, 8), (1, 16), (33, 40), (70, 512), (5, 7)])
def test_layer_norm_of_fp32_rows_in_the_compute_dtype_matches_float64(dtype, T, D):
    """fp32 rows (offset and scaled: a cancelling mean) -> LayerNorm written in ``dtype``: within
    one rounding to ``dtype`` of the float64 LayerNorm; the fp32 gradient from a ``dtype`` one
    within fp32 accuracy of float64 autograd's on that same gradient."""
    x = (_rand(T, D, dtype=torch.float32, seed=T + D) * 3 + 5).requires_grad_()
    y = hstu_fused.layer_norm(x, dtype)
    assert y.dtype == dtype and y.shape == (T, D)
    x64 = x.detach().double().requires_grad_()
    want = F.layer_norm(x64, (D,), eps=1e-6)
    rounding = 2 ** -8 if dtype == torch.bfloat16 else 1e-6
    assert ((y.detach().double() - want).abs() <= rounding * want.abs() + 1e-5).all()
    g = _rand(T, D, dtype=dtype, seed=3)
    y.backward(g)
    want.backward(g.double())
    assert x.grad.dtype == torch.float32
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-4, atol=1e-4)


def test_layer_norm_with_the_kernel_equals_torch_layer_norm_then_cast():
    """In bf16 the fused result is torch's ``layer_norm(x).to(bf16)`` but for ties of the fp32
    statistics' summation order: at most one bf16 step apart, almost everywhere equal."""
    x = _rand(300, 512, dtype=torch.float32, seed=11) * 2 - 1
    got = hstu_fused.layer_norm(x, torch.bfloat16)
    ref = F.layer_norm(x, (512,), eps=1e-6).to(torch.bfloat16)
    steps = (got.view(torch.int16).int() - ref.view(torch.int16).int()).abs()
    assert steps.max() <= 1 and (steps == 0).float().mean() > 0.99


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("uses", ["both", "normed", "skip"])
@pytest.mark.parametrize("T, D", [(0, 8), (1, 16), (33, 40), (70, 512)])
def test_pre_norm_gradient_sums_both_uses_as_float64(dtype, uses, T, D):
    """``pre_norm(x)`` = (LayerNorm(x) in dtype, x); x's gradient is LayerNorm's backward plus the
    residual's gradient (float64 autograd on the same incoming gradients), whichever outputs a
    loss uses."""
    x = (_rand(T, D, dtype=torch.float32, seed=T + 2 * D) * 3 + 5).requires_grad_()
    normed, skip = hstu_fused.pre_norm(x, dtype)
    assert normed.dtype == dtype and torch.equal(skip, x)
    x64 = x.detach().double().requires_grad_()
    g = _rand(T, D, dtype=dtype, seed=5)
    gs = _rand(T, D, dtype=torch.float32, seed=6)
    loss = 0
    loss64 = 0
    if uses in ("both", "normed"):
        loss = loss + (normed.float() * g.float()).sum()
        loss64 = loss64 + (F.layer_norm(x64, (D,), eps=1e-6) * g.double()).sum()
    if uses in ("both", "skip"):
        loss = loss + (skip * gs).sum()
        loss64 = loss64 + (x64 * gs.double()).sum()
    loss.backward()
    loss64.backward()
    assert x.grad.dtype == torch.float32
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("o_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("T, D", [(0, 8), (1, 16), (37, 40), (70, 512), (3, 7), (600, 24)])
def test_residual_add_matches_float64(o_dtype, with_bias, T, D):
    """x + (o + bias) in fp32 from an fp32 residual, a projection output in o_dtype and an fp32
    bias; gradients: x gets dy, o dy in its dtype, bias the column sums."""
    x = _rand(T, D, dtype=torch.float32, seed=T).requires_grad_()
    o = _rand(T, D, dtype=o_dtype, seed=T + 1).requires_grad_()
    b = _rand(D, dtype=torch.float32, seed=T + 2).requires_grad_() if with_bias else None
    y = hstu_fused.residual_add(x, o, b)
    assert y.dtype == torch.float32 and y.shape == (T, D)
    want = x.detach().double() + o.detach().double() + (b.detach().double() if with_bias else 0)
    torch.testing.assert_close(y.detach().double(), want, rtol=1e-6, atol=1e-6)
    g = _rand(T, D, dtype=torch.float32, seed=T + 3)
    y.backward(g)
    assert torch.equal(x.grad, g)
    assert o.grad.dtype == o_dtype and torch.equal(o.grad, g.to(o_dtype))
    if with_bias:
        torch.testing.assert_close(b.grad.double(), g.double().sum(0), rtol=1e-5, atol=1e-5)


def test_fallback_on_float64_is_the_torch_code():
    h = torch.randn(5, 8, dtype=torch.float64)
    parts = hstu_fused.silu_split(h, [2, 2, 2, 2])
    torch.testing.assert_close(torch.cat(parts, 1), F.silu(h))
    a, u = torch.randn(5, 8, dtype=torch.float64), torch.randn(5, 8, dtype=torch.float64)
    torch.testing.assert_close(hstu_fused.norm_gate(a, u, 0.5, training=False), u * F.layer_norm(a, (8,), eps=1e-6))
    torch.testing.assert_close(hstu_fused.layer_norm(a, torch.float64), F.layer_norm(a, (8,), eps=1e-6))
    b = torch.randn(8, dtype=torch.float64)
    torch.testing.assert_close(hstu_fused.residual_add(a, u, b), a + u + b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fallback_masks_equal_the_kernels(dtype):
    """The torch fallback (other devices) draws the kernels' masks: one training on CPU and on an
    accelerator (same seed) drops the same elements."""
    x = _rand(37, 70, dtype=dtype, seed=3).abs() + 0.5
    torch.manual_seed(5)
    fused = hstu_fused.dropout(x, 0.3, training=True)
    torch.manual_seed(5)
    seed = hstu_fused._seed()
    plain = x * hstu_fused._mask_factor(37, 70, 0.3, seed, x.device, x.dtype)
    assert torch.equal(fused == 0, plain == 0)
    torch.testing.assert_close(fused.double(), plain.double(), **TOL[dtype])


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="widths"):
        hstu_fused.silu_split(torch.zeros(3, 10), [2, 2, 2, 2])
    with pytest.raises(ValueError, match="attn, u"):
        hstu_fused.norm_gate(torch.zeros(3, 4), torch.zeros(3, 5), 0.1, True)
    with pytest.raises(ValueError, match="p: dropout probability"):
        extension.kernel("hstu_dropout")(torch.zeros(2, 2), 1.0, 0)
    with pytest.raises(ValueError, match=r"x: expected a 2-D float32 CPU tensor, got bfloat16 \[2, 2\] on cpu"):
        extension.kernel("hstu_ln_cast")(torch.zeros(2, 2, dtype=torch.bfloat16), torch.bfloat16)
    with pytest.raises(ValueError, match="x, o"):
        hstu_fused.residual_add(torch.zeros(3, 4), torch.zeros(3, 5))
    with pytest.raises(ValueError, match=r"bias: expected a 1-D float32 CPU tensor \[3\], got float32 \[4\]"):
        extension.kernel("hstu_residual_add")(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(4))
    with pytest.raises(ValueError, match=r"dy: shape \[2, 4\] must equal u's \[2, 3\]"):
        extension.kernel("hstu_norm_gate_bwd")(torch.zeros(2, 4), torch.zeros(2, 3), torch.zeros(2, 3),
                                               torch.zeros(2), torch.zeros(2), 0.0, 0)
    with pytest.raises(ValueError, match="dy: shape"):
        extension.kernel("hstu_ln_cast_bwd")(torch.zeros(2, 3), torch.zeros(2, 2), torch.zeros(2), torch.zeros(2))
    with pytest.raises(ValueError, match=r"add: shape \[2, 4\] must equal x's \[2, 3\]"):
        extension.kernel("hstu_ln_cast_bwd")(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.zeros(2),
                                             torch.zeros(2, 4))
    with pytest.raises(ValueError, match="dy: expected a 2-D float32 CPU tensor, got bfloat16"):
        extension.kernel("hstu_cast_colsum")(torch.zeros(2, 3, dtype=torch.bfloat16), torch.bfloat16)
    with pytest.raises(ValueError, match=r"dy: expected a 2-D float32 CPU tensor, got float32 \[6\]"):
        extension.kernel("hstu_cast_colsum")(torch.zeros(6), torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vector_and_plain_paths_agree(dtype):
    """The AVX-512 bodies and the plain loops (ISA capped: csrc/isa.h) give the same masks and
    values (the mask is one hash of (seed, index) on both)."""
    ext = extension.extension()
    h = _rand(45, 4 * 40, dtype=dtype, seed=7)
    a, u, g = (_rand(45, 72, dtype=dtype, seed=s) for s in (8, 9, 10))
    x32 = _rand(45, 72, dtype=torch.float32, seed=11) + 2
    calls = {
        "silu_split": lambda: ext.hstu_silu_split(h, [40] * 4),
        "silu_split_bwd": lambda: [ext.hstu_silu_split_bwd([g[:, :40].contiguous()] * 4, h)],
        "norm_gate": lambda: list(ext.hstu_norm_gate(a, u, 0.3, 12345)),
        "norm_gate_bwd": lambda: list(ext.hstu_norm_gate_bwd(g, a, u, *ext.hstu_norm_gate(a, u, 0.3, 12345)[1:],
                                                              0.3, 12345)),
        "dropout": lambda: [ext.hstu_dropout(u, 0.4, 99)],
        "ln_cast": lambda: list(ext.hstu_ln_cast(x32, dtype)),
        "ln_cast_bwd": lambda: [ext.hstu_ln_cast_bwd(g, x32, *ext.hstu_ln_cast(x32, dtype)[1:])],
        "ln_cast_bwd_add": lambda: [ext.hstu_ln_cast_bwd(g, x32, *ext.hstu_ln_cast(x32, dtype)[1:], x32 * 3)],
        "cast_colsum": lambda: list(ext.hstu_cast_colsum(torch.cat([x32] * 7), dtype)),  # 315 rows: 2 blocks
    }
    old = ext._set_isa_cap(2)
    try:
        wide = {k: f() for k, f in calls.items()}
        for cap in (1, 0):
            ext._set_isa_cap(cap)
            for k, f in calls.items():
                for x, y in zip(f(), wide[k]):
                    assert torch.equal(x == 0, y == 0), k
                    torch.testing.assert_close(x.double(), y.double(), rtol=1e-5 if dtype == torch.float32 else 1e-2,
                                               atol=1e-5 if dtype == torch.float32 else 1e-2, msg=k)
    finally:
        ext._set_isa_cap(old)


@pytest.mark.parametrize("T", [0, 1, 37])
@pytest.mark.parametrize("p, training", [(0.0, True), (0.3, True), (0.3, False)])
def test_input_rows_against_float64(T, p, training):
    # dropout_p(table[positions] + scale x): the kernel's value, dx and dtable against float64 torch
    # ops with the same mask (hstu_fused._mask_factor, the kernels' hash); positions repeat
    # across sequences (rows of different sequences add into one table row)
    g = torch.Generator().manual_seed(T + int(10 * p))
    D, N, scale = 70, 9, 3.5
    x0 = torch.randn(T, D, generator=g)
    table0 = torch.randn(N, D, generator=g)
    positions = torch.randint(0, N, (T,), generator=g)
    dy = torch.randn(T, D, generator=g)
    torch.manual_seed(7)  # the seed the op draws
    x, table = x0.clone().requires_grad_(), table0.clone().requires_grad_()
    y = hstu_fused.input_rows(x, table, positions, scale, p, training)
    y.backward(dy)
    torch.manual_seed(7)
    seed = hstu_fused._seed()
    on = training and p > 0
    m = (hstu_fused._mask_factor(T, D, p, seed, x.device, torch.float64) if on
         else torch.ones(T, D, dtype=torch.float64))
    xr, tr = x0.double().requires_grad_(), table0.double().requires_grad_()
    yr = (tr[positions] + scale * xr) * m
    yr.backward(dy.double())
    torch.testing.assert_close(y.double(), yr, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad.double(), xr.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(table.grad.double(), tr.grad, rtol=1e-6, atol=1e-6)
    if on and T:
        assert 0.5 < float((m == 0).double().mean()) / p < 1.5 or T * D < 100


def test_input_rows_same_as_dropout_of_the_sum():
    # the same mask as hstu_fused.dropout on table[positions] + scale x, given the same seed
    g = torch.Generator().manual_seed(3)
    x, table = torch.randn(50, 64, generator=g), torch.randn(20, 64, generator=g)
    positions = torch.randint(0, 20, (50,), generator=g)
    torch.manual_seed(11)
    a = hstu_fused.input_rows(x, table, positions, 2.0, 0.25, True)
    torch.manual_seed(11)
    b = hstu_fused.dropout(torch.add(table[positions], x, alpha=2.0), 0.25, True)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert torch.equal(a == 0, b == 0)


def test_input_rows_bad_positions():
    x, table = torch.randn(3, 4), torch.randn(5, 4)
    with pytest.raises(ValueError, match=r"positions: must be in \[0, 5\)"):
        extension.kernel("hstu_input_rows")(x, table, torch.tensor([0, 5, 1]), 1.0, 0.0, 0)
    with pytest.raises(ValueError, match=r"positions: expected a 1-D int64 CPU tensor \[3\], got int32"):
        extension.kernel("hstu_input_rows")(x, table, torch.tensor([0, 1, 1], dtype=torch.int32), 1.0, 0.0, 0)
    with pytest.raises(ValueError, match="x: expected a 2-D float32 CPU tensor, got bfloat16"):
        extension.kernel("hstu_input_rows")(x.bfloat16(), table, torch.tensor([0, 1, 1]), 1.0, 0.0, 0)
