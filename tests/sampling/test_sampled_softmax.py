"""SampledSoftmaxLoss against an explicit float64 per-token loop: loss and all gradients."""

from __future__ import annotations

import math
from typing import Dict, List, Optional

import pytest
import torch

from torchrec_ascend.sampling import (MixedSampler, NegativeSample, SampledSoftmaxLoss,
                                      UniformSampler, sampled_softmax_loss)


def _reference(q, pos_ids, pos_emb, neg: NegativeSample, neg_emb, extra=None, extra_emb=None,
               valid=None, neg_mask=None, tau=0.05, l2=True, logq=True, correct_pos=True,
               reduction="mean"):
    """float64, one token at a time, masked negatives simply left out of the sum."""
    def nrm(v):
        return v / v.norm().clamp_min(1e-12) if l2 else v

    losses: List[torch.Tensor] = []
    for t in range(q.shape[0]):
        if valid is not None and not bool(valid[t]):
            continue
        qt = nrm(q[t])
        s_pos = torch.dot(qt, nrm(pos_emb[t])) / tau
        if logq and correct_pos:
            s_pos = s_pos - neg.pos_log_q[t].double()
        terms = [s_pos]
        groups = [(neg, neg_emb, neg_mask)] + ([(extra, extra_emb, None)] if extra is not None else [])
        for s, emb, mask in groups:
            ids = s.ids if s.ids.dim() == 1 else s.ids[t]
            lq = s.log_q if s.log_q.dim() == 1 else s.log_q[t]
            rows = emb if emb.dim() == 2 else emb[t]
            for j in range(ids.shape[0]):
                if int(ids[j]) == int(pos_ids[t]) or (mask is not None and bool(mask[t, j])):
                    continue
                v = torch.dot(qt, nrm(rows[j])) / tau
                terms.append(v - lq[j].double() if logq else v)
        lse = torch.logsumexp(torch.stack(terms), 0)
        losses.append(lse - s_pos)
    out = torch.stack(losses) if losses else q.new_zeros(0).double()
    if reduction == "mean":
        return out.mean() if out.numel() else out.sum()
    return out.sum() if reduction == "sum" else out


def _leaf(x: torch.Tensor) -> torch.Tensor:
    return x.detach().clone().requires_grad_(True)


def _compare(inputs: Dict[str, torch.Tensor], run, ref, atol=2e-5, rtol=2e-5):
    """Run the module on float32 leaves and the reference on float64 leaves; compare all."""
    a = {k: _leaf(v.float()) for k, v in inputs.items()}
    b = {k: _leaf(v.double()) for k, v in inputs.items()}
    out, want = run(a), ref(b)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), want.detach(), atol=atol, rtol=rtol)
    w = torch.randn_like(want)  # random cotangent: checks every output element's gradient
    (out.double() * w).sum().backward()
    (want * w).sum().backward()
    for k in inputs:
        assert a[k].grad is not None and not torch.isnan(a[k].grad).any(), k
        torch.testing.assert_close(a[k].grad.double(), b[k].grad, atol=atol, rtol=rtol, msg=k)


def _batch(t=13, d=8, r=11, k=0, n=40, seed=None, hits=True, mixed=False):
    g = torch.Generator().manual_seed(seed if seed is not None else torch.initial_seed())
    pos = torch.randint(0, n, (t,), generator=g)
    sampler = MixedSampler(n) if mixed else UniformSampler(n)
    neg = sampler.sample(pos, r, g)
    if hits and not mixed:  # force accidental hits: some pool entries equal some positives
        neg.ids[: min(3, r)] = pos[: min(3, r)]
    ex = sampler.sample_per_token(pos, k, g) if k else None
    if ex is not None and hits:
        ex.ids[0, 0] = pos[0]
    tensors = {"q": torch.randn(t, d, generator=g), "pe": torch.randn(t, d, generator=g),
               "ne": torch.randn(neg.ids.numel(), d, generator=g)}
    if ex is not None:
        tensors["xe"] = torch.randn(t, k, d, generator=g)
    return pos, neg, ex, tensors


