"""Table files: parsed and checked, built into a meta-device module whose TorchRec configs hold
exactly the file's tables, constraints carrying the pooling factors."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torchrec")

import torchrec_ascend  # noqa: E402,F401
from torchrec import EmbeddingBagCollection, EmbeddingCollection  # noqa: E402

from torchrec_ascend.distributed.planner import tables as T  # noqa: E402

DOC = {"batch_size": 64, "tables": [
    {"name": "item", "rows": 1000, "dim": 16, "pooling": 50, "pooled": False},
    {"name": "tags", "rows": 30, "dim": 8, "pooling": [3, 5], "features": 2},
    {"name": "user", "rows": 100, "dim": 8, "sharding_types": ["table_wise"]},
    {"name": "side", "rows": 10, "dim": 32, "pooled": False, "features": ["s_a"]},
]}


def test_parse_build_constrain(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(DOC))
    rows, batch = T.load_tables(str(path))
    assert batch == 64 and [r.name for r in rows] == ["item", "tags", "user", "side"]
    assert rows[1].features == ("tags_0", "tags_1") and rows[1].pooling == (3.0, 5.0)
    assert rows[0].pooling == (50.0,) and not rows[0].pooled
    m = T.build_module(rows)
    assert isinstance(m.ebc, EmbeddingBagCollection)
    assert [(c.name, c.num_embeddings, c.embedding_dim, c.feature_names)
            for c in m.ebc.embedding_bag_configs()] == [
        ("tags", 30, 8, ["tags_0", "tags_1"]), ("user", 100, 8, ["user"])]
    # sequence tables of two dimensions: one EmbeddingCollection each
    assert isinstance(m.ec_16, EmbeddingCollection) and isinstance(m.ec_32, EmbeddingCollection)
    assert [c.name for c in m.ec_32.embedding_configs()] == ["side"]
    assert next(m.parameters()).device.type == "meta"
    c = T.table_constraints(rows)
    assert c["tags"].pooling_factors == [3.0, 5.0] and c["user"].sharding_types == ["table_wise"]
    assert c["item"].sharding_types is None


@pytest.mark.parametrize("bad,match", [
    ({"tables": []}, "non-empty"),
    ({"tables": [{"name": "a", "rows": 0, "dim": 4}]}, "rows"),
    ({"tables": [{"name": "a", "rows": 3}]}, "dim"),
    ({"tables": [{"name": "a", "rows": 3, "dim": 4, "colour": 1}]}, "unknown keys"),
    ({"tables": [{"name": "a", "rows": 3, "dim": 4, "pooling": [1, 2]}]}, "pooling"),
    ({"tables": [{"name": "a", "rows": 3, "dim": 4, "pooled": "yes"}]}, "pooled"),
    ({"tables": [{"name": "a", "rows": 3, "dim": 4}] * 2}, "twice"),
    ({"tables": [{"name": "a", "rows": 3, "dim": 4}], "batch_size": 0}, "batch_size"),
    ({"tables": [{"name": "a", "rows": 3, "dim": 4}], "hosts": 2}, "unknown keys"),
])
def test_bad_table_files(bad, match):
    with pytest.raises(ValueError, match=match):
        T.parse_tables(bad)
