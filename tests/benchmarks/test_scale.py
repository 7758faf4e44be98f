"""The pieces of benchmarks/scale.py at tiny sizes: the 27K-shaped generator, the table-size
arithmetic, the memory guard, the RSS readers and one tiny end-to-end run."""

import json
import os
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks import scale  # noqa: E402
from torchrec_ascend.datasets.schema import ACTION_BITS  # noqa: E402


def test_sequences_shape_order_and_determinism():
    a = scale.synthetic_27k_sequences(60, 2000, mean_len=12.0, max_len=40, seed=3)
    b = scale.synthetic_27k_sequences(60, 2000, mean_len=12.0, max_len=40, seed=3)
    lens = np.diff(a.offsets)
    assert a.num_users == 60 and a.num_items == 2000
    assert a.offsets[0] == 0 and a.offsets[-1] == len(a.items) == len(a.times) == len(a.actions)
    assert lens.min() >= 4 and lens.max() <= 40
    assert a.items.min() >= 0 and a.items.max() < 2000
    for u in range(60):  # strictly increasing times within every user
        t = a.times[a.offsets[u]:a.offsets[u + 1]]
        assert (np.diff(t) > 0).all()
    assert (a.actions & ACTION_BITS["click"]).all()  # positives are clicks
    like = (a.actions & ACTION_BITS["like"]) > 0
    assert 0.05 < like.mean() < 0.3  # drawn at 15%
    for f in ("items", "times", "actions", "offsets"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    c = scale.synthetic_27k_sequences(60, 2000, mean_len=12.0, max_len=40, seed=4)
    assert not np.array_equal(a.items[:50], c.items[:50])


def test_sequences_popularity_is_heavy_tailed():
    s = scale.synthetic_27k_sequences(400, 5000, mean_len=20.0, max_len=100, seed=0)
    counts = np.sort(np.bincount(s.items, minlength=5000))[::-1]
    # uniform draws would give the top 1% of items ~1% of the events; Zipf(1.1) far more
    assert counts[:50].sum() / counts.sum() > 0.1


def test_sequences_bad_max_len():
    with pytest.raises(ValueError, match="max_len"):
        scale.synthetic_27k_sequences(5, 100, mean_len=5.0, max_len=3)


def test_table_bytes_27k():
    b = scale.table_bytes(32_038_725, 64)
    assert b["weights_fp32"] == 8_201_913_600  # 32,038,725 x 64 x 4
    assert b["rowwise_adagrad_state"] == 128_154_900
    assert b["weights_fp16"] == 4_100_956_800
    with pytest.raises(ValueError, match="dim"):
        scale.table_bytes(10, 0)


def test_check_fits():
    need = scale.table_bytes(32_038_725, 64)
    scale.check_fits(need, 20 << 30, margin=1 << 30)  # 8.3 GB + 1 GiB fits in 20 GiB
    with pytest.raises(MemoryError, match=r"fp16 storage would need [0-9.]+ GiB \(fits\)"):
        scale.check_fits(need, 8 << 30, margin=1 << 30)
    with pytest.raises(MemoryError, match="does not fit"):
        scale.check_fits(need, 2 << 30, margin=1 << 30)


def test_rss_readers_see_an_allocation():
    before = scale.rss_bytes()
    x = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB, touched
    after = scale.rss_bytes()
    assert after - before > 48 << 20
    assert scale.peak_rss_mb() * 2**20 >= after - (4 << 20)
    del x


def test_build_config_is_27k_with_timed_pipeline():
    cfg, raw = scale.build_config(7)
    with open(scale.CONFIG) as f:
        ref = json.load(f)
    assert raw["model"] == ref["model"]
    assert cfg.train.pipeline == "semi_async" and cfg.train.staleness == 0
    assert cfg.train.steps == 7 and cfg.train.batch_size == ref["train"]["batch_size"]
    assert cfg.model.max_seq_len == 1024 and cfg.model.num_layers == 8


def test_tiny_run_end_to_end(monkeypatch):
    monkeypatch.setitem(scale.MODES, "quick", (3000, 80, 10.0, 1, 2))
    res = scale.run("quick", threads=1)
    assert res["steps"] == 2 and res["num_items"] == 3000
    assert res["table_bytes"]["weights_fp32"] == 3000 * 64 * 4
    assert res["tokens_per_s"] > 0 and res["step_ms"] > 0
    assert res["lookup_update_ms"] > 0 and res["dense_ms"] > 0
    assert res["lookup_update_ms"] + res["dense_ms"] == pytest.approx(res["step_ms"])
    assert res["peak_rss_gib"] >= res["phases"]["build"]["rss_gib"] - 0.01
    assert np.isfinite(res["loss_last"])


def test_doc_section_is_the_committed_results():
    """docs/kuairand.md's scale table is benchmarks/results/scale*.json's (scale.py --doc)."""
    results = scale.load_results()
    assert results, "benchmarks/results/scale_quick.json is missing"
    assert scale.documented() == scale.markdown(results).strip()


def test_markdown_needs_a_result():
    with pytest.raises(ValueError, match="no scale result"):
        scale.markdown({})