@pytest.mark.parametrize("l2,logq,correct_pos,tau,reduction", [
    (True, True, True, 0.05, "mean"),
    (False, True, True, 1.0, "sum"),
    (True, False, True, 0.2, "none"),
    (True, True, False, 0.07, "mean"),
])
def test_shared_pool_matches_float64_loop(l2, logq, correct_pos, tau, reduction):
    pos, neg, _, x = _batch()
    opts = dict(temperature=tau, l2_normalize=l2, logq_correction=logq,
                correct_positive=correct_pos, reduction=reduction)
    loss = SampledSoftmaxLoss(**opts)
    _compare(x, lambda a: loss(a["q"], pos, a["pe"], neg, a["ne"]),
             lambda b: _reference(b["q"], pos, b["pe"], neg, b["ne"], tau=tau, l2=l2, logq=logq,
                                  correct_pos=correct_pos, reduction=reduction))


@pytest.mark.parametrize("shared", [True, False])
def test_per_token_and_mixed_negatives(shared):
    pos, neg, ex, x = _batch(k=4, mixed=not shared)
    loss = SampledSoftmaxLoss(temperature=0.1)
    if shared:  # shared pool plus a few per-token negatives
        _compare(x, lambda a: loss(a["q"], pos, a["pe"], neg, a["ne"], extra_negatives=ex,
                                   extra_neg_emb=a["xe"]),
                 lambda b: _reference(b["q"], pos, b["pe"], neg, b["ne"], ex, b["xe"], tau=0.1))
    else:  # per-token negatives only
        x = {"q": x["q"], "pe": x["pe"], "xe": x["xe"]}
        _compare(x, lambda a: loss(a["q"], pos, a["pe"], ex, a["xe"]),
                 lambda b: _reference(b["q"], pos, b["pe"], ex, b["xe"], tau=0.1))


def test_jagged_valid_mask_lengths_0_1_max():
    """Padded [B, N] layout with lengths incl. 0, 1 and N: same as the jagged values alone."""
    lengths = torch.tensor([0, 1, 5, 3, 6])
    b, n_max, d = lengths.numel(), int(lengths.max()), 8
    valid = (torch.arange(n_max)[None, :] < lengths[:, None]).reshape(-1)
    tpad = b * n_max
    pos = torch.randint(0, 30, (tpad,))
    neg = UniformSampler(30).sample(pos[valid], 9)
    neg = NegativeSample(neg.ids, neg.log_q, torch.zeros(tpad).index_copy(
        0, torch.nonzero(valid).squeeze(1), neg.pos_log_q))
    mask = torch.rand(tpad, 9) < 0.2
    x = {"q": torch.randn(tpad, d), "pe": torch.randn(tpad, d), "ne": torch.randn(9, d)}
    x["q"][~valid] = float("nan")  # padding rows are never touched
    x["pe"][~valid] = 1e6
    loss = SampledSoftmaxLoss()
    a = {k: _leaf(v) for k, v in x.items()}
    out = loss(a["q"], pos, a["pe"], neg, a["ne"], valid_mask=valid, neg_mask=mask)
    out.backward()
    bx = {k: _leaf(v.double()) for k, v in x.items()}
    want = _reference(bx["q"], pos, bx["pe"], neg, bx["ne"], valid=valid, neg_mask=mask)
    want.backward()
    torch.testing.assert_close(out.double(), want.detach(), atol=2e-5, rtol=2e-5)
    for k in x:
        g = a[k].grad
        assert not torch.isnan(g).any(), k
        torch.testing.assert_close(g.double(), bx[k].grad, atol=2e-5, rtol=2e-5, equal_nan=False)
    assert torch.count_nonzero(a["q"].grad[~valid]) == 0


def test_positive_in_pool_is_masked_not_downweighted():
    """Every token has the same positive, which is also pool entry 0: that row gets no gradient
    at all and the loss equals the loss of the pool without it."""
    t, d = 6, 8
    torch.manual_seed(1234)
    pos = torch.full((t,), 7)
    ids = torch.tensor([7, 1, 2, 3])
    neg = NegativeSample(ids, torch.zeros(4), torch.zeros(t))
    q, pe, ne = torch.randn(t, d), torch.randn(t, d), _leaf(torch.randn(4, d))
    loss_fn = SampledSoftmaxLoss(temperature=0.1, logq_correction=False)
    out = loss_fn(q, pos, pe, neg, ne)
    out.backward()
    assert torch.count_nonzero(ne.grad[0]) == 0 and torch.count_nonzero(ne.grad[1:]) > 0
    without = loss_fn(q, pos, pe, NegativeSample(ids[1:], torch.zeros(3), torch.zeros(t)),
                      ne.detach()[1:])
    # The two losses reduce rows of different length (4 vs 3 logits), so the vectorised
    # logsumexp may round differently by CPU (AVX2 vs AVX-512): compare with a tolerance far
    # below what a down-weighted positive would change (a logit counted at any finite weight
    # moves the loss by > 1e-3 here; the float64 loop below pins the exact value).
    torch.testing.assert_close(out.detach(), without.detach(), rtol=1e-6, atol=0.0)
    expect = _reference(q.double(), pos, pe.double(), neg, ne.detach().double(), tau=0.1,
                        logq=False)
    torch.testing.assert_close(out.detach().double(), expect, rtol=1e-6, atol=0.0)


