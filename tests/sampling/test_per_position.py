"""Indexed per-token negatives (``neg_index``, the trainer's ``train.negatives=per_position``):
the loss against a float64 loop and against the reference protocol's own formula
(generative-recommenders' research SampledSoftmaxLoss: K uniform negatives per position, a
sampled id equal to the position's positive set to -5e4 after the temperature, no logQ)."""

from __future__ import annotations

import pytest
import torch

from torchrec_ascend.sampling import NegativeSample, SampledSoftmaxLoss, UniformSampler
from torchrec_ascend.sampling import loss as loss_mod

from test_sampled_softmax import _compare, _reference

N, T, K, D = 30, 17, 6, 8


def _indexed(seed: int, t: int = T, k: int = K, n: int = N, hits: bool = True):
    """Per-token uniform negatives with forced accidental hits, their distinct ids and index."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, n, (t,), generator=g)
    neg = UniformSampler(n).sample_per_token(pos, k, g)
    if hits:
        neg.ids[0, 0] = pos[0]
        neg.ids[1, :3] = pos[1]
        neg.ids[2, :] = pos[2]  # every negative of token 2 is its positive
    uniq, idx = torch.unique(neg.ids, return_inverse=True)
    x = {"q": torch.randn(t, D, generator=g), "pe": torch.randn(t, D, generator=g),
         "u": torch.randn(uniq.numel(), D, generator=g)}
    return pos, neg, idx, x


@pytest.mark.parametrize("path", ["gemm", "gather"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_indexed_per_token_matches_float64_loop(monkeypatch, path, reduction):
    """Loss and gradients (query, positive, the distinct rows) equal the float64 loop over
    ``u[idx]``; both logit paths (GEMM + gather, row gather) are exercised."""
    monkeypatch.setattr(loss_mod, "GEMM_GATHER_RATIO", 10 ** 6 if path == "gemm" else 0)
    pos, neg, idx, x = _indexed(seed=11)
    loss = SampledSoftmaxLoss(temperature=0.05, reduction=reduction)
    _compare(x, lambda a: loss(a["q"], pos, a["pe"], neg, a["u"], neg_index=idx),
             lambda b: _reference(b["q"], pos, b["pe"], neg, b["u"][idx], tau=0.05,
                                  reduction=reduction))


def test_equals_the_reference_protocol_formula():
    """Uniform per-position negatives with logQ correction (positive corrected too) give the
    reference's loss: its logQ is the same constant for every logit, so it cancels; a sampled id
    equal to the positive counts for nothing (reference: -5e4 after the temperature, exp = 0);
    a position whose K negatives all equal its positive has loss 0."""
    pos, neg, idx, x = _indexed(seed=5)
    tau = 0.05
    ours = SampledSoftmaxLoss(temperature=tau, reduction="none")(
        x["q"], pos, x["pe"], neg, x["u"], neg_index=idx)
    q = torch.nn.functional.normalize(x["q"].double(), dim=-1)
    pe = torch.nn.functional.normalize(x["pe"].double(), dim=-1)
    ne = torch.nn.functional.normalize(x["u"].double(), dim=-1)[idx]
    pos_logit = (q * pe).sum(-1, keepdim=True) / tau
    neg_logits = torch.where(neg.ids == pos[:, None], torch.tensor(-5e4, dtype=torch.float64),
                             torch.einsum("td,tkd->tk", q, ne) / tau)
    want = -torch.log_softmax(torch.cat([pos_logit, neg_logits], 1), 1)[:, 0]
    torch.testing.assert_close(ours.double(), want, rtol=1e-5, atol=1e-5)
    assert float(ours[2]) == 0.0


def test_hit_rows_get_no_gradient_from_their_token():
    """The distinct row of a token's positive, sampled as that token's negative, receives no
    gradient through that negative: with every negative of token 2 equal to its positive, the
    row's gradient from token 2's loss is exactly zero."""
    pos, neg, idx, x = _indexed(seed=8)
    u = x["u"].clone().requires_grad_(True)
    per = SampledSoftmaxLoss(temperature=0.1, reduction="none")(
        x["q"], pos, x["pe"], neg, u, neg_index=idx)
    (grad,) = torch.autograd.grad(per[2], u)
    assert torch.count_nonzero(grad) == 0


def test_valid_mask_drops_rows_of_the_index():
    pos, neg, idx, x = _indexed(seed=3)
    valid = torch.arange(T) % 3 != 0
    x["q"][~valid] = float("nan")  # padding rows are never touched
    loss = SampledSoftmaxLoss(temperature=0.2)
    got = loss(x["q"], pos, x["pe"], neg, x["u"], valid_mask=valid, neg_index=idx)
    rows = torch.nonzero(valid).squeeze(1)
    sub = NegativeSample(neg.ids[rows], neg.log_q[rows], neg.pos_log_q[rows])
    want = loss(x["q"][rows], pos[rows], x["pe"][rows], sub, x["u"], neg_index=idx[rows])
    assert torch.isfinite(got) and float(got) == pytest.approx(float(want), rel=1e-6)


def test_bad_index_arguments():
    pos, neg, idx, x = _indexed(seed=4)
    f = SampledSoftmaxLoss()
    shared = UniformSampler(N).sample(pos, 5)
    with pytest.raises(ValueError, match=r"neg_index: needs per-token negatives"):
        f(x["q"], pos, x["pe"], shared, x["u"], neg_index=idx)
    with pytest.raises(ValueError, match=r"neg_index: needs per-token negatives"):
        f(x["q"], pos, x["pe"], neg, x["u"], neg_index=idx[:, :2])
    with pytest.raises(ValueError, match=r"neg_emb: with neg_index expected shape \[U, D=8\]"):
        f(x["q"], pos, x["pe"], neg, x["u"][idx], neg_index=idx)
    with pytest.raises(ValueError, match=r"neg_index: values must be in \[0, U="):
        f(x["q"], pos, x["pe"], neg, x["u"][:2], neg_index=idx)
