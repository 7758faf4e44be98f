"""Half-precision rows and logits: per-row scales, valid-rows-only, error bounds vs fp32."""

from __future__ import annotations

import pytest
import torch

from torchrec_ascend.sampling import (NegativeSample, SampledSoftmaxLoss, UniformSampler,
                                      half_gemm_is_fast, half_logits, quantize_rows)

# unit roundoff of each format (half the spacing of 1.0)
UNIT = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("magnitude", [1e-7, 1.0, 1e6])
def test_quantize_rows_relative_error(dtype, magnitude):
    x = torch.randn(37, 19) * magnitude
    x[3] = 0.0  # a zero row keeps scale 1
    qr = quantize_rows(x, dtype, "auto")
    back = qr.dequantize()
    assert torch.isfinite(back).all()
    # every element within unit roundoff of its row's max (normal range of the format)
    amax = x.abs().amax(dim=1, keepdim=True)
    assert bool(((back - x).abs() <= UNIT[dtype] * amax + 0.0).all())
    if dtype == torch.float16 and magnitude != 1.0:
        assert qr.scale is not None  # fp16 range demands a scale here
        e = torch.log2(qr.scale)
        assert torch.equal(e, e.round())  # powers of two: scaling is exact
        plain = x.to(torch.float16).float()
        assert not torch.isfinite(plain).all() or (plain == 0).sum() > (x == 0).sum()
    else:
        assert qr.scale is None


def test_quantize_rows_forced_and_bad_args():
    x = torch.randn(5, 4)
    assert quantize_rows(x, torch.float16, True).scale is not None
    assert quantize_rows(x * 1e6, torch.float16, False).scale is None
    with pytest.raises(ValueError, match="dtype"):
        quantize_rows(x, torch.float32)
    with pytest.raises(ValueError, match="x: expected a 2-D"):
        quantize_rows(x[0], torch.float16)
    with pytest.raises(ValueError, match="per_row_scale"):
        quantize_rows(x, torch.float16, "sometimes")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scale", ["auto", True])
@pytest.mark.parametrize("compute", ["fp32", "half"])
@pytest.mark.parametrize("t", [1, 33, 64, 130])
def test_half_logits_forward_backward_vs_float64(dtype, scale, compute, t):
    """Forward: the fp64 product of the rounded rows, up to fp32 accumulation ("fp32" compute)
    plus one rounding of the output to the half format ("half" compute without an fp32-output
    GEMM, as on CPU).  Backward: also within the rounding of the cotangent and the operands.
    Query counts off and on the CPU's row multiple (zero rows padded in, sliced off)."""
    r, d = 17, 24
    q = torch.randn(t, d, dtype=torch.float64).float().requires_grad_(True)
    n = torch.randn(r, d, dtype=torch.float64).float().requires_grad_(True)
    out = half_logits(q, n, dtype, scale, compute)
    assert out.dtype == torch.float32 and out.shape == (t, r)
    u = UNIT[dtype]
    u_out = u if compute == "half" else 0.0
    qd = quantize_rows(q, dtype, scale).dequantize().double()
    nd = quantize_rows(n, dtype, scale).dequantize().double()
    bound = (u_out + 1e-6) * (qd.abs() @ nd.abs().t())
    assert bool(((out.double() - qd @ nd.t()).abs() <= bound).all())
    g = torch.randn(t, r)
    out.backward(g)
    gq_ref = g.double() @ n.detach().double()
    gn_ref = g.double().t() @ q.detach().double()
    # |dQ - G N| <= (2u + u_out + fp32 eps) |G| |N| elementwise (rounding of G, N, the output)
    bq = (2 * u + u_out + 1e-6) * (g.double().abs() @ n.detach().double().abs())
    bn = (2 * u + u_out + 1e-6) * (g.double().abs().t() @ q.detach().double().abs())
    assert bool(((q.grad.double() - gq_ref).abs() <= bq).all())
    assert bool(((n.grad.double() - gn_ref).abs() <= bn).all())
    assert q.grad.dtype == torch.float32 and n.grad.dtype == torch.float32


def test_half_gemm_is_fast_per_device():
    assert half_gemm_is_fast("cuda", torch.float16) and half_gemm_is_fast("cuda:1", torch.bfloat16)
    from torchrec_ascend import device
    cap = device.gemm_capability("cpu")
    for dt in (torch.bfloat16, torch.float16):
        measured_faster = dt in cap.gflops and cap.gflops[dt] > device.FASTER_MARGIN * cap.gflops[torch.float32]
        assert half_gemm_is_fast("cpu", dt) == measured_faster
    with pytest.raises(ValueError, match="compute"):
        half_logits(torch.randn(2, 3), torch.randn(2, 3), torch.float16, compute="fast")


