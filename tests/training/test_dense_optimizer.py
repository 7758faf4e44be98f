"""trainer.DenseOptimizer against torch's own clip_grad_norm_ + (unfused) AdamW: clipping active
and inactive (active: applied by the fused CPU AdamW's grad_scale), the fused CPU AdamW chosen for
CPU parameters, a non-finite gradient refused before any weight changes."""

from __future__ import annotations

import math

import pytest
import torch

from torchrec_ascend.training.trainer import DenseOptimizer, NonFiniteTrainingError


def _params(seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in ((7, 5), (5,), (3, 4, 2))]


def _grads(seed: int, scale: float):
    g = torch.Generator().manual_seed(seed)
    return [scale * torch.randn(*s, generator=g) for s in ((7, 5), (5,), (3, 4, 2))]


@pytest.mark.parametrize("scale", [0.01, 10.0])  # the gradient norm under / over the clip
def test_steps_equal_torch_clip_and_adamw(scale):
    clip, lr, wd = 1.0, 1e-2, 0.01
    ours_p, ref_p = _params(0), _params(0)
    ours = DenseOptimizer(ours_p, lr, wd, clip)
    assert all(g["fused"] for g in ours.param_groups)  # CPU parameters: torch's fused AdamW
    ref = torch.optim.AdamW(ref_p, lr=lr, weight_decay=wd, betas=(0.9, 0.98), foreach=False)
    clipped = []
    for step in range(5):
        for p, q, gr in zip(ours_p, ref_p, _grads(10 + step, scale)):
            p.grad, q.grad = gr.clone(), gr.clone()
        norm = float(torch.nn.utils.clip_grad_norm_(ref_p, clip))
        clipped.append(norm > clip)
        ours.step_number = step + 1
        ours.step()
        ref.step()
        for p, q in zip(ours_p, ref_p):
            # the same (clipped) gradients: the fused AdamW divides by (norm + 1e-6) / clip where
            # clip_grad_norm_ multiplies by its inverse (one rounding apart)
            torch.testing.assert_close(p.grad, q.grad, rtol=3e-7, atol=0)
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)
    assert all(clipped) if scale > 1 else not any(clipped)
    assert not hasattr(ours.inner, "grad_scale")  # present only during a step


def test_non_finite_gradient_changes_nothing():
    ps = _params(1)
    opt = DenseOptimizer(ps, 1e-2, 0.0, 1.0)
    before = [p.detach().clone() for p in ps]
    for p, gr in zip(ps, _grads(2, 1.0)):
        p.grad = gr
    ps[1].grad[0] = math.inf
    opt.step_number = 3
    with pytest.raises(NonFiniteTrainingError, match="step 3"):
        opt.step()
    for p, b in zip(ps, before):
        assert torch.equal(p.detach(), b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradient_norm_against_float64(dtype):
    from torchrec_ascend.training.trainer import gradient_norm
    g = torch.Generator().manual_seed(4)
    grads = [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) * 3
             for s in [(512, 70), (33,), (1,), (0,), (7, 5, 3)]]
    ref = math.sqrt(sum(float((x.double() ** 2).sum()) for x in grads))
    n = gradient_norm(grads)
    assert n.dim() == 0 and n.dtype == dtype
    assert abs(float(n) - ref) <= (1e-6 if dtype == torch.float32 else 1e-12) * ref
    # non-contiguous gradients (a transposed view) read the same values
    assert float(gradient_norm([x.t() if x.dim() == 2 else x for x in grads])) == pytest.approx(ref, rel=1e-6)


def test_gradient_norm_non_finite_and_overflow():
    from torchrec_ascend.training.trainer import gradient_norm
    for bad in (math.nan, math.inf):
        x = torch.ones(10)
        x[3] = bad
        assert not math.isfinite(float(gradient_norm([torch.ones(4), x])))
    # squares near and past fp32's range: the fp32 dot overflows, get_total_norm decides
    for v in (1e17, 1e19, 1e20):
        big = [torch.full((4,), v), torch.ones(3)]
        want = float(torch.nn.utils.get_total_norm(big))
        got = float(gradient_norm(big))
        assert got == pytest.approx(want, rel=1e-6) if math.isfinite(want) else got == want
