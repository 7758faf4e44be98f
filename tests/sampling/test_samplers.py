"""Samplers: distributions, logQ (Horvitz-Thompson unbiasedness), determinism, bad arguments."""

from __future__ import annotations

import math

import pytest
import torch

from torchrec_ascend.sampling import (InBatchSampler, MixedSampler, NegativeSample,
                                      PopularitySampler, UniformSampler, make_sampler)


def _chi2(observed: torch.Tensor, expected: torch.Tensor) -> float:
    keep = expected > 0
    return float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def _chi2_bound(df: int) -> float:
    # chi-square with df degrees of freedom: mean df, sd sqrt(2 df); 6 sd is p < 1e-6
    return df + 6.0 * math.sqrt(2.0 * df)


def test_uniform_is_uniform_and_log_q():
    n, r = 50, 200_000
    g = torch.Generator().manual_seed(torch.initial_seed())
    s = UniformSampler(n).sample(torch.tensor([3, 7]), r, g)
    assert s.ids.shape == (r,) and s.ids.dtype == torch.int64 and s.shared
    assert int(s.ids.min()) >= 0 and int(s.ids.max()) < n
    counts = torch.bincount(s.ids, minlength=n).double()
    assert _chi2(counts, torch.full((n,), r / n, dtype=torch.float64)) < _chi2_bound(n - 1)
    torch.testing.assert_close(s.log_q, torch.full((r,), math.log(r / n)))
    torch.testing.assert_close(s.pos_log_q, torch.full((2,), math.log(r / n)))


def test_popularity_frequencies_match_counts():
    n, r = 40, 200_000
    counts = torch.rand(n) * 10
    counts[5] = 0.0  # never drawn
    g = torch.Generator().manual_seed(torch.initial_seed())
    sampler = PopularitySampler(counts, alpha=0.75)
    s = sampler.sample(torch.tensor([1]), r, g)
    w = counts.double() ** 0.75
    q = w / w.sum()
    obs = torch.bincount(s.ids, minlength=n).double()
    assert int(obs[5]) == 0
    assert _chi2(obs, q * r) < _chi2_bound(n - 2)
    torch.testing.assert_close(s.log_q.double(), torch.log(q[s.ids] * r), rtol=1e-5, atol=1e-5)
    pt = sampler.sample_per_token(torch.tensor([1, 2, 3]), 7, g)
    assert pt.ids.shape == (3, 7) and not pt.shared
    torch.testing.assert_close(pt.log_q.double(), torch.log(q[pt.ids] * 7), rtol=1e-5, atol=1e-5)


def _ht_check(draw, f: torch.Tensor, trials: int) -> None:
    """mean over trials of sum_k f(ids_k)/exp(log_q_k) must match sum_i f(i) (unbiased)."""
    est = torch.empty(trials, dtype=torch.float64)
    for i in range(trials):
        ids, log_q = draw(i)
        est[i] = (f[ids] / torch.exp(log_q.double())).sum()
    truth = float(f.sum())
    se = float(est.std()) / math.sqrt(trials)
    assert abs(float(est.mean()) - truth) < 5 * se + 1e-9 * truth, (float(est.mean()), truth, se)


def _items_sampler_and_f(kind, n):
    """The item distribution p, a sampler of ``kind`` over it, a generator, and the function f
    whose full-corpus sum the Horvitz-Thompson checks estimate."""
    p = torch.rand(n, dtype=torch.float64) + 0.2
    p /= p.sum()
    sampler = make_sampler(kind, n, counts=p) if kind != "uniform" else UniformSampler(n)
    g = torch.Generator().manual_seed(torch.initial_seed())
    f = torch.rand(n, dtype=torch.float64) + 0.5
    return p, sampler, g, f


@pytest.mark.parametrize("kind", ["uniform", "popularity", "in_batch", "mixed"])
def test_log_q_is_expected_count_shared_pool(kind):
    """Horvitz-Thompson with the reported log_q is unbiased for the full-corpus sum.

    Batches are T iid draws from the item distribution p (what in-batch log_q models);
    the pool is large enough that in-batch items are not subsampled (exact case).
    """
    n, t, r = 30, 8, 24
    p, sampler, g, f = _items_sampler_and_f(kind, n)

    def draw(_):
        pos = torch.multinomial(p, t, replacement=True, generator=g)
        s = sampler.sample(pos, r, g)
        assert s.ids.shape == s.log_q.shape and s.pos_log_q.shape == (t,)
        return s.ids, s.log_q

    _ht_check(draw, f, trials=1000)


@pytest.mark.parametrize("kind", ["uniform", "popularity", "in_batch", "mixed"])
def test_log_q_is_expected_count_per_token(kind):
    n, t, k = 30, 6, 5
    p, sampler, g, f = _items_sampler_and_f(kind, n)

    def draw(_):
        pos = torch.multinomial(p, t, replacement=True, generator=g)
        s = sampler.sample_per_token(pos, k, g)
        assert s.ids.shape == (t, k) == s.log_q.shape
        row = int(torch.randint(t, (1,), generator=g))
        return s.ids[row], s.log_q[row]

    _ht_check(draw, f, trials=1000)


