"""Retrieval metrics against a float64 pure-Python loop."""

from __future__ import annotations

import math

import pytest
import torch

from torchrec_ascend.metrics import (NonFiniteScoreError, RetrievalMetrics, check_finite_scores,
                                    filter_history, metrics_from_ranks, target_ranks)


def loop_metrics(scores, targets, histories, ks):
    """Oracle: per query, drop history items (the target too: a target in the history ranks
    after every other item), count the other items ranked at or above the target (higher or
    equal score: the pessimistic tie rule), then HR / NDCG / MRR in float64."""
    hr = {k: 0.0 for k in ks}
    ndcg = {k: 0.0 for k in ks}
    mrr = 0.0
    s = scores.tolist()
    for b, row in enumerate(s):
        t = int(targets[b])
        hist = set(int(h) for h in histories[b])
        rank = 0
        for i, v in enumerate(row):
            if i == t:
                continue
            if t in hist or (i not in hist and v >= row[t]):
                rank += 1
        for k in ks:
            if rank < k:
                hr[k] += 1.0
                ndcg[k] += 1.0 / math.log2(rank + 2)
        mrr += 1.0 / (rank + 1)
    n = len(s)
    out = {f"hr@{k}": hr[k] / n for k in ks}
    out.update({f"ndcg@{k}": ndcg[k] / n for k in ks})
    out["mrr"] = mrr / n
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_vs_float64_loop(seed):
    g = torch.Generator().manual_seed(seed)
    b, n, ks = 37, 211, (1, 10, 50, 200)
    # integer-valued scores create many ties (the most-popular case)
    scores = torch.randint(0, 20, (b, n), generator=g).float()
    scores[: b // 2] = torch.randn(b // 2, n, generator=g)
    targets = torch.randint(0, n, (b,), generator=g)
    lens = torch.randint(0, 40, (b,), generator=g)
    lens[0], lens[1], lens[2] = 0, 1, n  # empty, one, everything (target included)
    hist = [torch.randint(0, n, (int(l),), generator=g) for l in lens]
    hist[2] = torch.arange(n)
    hist[3] = torch.cat([hist[3], targets[3:4]])  # target in history: filtered, a miss
    offsets = torch.zeros(b + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor([len(h) for h in hist]), 0)
    flat = torch.cat(hist)
    m = RetrievalMetrics(ks)
    # in two batches, to exercise accumulation
    for lo, hi in ((0, 20), (20, b)):
        sub_off = offsets[lo:hi + 1] - offsets[lo]
        sub_hist = flat[offsets[lo]:offsets[hi]]
        filt = filter_history(scores[lo:hi], sub_hist, sub_off)
        m.update(target_ranks(filt, targets[lo:hi]))
    got = m.compute()
    want = loop_metrics(scores.double(), targets, hist, ks)
    assert m.count == b
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=1e-12), k
    ranks = target_ranks(filter_history(scores, flat, offsets), targets).tolist()
    assert metrics_from_ranks(ranks, ks) == pytest.approx(want, abs=1e-12)
    assert ranks[2] == n - 1 and ranks[3] == n - 1  # targets in the history: misses


def test_filter_history_does_not_modify_input():
    s = torch.randn(2, 5)
    keep = s.clone()
    out = filter_history(s, torch.tensor([1, 2, 4]), torch.tensor([0, 2, 3]))
    assert torch.equal(s, keep)
    assert torch.isinf(out[0, 1]) and torch.isinf(out[0, 2]) and torch.isinf(out[1, 4])
    assert not torch.isinf(out[0, 0]) and not torch.isinf(out[1, 2])


def test_errors():
    with pytest.raises(ValueError, match="targets"):
        target_ranks(torch.zeros(2, 3), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="history_offsets"):
        filter_history(torch.zeros(2, 3), torch.tensor([0]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="history"):
        filter_history(torch.zeros(1, 3), torch.tensor([5]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="ks"):
        RetrievalMetrics([0])


def test_ties_do_not_favour_low_item_indices():
    """Relabelling the items (a column permutation) never changes a target's rank, and a target
    tied with every candidate is ranked last (pessimistic), whatever its index."""
    g = torch.Generator().manual_seed(5)
    b, n = 16, 50
    scores = torch.randint(0, 4, (b, n), generator=g).float()  # heavy ties
    targets = torch.randint(0, n, (b,), generator=g)
    perm = torch.randperm(n, generator=g)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(n)
    ranks = target_ranks(scores, targets)
    ranks_perm = target_ranks(scores[:, perm], inv[targets])
    assert torch.equal(ranks, ranks_perm)
    flat = torch.zeros(3, n)
    assert target_ranks(flat, torch.tensor([0, 17, n - 1])).tolist() == [n - 1] * 3


def test_non_finite_scores_are_errors_not_metrics():
    scores = torch.randn(3, 6)
    scores[1, 2] = float("nan")
    with pytest.raises(NonFiniteScoreError, match="evaluation batch 4, user 42"):
        check_finite_scores(scores, users=[7, 42, 9], batch=4)
    with pytest.raises(NonFiniteScoreError):  # NaN at the target: once rank 0, HR = 1
        target_ranks(scores, torch.tensor([0, 2, 1]))
    with pytest.raises(NonFiniteScoreError):  # NaN elsewhere in the row
        target_ranks(scores, torch.tensor([0, 1, 1]))
    inf = torch.randn(2, 4)
    inf[0, 3] = float("inf")
    with pytest.raises(NonFiniteScoreError, match="row 0"):
        check_finite_scores(inf)
    with pytest.raises(NonFiniteScoreError):
        target_ranks(inf, torch.tensor([3, 0]))
    # -inf from history filtering is allowed (those candidates are out), a finite target ranks
    filt = filter_history(torch.randn(2, 4), torch.tensor([1, 2]), torch.tensor([0, 1, 2]))
    assert target_ranks(filt, torch.tensor([0, 0])).shape == (2,)
    assert target_ranks(filt, torch.tensor([1, 0])).tolist()[0] == 3  # filtered: last
    check_finite_scores(torch.randn(2, 4))
