"""Data sources from a config: the table source equals the datasets reader, bad table
settings are ConfigErrors, the synthetic source is generated once."""

from __future__ import annotations

import numpy as np
import pytest

from torchrec_ascend.datasets import TableSpec, generate_events_table, load_table_sequences
from torchrec_ascend.training.config import ConfigError, DataConfig
from torchrec_ascend.training.sources import check_source, load_sequences


def test_table_source_equals_reader(tmp_path):
    path = generate_events_table(str(tmp_path / "e.csv"), 50, 60, seed=1)
    got = load_sequences(DataConfig(files=[path], cache_dir=str(tmp_path / "c")))
    want = load_table_sequences(TableSpec(files=[path]), str(tmp_path / "c2"), 3)
    for k in ("items", "times", "offsets", "actions"):
        assert np.array_equal(getattr(got, k), getattr(want, k)), k
    assert got.num_items == want.num_items


def test_bad_table_settings_are_config_errors():
    with pytest.raises(ConfigError, match=r"^data: column\(s\) \['a'\] named twice"):
        check_source(DataConfig(files=["x.csv"], user_col="a", item_col="a"))
    with pytest.raises(ConfigError, match="^data.time_unit: 'h' is not one of"):
        check_source(DataConfig(files=["x.csv"], time_unit="h"))
    with pytest.raises(ConfigError, match="^data.positive: "):
        check_source(DataConfig(source="kuairand", files=["x.csv"], positive={"any_of": ["zap"]}))


def test_synthetic_source_is_generated_once(tmp_path):
    d = DataConfig(source="synthetic", cache_dir=str(tmp_path),
                   synthetic={"num_users": 30, "num_items": 40, "num_clusters": 4, "mean_len": 8,
                              "max_len": 20, "seed": 2})
    a = load_sequences(d)
    folder = [p for p in tmp_path.iterdir() if p.name.startswith("synthetic-")]
    assert len(folder) == 1
    mtime = max(f.stat().st_mtime_ns for f in folder[0].iterdir())
    b = load_sequences(d)
    assert max(f.stat().st_mtime_ns for f in folder[0].iterdir()) == mtime
    assert np.array_equal(a.items, b.items) and a.num_users > 0
