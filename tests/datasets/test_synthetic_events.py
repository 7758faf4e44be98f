"""The generic events-table generator: deterministic, CSV == Parquet, and sequential (a
first-order transition count beats most-popular on the leave-one-out split)."""

from __future__ import annotations

import numpy as np
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from torchrec_ascend.datasets import TableSpec, generate_events_table, load_table_sequences


def hit_rates(seqs, k=10):
    """HR@k of most-popular and of a transition count (next-item counts from the last history
    item, popularity breaking ties) on the leave-one-out split; history items filtered."""
    n = seqs.num_items
    pop = np.zeros(n)
    trans = {}
    users = []
    for u in range(seqs.num_users):
        s = seqs.items[seqs.offsets[u]:seqs.offsets[u + 1]].tolist()
        hist, target = s[:-1], s[-1]
        users.append((hist, target))
        for a, b in zip(hist, hist[1:]):
            trans.setdefault(a, np.zeros(n))[b] += 1
        for v in hist:
            pop[v] += 1
    hits = {"popular": 0, "transition": 0}
    for hist, target in users:
        for name, base in (("popular", pop),
                           ("transition", trans.get(hist[-1], np.zeros(n)) * 1e6 + pop)):
            score = base.copy()
            score[hist] = -np.inf
            score[target] = base[target]  # the target stays a candidate
            hits[name] += int(target in np.argsort(-score, kind="stable")[:k])
    return {m: h / len(users) for m, h in hits.items()}


def test_deterministic_and_csv_equals_parquet(tmp_path):
    a = generate_events_table(str(tmp_path / "a.csv"), 200, 400, seed=3)
    b = generate_events_table(str(tmp_path / "b.csv"), 200, 400, seed=3)
    c = generate_events_table(str(tmp_path / "c.csv"), 200, 400, seed=4)
    assert open(a, "rb").read() == open(b, "rb").read() != open(c, "rb").read()
    p = generate_events_table(str(tmp_path / "a.parquet"), 200, 400, seed=3, format="parquet")
    assert pcsv.read_csv(a).equals(pq.read_table(p))
    t = pcsv.read_csv(a)
    assert t.column_names == ["user_id", "item_id", "timestamp"]
    ts = t.column("timestamp").to_numpy()
    assert np.all(np.diff(ts) >= 0)  # global time order, users interleaved
    u = t.column("user_id").to_numpy()
    assert len(np.unique(u)) == 200 and (u[1:] != u[:-1]).mean() > 0.5
    for uid in np.unique(u)[:20]:
        assert np.all(np.diff(ts[u == uid]) > 0)  # strictly increasing per user
    with pytest.raises(ValueError, match="format"):
        generate_events_table(str(tmp_path / "x.json"), 5, 5, 0, format="json")
    with pytest.raises(ValueError, match="num_users"):
        generate_events_table(str(tmp_path / "x.csv"), 0, 5, 0)


def test_text_ids_and_clicks(tmp_path):
    p = generate_events_table(str(tmp_path / "s.csv"), 50, 80, seed=1, string_ids=True,
                              clicks=True)
    t = pcsv.read_csv(p)
    assert t.column_names == ["user_id", "item_id", "timestamp", "click"]
    assert all(s.startswith("U") and len(s) == 8 for s in t.column("user_id").to_pylist())
    assert all(s.startswith("I") and len(s) == 9 for s in t.column("item_id").to_pylist())
    clicks = t.column("click").to_numpy()
    assert set(np.unique(clicks)) == {0, 1} and 0.2 < 1 - clicks.mean() < 0.4


def test_sequential_structure_beats_most_popular(tmp_path):
    p = generate_events_table(str(tmp_path / "e.csv"), 300, 600, seed=0)
    seqs = load_table_sequences(TableSpec([p]), str(tmp_path / "c"), min_len=3)
    hr = hit_rates(seqs)
    assert hr["transition"] > 2 * hr["popular"], hr
