"""Ranking metrics against float64 loops (pairs of positives and negatives) and against
TorchRec's own ``torchrec.metrics`` (AUC, NE; GAUC on equal-size groups)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchrec_ascend.metrics import auc, gauc, log_loss, normalized_entropy, ranking_metrics


def pair_auc(scores, labels):
    """Oracle: the share of (positive, negative) pairs ordered right, ties counted half."""
    pos = [s for s, y in zip(scores, labels) if y == 1]
    neg = [s for s, y in zip(scores, labels) if y == 0]
    if not pos or not neg:
        return None
    good = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return good / (len(pos) * len(neg))


def loop_gauc(scores, labels, groups):
    num = den = 0.0
    for g in sorted(set(groups)):
        idx = [i for i, x in enumerate(groups) if x == g]
        a = pair_auc([scores[i] for i in idx], [labels[i] for i in idx])
        if a is not None:
            num += a * len(idx)
            den += len(idx)
    return num / den if den else None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auc_and_gauc_equal_the_pair_loops(seed):
    rng = np.random.default_rng(seed)
    n = 300
    labels = (rng.random(n) < 0.3).astype(np.float32)
    scores = np.round(rng.random(n) + 0.3 * labels, 1)  # many ties
    groups = rng.integers(0, 25, n)
    groups[:5] = 99  # a user with one class only: left out of GAUC
    labels[:5] = 1
    assert auc(scores, labels) == pytest.approx(pair_auc(scores.tolist(), labels.tolist()),
                                                abs=1e-12)
    g, users = gauc(scores, labels, groups)
    assert g == pytest.approx(loop_gauc(scores.tolist(), labels.tolist(), groups.tolist()),
                              abs=1e-12)
    both = [u for u in set(groups.tolist())
            if 0 < labels[groups == u].sum() < (groups == u).sum()]
    assert users == len(both) and 99 not in both


def test_auc_equals_torchrec_without_ties():
    from torchrec.metrics.auc import compute_auc

    rng = np.random.default_rng(3)
    labels = (rng.random((2, 500)) < np.array([[0.2], [0.6]])).astype(np.float32)
    scores = rng.random((2, 500)) + 0.5 * labels
    want = compute_auc(2, [torch.tensor(scores)], [torch.tensor(labels)],
                       [torch.ones(2, 500, dtype=torch.float64)])
    for t in range(2):
        assert auc(scores[t], labels[t]) == pytest.approx(float(want[t]), abs=1e-9)


def test_gauc_equals_torchrec_on_equal_size_groups():
    from torchrec.metrics.gauc import compute_gauc_3d

    rng = np.random.default_rng(4)
    groups, size = 40, 12
    labels = (rng.random((1, groups, size)) < 0.4).astype(np.float32)
    scores = rng.random((1, groups, size)) + 0.4 * labels
    out = compute_gauc_3d(torch.tensor(scores), torch.tensor(labels),
                          torch.ones(1, groups, size, dtype=torch.float64))
    want = float(out["auc_sum"][0] / out["num_samples"][0])
    g, users = gauc(scores.ravel(), labels.ravel(), np.repeat(np.arange(groups), size))
    assert users == int(out["num_samples"][0])
    assert g == pytest.approx(want, abs=1e-9)


def test_ne_equals_torchrec_and_logloss_the_formula():
    from torchrec.metrics.ne import compute_cross_entropy, compute_ne

    rng = np.random.default_rng(5)
    labels = (rng.random(400) < 0.25).astype(np.float64)
    scores = np.clip(rng.random(400) * 0.6 + 0.3 * labels, 0.0, 1.0)
    scores[0] = 0.0  # clamped, not -inf
    lt, st = torch.tensor(labels), torch.tensor(scores)
    ce = compute_cross_entropy(lt, st, torch.ones_like(lt), 1e-12).sum()
    pos = lt.sum()
    want = compute_ne(ce, torch.tensor(400.0), pos, 400.0 - pos, 1e-12)
    assert normalized_entropy(scores, labels) == pytest.approx(float(want), rel=1e-9)
    p = np.clip(scores, 1e-12, 1 - 1e-12)
    formula = -np.mean([y * math.log(q) + (1 - y) * math.log(1 - q) for y, q in zip(labels, p)])
    assert log_loss(scores, labels) == pytest.approx(formula, rel=1e-12)


def test_one_class_is_none_with_a_reason():
    m = ranking_metrics(np.array([0.1, 0.9, 0.5]), np.zeros(3), np.array([1, 1, 2]))
    assert m["auc"] is None and m["gauc"] is None and m["ne"] is None
    assert "no positive" in m["reason"] and m["positive_rate"] == 0.0 and m["count"] == 3
    m = ranking_metrics(np.array([0.1, 0.9, 0.5, 0.4]), np.array([1.0, 0.0, 1.0, 0.0]),
                        np.array([1, 2, 3, 4]))  # every user one impression: no GAUC
    assert m["auc"] == pytest.approx(0.25) and m["gauc"] is None and "GAUC" in m["reason"]
    assert ranking_metrics(np.zeros(0), np.zeros(0), np.zeros(0))["reason"].startswith(
        "no impressions")


def test_regression_metrics_equal_float64_loops_on_the_known_rows():
    from torchrec_ascend.metrics import regression_metrics

    rng = np.random.default_rng(7)
    t = rng.normal(2.0, 1.0, 300)
    p = t + rng.normal(0.0, 0.5, 300)
    t[rng.choice(300, 17, replace=False)] = np.nan
    got = regression_metrics(p, t)
    pairs = [(float(a), float(b)) for a, b in zip(p, t) if not math.isnan(b)]
    n = len(pairs)
    mean = sum(b for _, b in pairs) / n
    sse = sum((a - b) ** 2 for a, b in pairs)
    assert got["count"] == n == 283 and got["missing"] == 17
    assert got["rmse"] == pytest.approx(math.sqrt(sse / n), rel=1e-12)
    assert got["mae"] == pytest.approx(sum(abs(a - b) for a, b in pairs) / n, rel=1e-12)
    assert got["r2"] == pytest.approx(1 - sse / sum((b - mean) ** 2 for _, b in pairs), rel=1e-12)
    none = regression_metrics(p[:3], np.full(3, np.nan))
    assert none["rmse"] is None and none["count"] == 0 and "no known target" in none["reason"]
    flat = regression_metrics(np.zeros(4), np.ones(4))
    assert flat["r2"] is None and flat["rmse"] == 1.0 and "R^2 is undefined" in flat["reason"]