@pytest.mark.parametrize("half,dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
@pytest.mark.parametrize("compute", ["fp32", "half"])
def test_loss_and_gradient_error_bound_vs_fp32(half, dtype, compute):
    """Bound from first principles for L2-normalised embeddings and temperature tau: rounding a
    unit vector moves it by at most u, so each logit moves by at most 2u/tau, plus u/tau when the
    output is rounded (|logit| <= 1/tau); the per-token loss lse(s) - s_pos moves by at most
    twice that.  Gradients: relative error <= 4 * (logit bound) + 6u."""
    tau, t, d, r, n_items = 0.05, 300, 64, 128, 5000
    g = torch.Generator().manual_seed(torch.initial_seed())
    pos = torch.randint(0, n_items, (t,), generator=g)
    neg = UniformSampler(n_items).sample(pos, r, g)
    q = torch.randn(t, d, generator=g) * 3
    pe, ne = torch.randn(t, d, generator=g), torch.randn(r, d, generator=g)
    u = UNIT[dtype]

    def run(hp):
        a, b = q.clone().requires_grad_(True), ne.clone().requires_grad_(True)
        loss = SampledSoftmaxLoss(temperature=tau, half_precision=hp,
                                  half_compute=compute)(a, pos, pe, neg, b)
        loss.backward()
        return loss.detach().double(), a.grad.double(), b.grad.double()

    l32, gq32, gn32 = run(None)
    l16, gq16, gn16 = run(half)
    dlogit = (3 if compute == "half" else 2) * u / tau
    assert abs(float(l16 - l32)) <= 2 * dlogit, (float(l16 - l32), 2 * dlogit)
    for a, b in ((gq16, gq32), (gn16, gn32)):
        rel = float((a - b).norm() / b.norm())
        assert rel <= 4 * dlogit + 6 * u, (rel, 4 * dlogit + 6 * u)


def test_only_valid_rows_are_quantised():
    """Padding rows with values far outside fp16 range (and NaN) change nothing: the valid rows
    alone decide whether a scale is needed, and the result equals the jagged-only loss."""
    t, d, r = 10, 16, 7
    valid = torch.tensor([1, 1, 0, 1, 0, 0, 1, 1, 1, 0], dtype=torch.bool)
    pos = torch.randint(0, 50, (t,))
    neg = UniformSampler(50).sample(pos, r)
    q, pe, ne = torch.randn(t, d), torch.randn(t, d), torch.randn(r, d)
    qp = q.clone()
    qp[~valid] = 1e9
    qp[2] = float("nan")
    f = SampledSoftmaxLoss(half_precision="fp16", l2_normalize=False, temperature=1.0)
    a = qp.clone().requires_grad_(True)
    out = f(a, pos, pe, neg, ne, valid_mask=valid)
    out.backward()
    rows = torch.nonzero(valid).squeeze(1)
    jag = NegativeSample(neg.ids, neg.log_q, neg.pos_log_q[rows])
    b = q[rows].clone().requires_grad_(True)
    want = f(b, pos[rows], pe[rows], jag, ne)
    want.backward()
    assert float(out.detach()) == float(want.detach())
    assert torch.equal(a.grad[rows], b.grad) and torch.count_nonzero(a.grad[~valid]) == 0


def test_loss_where_fp16_range_demands_per_row_scale():
    """Unnormalised rows at both ends of fp16's range: the temperature-folded query ~1e-6 (below
    fp16's smallest normal 6.1e-5) and negative rows ~1e5 (above its max 65504).  Without scales
    the half rows overflow (non-finite loss); with ``"auto"`` scales the loss and gradients stay
    within the rounding bound of the fp32 loss (logits are O(1): relative error ~ 2u * |logit|)."""
    t, d, r, n_items = 64, 32, 48, 1000
    g = torch.Generator().manual_seed(torch.initial_seed())
    pos = torch.randint(0, n_items, (t,), generator=g)
    neg = UniformSampler(n_items).sample(pos, r, g)
    tau = 1e10
    q = torch.randn(t, d, generator=g) * 1e4          # q / tau ~ 1e-6
    pe = torch.randn(t, d, generator=g) * 1e6
    ne = torch.randn(r, d, generator=g) * 1e5

    def run(hp, scale):
        a, b = q.clone().requires_grad_(True), ne.clone().requires_grad_(True)
        f = SampledSoftmaxLoss(temperature=tau, l2_normalize=False, half_precision=hp,
                               per_row_scale=scale, half_compute="fp32")
        loss = f(a, pos, pe, neg, b)
        if not torch.isfinite(loss):
            return loss.detach(), None, None
        loss.backward()
        return loss.detach().double(), a.grad.double(), b.grad.double()

    l32, gq32, gn32 = run(None, "auto")
    assert not torch.isfinite(run("fp16", False)[0])  # the range really is exceeded
    l16, gq16, gn16 = run("fp16", "auto")
    # |logit| <= max_j |q|.|n| / tau; rounding q and n moves each logit by <= 2u times that
    logit_max = float((q.abs() @ ne.abs().t()).max() / tau)
    u = UNIT[torch.float16]
    assert abs(float(l16 - l32)) <= 2 * 2 * u * logit_max, (float(l16 - l32), logit_max)
    for a, b in ((gq16, gq32), (gn16, gn32)):
        rel = float((a - b).norm() / b.norm())
        assert rel <= 4 * 2 * u * logit_max + 6 * u, rel