def test_all_negatives_masked_gives_zero_loss_and_finite_grads():
    pos = torch.tensor([3, 3])
    neg = NegativeSample(torch.tensor([3, 3]), torch.zeros(2), torch.zeros(2))
    q, ne = _leaf(torch.randn(2, 4)), _leaf(torch.randn(2, 4))
    out = SampledSoftmaxLoss()(q, pos, torch.randn(2, 4), neg, ne)
    out.backward()
    assert float(out.detach()) == 0.0
    assert torch.isfinite(q.grad).all() and torch.count_nonzero(ne.grad) == 0


def test_functional_form_and_int32_ids():
    pos, neg, _, x = _batch(seed=3)
    a = SampledSoftmaxLoss(temperature=0.2)(x["q"], pos, x["pe"], neg, x["ne"])
    b = sampled_softmax_loss(x["q"], pos.int(), x["pe"], neg, x["ne"], temperature=0.2)
    assert float(a) == float(b)


def test_bad_arguments():
    pos, neg, ex, x = _batch(k=2, seed=4)
    f = SampledSoftmaxLoss()
    with pytest.raises(ValueError, match="temperature"):
        SampledSoftmaxLoss(temperature=0.0)
    with pytest.raises(ValueError, match="half_precision"):
        SampledSoftmaxLoss(half_precision="fp8")
    with pytest.raises(ValueError, match="reduction"):
        SampledSoftmaxLoss(reduction="max")
    with pytest.raises(ValueError, match="neg_emb.*R=11"):
        f(x["q"], pos, x["pe"], neg, x["ne"][:5])
    with pytest.raises(ValueError, match="pos_ids/pos_emb"):
        f(x["q"], pos[:3], x["pe"], neg, x["ne"])
    with pytest.raises(ValueError, match="query.*2-D"):
        f(x["q"][0], pos, x["pe"], neg, x["ne"])
    with pytest.raises(ValueError, match="extra_negatives/extra_neg_emb"):
        f(x["q"], pos, x["pe"], neg, x["ne"], extra_negatives=ex)
    with pytest.raises(ValueError, match="extra_negatives: must be per-token"):
        f(x["q"], pos, x["pe"], neg, x["ne"], extra_negatives=neg, extra_neg_emb=x["ne"])
    with pytest.raises(ValueError, match="valid_mask"):
        f(x["q"], pos, x["pe"], neg, x["ne"], valid_mask=torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="neg_mask"):
        f(x["q"], pos, x["pe"], neg, x["ne"], neg_mask=torch.ones(2, 2, dtype=torch.bool))
    bad = NegativeSample(neg.ids, neg.log_q, torch.full_like(neg.pos_log_q, -math.inf))
    with pytest.raises(ValueError, match="pos_log_q.*not finite"):
        f(x["q"], pos, x["pe"], bad, x["ne"])
    with pytest.raises(ValueError, match="negatives.*NegativeSample"):
        f(x["q"], pos, x["pe"], neg.ids, x["ne"])


def test_pool_hits_equal_dense_compare_with_repeats():
    from torchrec_ascend.sampling.loss import _pool_hits
    for _ in range(5):
        pool = torch.randint(0, 6, (int(torch.randint(1, 20, (1,))),))
        pos = torch.randint(0, 8, (int(torch.randint(0, 15, (1,))),))
        hits = _pool_hits(pool, pos)
        assert hits.ptr.numel() == pos.numel() + 1 and int(hits.ptr[0]) == 0
        t_idx, j_idx = hits.pairs()
        got = torch.zeros(pos.numel(), pool.numel(), dtype=torch.bool)
        got[t_idx, j_idx] = True
        assert t_idx.numel() == int(got.sum())  # no pair twice
        assert torch.equal(got, pos[:, None] == pool[None, :])