def test_in_batch_pool_is_deduplicated_batch():
    pos = torch.tensor([4, 4, 9, 1, 9, 9, 2])
    s = InBatchSampler(10).sample(pos, 16)
    assert sorted(s.ids.tolist()) == [1, 2, 4, 9]
    # batch estimate: p = c/T, log_q = log(1 - (1 - c/T)^T)
    c = torch.tensor([float((pos == i).sum()) for i in s.ids.tolist()], dtype=torch.float64)
    want = torch.log(1 - (1 - c / 7) ** 7)
    torch.testing.assert_close(s.log_q.double(), want, rtol=1e-5, atol=1e-6)
    # subsampled: R of the U distinct items, uniformly, and log_q carries log(R/U)
    g = torch.Generator().manual_seed(0)
    sub = InBatchSampler(10).sample(pos, 2, g)
    assert sub.ids.numel() == 2 and len(set(sub.ids.tolist())) == 2
    assert set(sub.ids.tolist()) <= {1, 2, 4, 9}
    full = dict(zip(s.ids.tolist(), s.log_q.tolist()))
    for i, lq in zip(sub.ids.tolist(), sub.log_q.tolist()):
        assert abs(lq - (full[i] + math.log(2 / 4))) < 1e-5


def test_mixed_pool_layout_and_log_q():
    n = 100
    pos = torch.tensor([3, 3, 50])
    g = torch.Generator().manual_seed(1)
    s = MixedSampler(n, num_uniform=6).sample(pos, 10, g)
    assert s.ids[:2].tolist() == [3, 50] and s.ids.numel() == 8  # 2 in-batch + 6 uniform
    ib = InBatchSampler(n).log_inclusion(pos, s.ids).double()
    want = torch.log(torch.exp(ib) + 6 / n)
    torch.testing.assert_close(s.log_q.double(), want, rtol=1e-5, atol=1e-6)
    only_uniform = MixedSampler(n, uniform_fraction=1.0).sample(pos, 10, g)
    torch.testing.assert_close(only_uniform.log_q, torch.full((10,), math.log(10 / n)))


def test_same_generator_state_same_sample():
    pos = torch.randint(0, 1000, (64,))
    for s in (UniformSampler(1000), InBatchSampler(1000), MixedSampler(1000),
              PopularitySampler(torch.rand(1000))):
        a = s.sample(pos, 20, torch.Generator().manual_seed(5))
        b = s.sample(pos, 20, torch.Generator().manual_seed(5))
        assert torch.equal(a.ids, b.ids) and torch.equal(a.log_q, b.log_q)


def test_int32_positive_ids_accepted():
    s = UniformSampler(10).sample(torch.tensor([1, 2], dtype=torch.int32), 3)
    assert s.ids.dtype == torch.int64 and isinstance(s, NegativeSample)


@pytest.mark.parametrize("r", [0, -3])
def test_bad_num_negatives(r):
    for s in (UniformSampler(10), InBatchSampler(10), MixedSampler(10),
              PopularitySampler(torch.ones(10))):
        with pytest.raises(ValueError, match="num_negatives"):
            s.sample(torch.tensor([1]), r)
        with pytest.raises(ValueError, match="num_negatives"):
            s.sample_per_token(torch.tensor([1]), r)


def test_empty_corpus_and_bad_counts():
    with pytest.raises(ValueError, match="num_items.*non-empty"):
        UniformSampler(0)
    with pytest.raises(ValueError, match="num_items"):
        MixedSampler(-1)
    with pytest.raises(ValueError, match="counts.*non-empty"):
        PopularitySampler(torch.zeros(0))
    with pytest.raises(ValueError, match="counts"):
        PopularitySampler(torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match="counts.*zero"):
        PopularitySampler(torch.zeros(4))
    with pytest.raises(ValueError, match="counts"):
        InBatchSampler(5, counts=torch.ones(4))
    with pytest.raises(ValueError, match="name"):
        make_sampler("nope", 10)
    with pytest.raises(ValueError, match="counts"):
        make_sampler("popularity", 10)


@pytest.mark.parametrize("bad", [-1, 10, 1 << 40])
def test_ids_out_of_range(bad):
    for s in (UniformSampler(10), InBatchSampler(10), MixedSampler(10),
              PopularitySampler(torch.ones(10))):
        with pytest.raises(ValueError, match=r"pos_ids.*out of range \[0, num_items=10\)"):
            s.sample(torch.tensor([1, bad]), 4)


def test_bad_pos_ids_type_and_empty_batch():
    with pytest.raises(ValueError, match="pos_ids.*dtype"):
        UniformSampler(10).sample(torch.tensor([1.0]), 4)
    with pytest.raises(ValueError, match="pos_ids.*1-D"):
        UniformSampler(10).sample(torch.tensor([[1]]), 4)
    with pytest.raises(ValueError, match="pos_ids.*at least one token"):
        InBatchSampler(10).sample(torch.zeros(0, dtype=torch.int64), 4)
    with pytest.raises(ValueError, match="uniform_fraction"):
        MixedSampler(10, uniform_fraction=1.5)
