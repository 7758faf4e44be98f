"""Item statistics against a direct loop over earlier impressions."""

import math

import numpy as np
import pytest

from torchrec_ascend.training.ranking.item_stats import STATS_COUNT_SCALE, item_statistics


def _loop(items, times, labels, prior, s):
    out = np.zeros((len(items), 1 + labels.shape[1]))
    for e in range(len(items)):
        earlier = [j for j in range(len(items)) if items[j] == items[e] and times[j] < times[e]]
        n = len(earlier)
        out[e, 0] = math.log1p(n) / STATS_COUNT_SCALE
        for k in range(labels.shape[1]):
            pos = sum(labels[j, k] for j in earlier)
            r = (pos + s * prior[k]) / (n + s)
            out[e, 1 + k] = math.log(r / (1 - r)) - math.log(prior[k] / (1 - prior[k]))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_item_statistics_match_loop(seed):
    rng = np.random.default_rng(seed)
    e = 300
    items = rng.integers(0, 12, e)
    times = rng.integers(0, 60, e)  # many ties: same item at the same time must not count
    labels = (rng.random((e, 3)) < [0.4, 0.05, 0.7]).astype(np.float32)
    prior = np.array([0.4, 0.05, 0.7])
    got = item_statistics(items, times, labels, prior, 5.0)
    np.testing.assert_allclose(got, _loop(items, times, labels, prior, 5.0), atol=1e-5)


def test_first_impression_is_neutral_and_own_label_unseen():
    items = np.array([3, 3, 3, 7])
    times = np.array([10, 10, 20, 5])
    labels = np.array([[1.0], [1.0], [0.0], [1.0]])
    got = item_statistics(items, times, labels, np.array([0.5]), 2.0)
    assert np.all(got[[0, 1, 3]] == 0)  # nothing strictly earlier: count 0, rate = prior
    # the third sees the two earlier positives: (2 + 2 * 0.5) / (2 + 2) = 0.75
    assert got[2, 0] == pytest.approx(math.log1p(2) / STATS_COUNT_SCALE)
    assert got[2, 1] == pytest.approx(math.log(3.0), rel=1e-6)


def test_empty():
    z = np.zeros(0, dtype=np.int64)
    assert item_statistics(z, z, np.zeros((0, 2)), np.array([0.5, 0.5]), 1.0).shape == (0, 3)