@pytest.mark.parametrize("kind", ["in_batch", "mixed"])
def test_no_positive_leaks_as_negative_with_real_samplers(kind):
    """In-batch pools hold every token's positive (or most of them): for each token, the pool rows
    equal to its positive receive exactly zero gradient from that token's loss, and every other
    row a non-zero one; the loss equals the float64 loop that leaves those rows out."""
    from torchrec_ascend.sampling import make_sampler
    n, t, d = 25, 12, 6
    g = torch.Generator().manual_seed(torch.initial_seed())
    pos = torch.randint(0, n, (t,), generator=g)
    neg = make_sampler(kind, n).sample(pos, 20, g)
    assert bool(torch.isin(pos, neg.ids).all()) or kind == "mixed"
    x = {"q": torch.randn(t, d, generator=g), "pe": torch.randn(t, d, generator=g),
         "ne": torch.randn(neg.ids.numel(), d, generator=g)}
    loss = SampledSoftmaxLoss(temperature=0.3, reduction="none")
    ne = _leaf(x["ne"])
    per_token = loss(x["q"], pos, x["pe"], neg, ne)
    for i in range(t):
        (grad,) = torch.autograd.grad(per_token[i], ne, retain_graph=True)
        hit = neg.ids == pos[i]
        assert torch.count_nonzero(grad[hit]) == 0, i
        assert bool((grad[~hit].abs().sum(1) > 0).all()), i
    _compare(x, lambda a: loss(a["q"], pos, a["pe"], neg, a["ne"]),
             lambda b: _reference(b["q"], pos, b["pe"], neg, b["ne"], tau=0.3, reduction="none"))


@pytest.mark.parametrize("logq", [True, False])
@pytest.mark.parametrize("neg_mask", [False, True])
def test_half_pool_loss_against_float64_of_the_rounded_rows(logq, neg_mask):
    """The shared bf16 pool (logits kept in bf16, logQ bias and accidental hits inside the row
    kernel): loss and gradients against float64 torch ops on the same bf16-rounded rows, many
    hits, with and without a dense neg_mask; the hits' and masked entries' logits get no
    gradient (the pool rows' gradient equals the reference's, which leaves them out)."""
    from torchrec_ascend.sampling.quant import half_logits
    g = torch.Generator().manual_seed(3)
    t, d, r = 301, 64, 96
    pos = torch.randint(0, 40, (t,), generator=g)
    pool = torch.randint(0, 40, (r,), generator=g)
    lq = torch.rand(r, generator=g).log() - 3
    plq = torch.rand(t, generator=g).log() - 3
    q0, pe0, ne0 = (torch.randn(n, d, generator=g) for n in (t, t, r))
    mask = (torch.rand(t, r, generator=g) < 0.1) if neg_mask else None
    tau = 0.05
    f = SampledSoftmaxLoss(temperature=tau, reduction="sum", half_precision="bf16",
                           half_compute="half", logq_correction=logq)
    q, pe, ne = (x.clone().requires_grad_() for x in (q0, pe0, ne0))
    loss = f(q, pos, pe, NegativeSample(pool, lq, plq), ne, neg_mask=mask)
    loss.backward()
    # reference: float64 on the bf16-rounded unit rows (the half GEMM's operands); hits and
    # masked entries left out; straight-through rounding as the loss's backward
    qr, per, ner = (x.double().requires_grad_() for x in (q0, pe0, ne0))
    qn = torch.nn.functional.normalize(qr, dim=1) / tau
    nn_ = torch.nn.functional.normalize(ner, dim=1)
    rq = qn + (qn.detach().float().bfloat16().double() - qn.detach())
    rn = nn_ + (nn_.detach().float().bfloat16().double() - nn_.detach())
    logits = rq @ rn.t()
    if logq:
        logits = logits - lq.double()
    out = (pos[:, None] == pool[None, :]) | (mask if mask is not None else False)
    logits = logits.masked_fill(out, float("-inf"))
    p = (qn * torch.nn.functional.normalize(per, dim=1)).sum(1)
    if logq:
        p = p - plq.double()
    ref = (torch.logsumexp(torch.stack([p, torch.logsumexp(logits, 1)], 1), 1) - p).sum()
    ref.backward()
    assert int((pos[:, None] == pool[None, :]).sum()) > t
    # the product of rounded rows in bf16 (one rounding of each logit) vs exact float64 products
    torch.testing.assert_close(loss.double(), ref.detach(), rtol=2e-3, atol=0)
    for a, b in ((q.grad, qr.grad), (pe.grad, per.grad), (ne.grad, ner.grad)):
        torch.testing.assert_close(a.double(), b, rtol=0.05, atol=0.02 * float(b.abs().max()))
