"""The KuaiRand-format generator: O(1)-per-draw categorical sampling identical to numpy's
``choice``, deterministic files, byte-identical to the earlier generator, optional item file."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from torchrec_ascend.datasets.synthetic import Categorical, SyntheticConfig, generate

# sha256 of the files the earlier generator (O(items) CDF per draw) wrote for SMALL
SMALL = SyntheticConfig(num_users=200, num_items=5000, num_clusters=9, seed=7)
EARLIER_SHA256 = {
    "log_random": "aefe77c89e3547be8f350bcb52acc15a46dea4975aef4daf1eeeab04f45bff6b",
    "log_standard": "5c6ab4d9450de5dc6f64a2960a6666aa9c5df52827b1a83fc7efb8a5ae4560bd",
    "user_features": "cb1a3e3ee7ee8f16061cb5fd63d04e1a31ff9d4efc1994f4454061a12b334ff1",
    "video_features": "37eb4d84b444ea57043c9a5e6876d82c8a00d10c074b2fda808024c5cffbe009",
}


def _sha(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.mark.parametrize("size", [None, 1, 17, 1000])
def test_categorical_draws_equal_numpy_choice(size):
    p = np.random.default_rng(3).pareto(1.0, 777) + 1e-3
    p /= p.sum()
    draw = Categorical(p)
    a, b = np.random.default_rng(11), np.random.default_rng(11)
    for _ in range(5):
        mine, theirs = draw(a, size), b.choice(len(p), size, p=p)
        if size is None:
            assert isinstance(mine, int) and mine == int(theirs)
        else:
            np.testing.assert_array_equal(mine, theirs)
    assert a.random() == b.random()  # the same random numbers were consumed


def test_files_are_byte_identical_to_the_earlier_generator(tmp_path):
    paths = generate(str(tmp_path / "a"), SMALL)
    assert {k: _sha(p) for k, p in paths.items()} == EARLIER_SHA256


def test_deterministic_and_seed_sensitive_without_item_file(tmp_path):
    cfg = SyntheticConfig(num_users=60, num_items=2000, num_clusters=5, seed=1, item_features=False)
    a = generate(str(tmp_path / "a"), cfg)
    b = generate(str(tmp_path / "b"), cfg)
    assert set(a) == {"log_standard", "log_random", "user_features"}
    assert not os.path.exists(os.path.join(tmp_path, "a", "video_features_basic_synthetic.csv"))
    assert all(_sha(a[k]) == _sha(b[k]) for k in a)
    full = generate(str(tmp_path / "c"), SyntheticConfig(**{**cfg.__dict__, "item_features": True}))
    assert all(_sha(a[k]) == _sha(full[k]) for k in a)  # the item file is drawn last
    other = generate(str(tmp_path / "d"), SyntheticConfig(**{**cfg.__dict__, "seed": 2}))
    assert _sha(other["log_standard"]) != _sha(a["log_standard"])
