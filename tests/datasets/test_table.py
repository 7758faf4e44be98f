"""The generic table reader against a plain-Python oracle (csv module, sorted(), dicts)."""

from __future__ import annotations

import csv
import os

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from torchrec_ascend.datasets import (
    DataError,
    EventLog,
    PositiveRule,
    Sequences,
    TableSpec,
    generate_events_table,
    load_table_sequences,
    preprocess_table,
)


# -- oracle ------------------------------------------------------------------------------------
def oracle(path, user="user_id", item="item_id", time="timestamp", unit="s", actions=(),
           any_of=None, none_of=(), min_len=3, text_ids=False, delimiter=","):
    """{user: [(item, time_ms, action byte)]} of positives, users with >= min_len, in time order
    (ties: file order); ids as text if ``text_ids``."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter=delimiter))
    conv = (lambda s: s) if text_ids else int
    events = {}
    for k, r in enumerate(rows):
        t = r[time].strip()
        ms = int(t) * (1000 if unit == "s" else 1) if t.lstrip("-").isdigit() else \
            int(np.rint(float(t) * (1000.0 if unit == "s" else 1.0)))
        a = sum(int(r[c]) << i for i, c in enumerate(actions))
        events.setdefault(conv(r[user]), []).append((ms, k, conv(r[item]), a))
    bits = {c: 1 << i for i, c in enumerate(actions)}
    out = {}
    for u, ev in events.items():
        ev.sort(key=lambda e: (e[0], e[1]))
        seen = set()  # an exact duplicate (user, item, time) keeps its first row only
        ev = [e for e in ev if not ((e[0], e[2]) in seen or seen.add((e[0], e[2])))]
        keep = [(v, t, a) for t, _, v, a in ev
                if any_of is None or (any(a & bits[c] for c in any_of)
                                      and not any(a & bits[c] for c in none_of))]
        if len(keep) >= min_len:
            out[u] = keep
    all_items = sorted({conv(r[item]) for r in rows})
    return out, all_items


def as_dict(seqs: Sequences, log: EventLog):
    """Sequences -> {user: [(raw item, time, action)]} through the cached id tables."""
    items = seqs.item_vocab.to_pylist() if seqs.item_vocab is not None else \
        np.asarray(log.item_ids).tolist()
    users = seqs.user_vocab.to_pylist() if seqs.user_vocab is not None else None
    out = {}
    for k in range(seqs.num_users):
        s, e = seqs.offsets[k], seqs.offsets[k + 1]
        u = users[seqs.user_ids[k]] if users is not None else int(seqs.user_ids[k])
        out[u] = [(items[v], int(t), int(a)) for v, t, a in
                  zip(seqs.items[s:e], seqs.times[s:e], seqs.actions[s:e])]
    return out, items


def load(spec, cache, **kw):
    seqs = load_table_sequences(spec, str(cache), **kw)
    return seqs, EventLog.load(preprocess_table(spec, str(cache)))


def to_parquet(csv_path, pq_path, **read_kw):
    pq.write_table(pcsv.read_csv(csv_path, **read_kw), pq_path, row_group_size=97)
    return str(pq_path)


# -- tests -------------------------------------------------------------------------------------
@pytest.mark.parametrize("string_ids,clicks", [(False, False), (True, True)])
def test_matches_oracle_csv_tsv_parquet(tmp_path, string_ids, clicks):
    path = generate_events_table(str(tmp_path / "ev.csv"), 120, 300, seed=4,
                                 string_ids=string_ids, clicks=clicks)
    acts = ("click",) if clicks else ()
    positive = {"any_of": ["click"]} if clicks else None
    want = oracle(path, actions=acts, any_of=positive and positive["any_of"], text_ids=string_ids)
    tsv = tmp_path / "ev.tsv"
    tsv.write_text(open(path).read().replace(",", "\t"))
    pqt = to_parquet(path, tmp_path / "ev.parquet")
    results = []
    for p in (path, str(tsv), pqt):
        spec = TableSpec([p], action_cols=acts, positive=positive)
        seqs, log = load(spec, tmp_path / "cache", block_size=4096, batch_rows=50)
        assert as_dict(seqs, log) == want, p
        assert seqs.num_items == len(want[1]) and seqs.action_names == acts
        results.append(seqs)
    for other in results[1:]:  # CSV, TSV and Parquet: identical arrays
        for f in ("items", "times", "actions", "offsets", "user_ids"):
            assert np.array_equal(getattr(results[0], f), getattr(other, f)), f
        if string_ids:
            assert other.item_vocab.equals(results[0].item_vocab)
            assert other.user_vocab.equals(results[0].user_vocab)
    assert results[0].items.dtype == np.int64 and results[0].times.dtype == np.int64
    assert results[0].actions.dtype == np.uint8


def test_column_mapping_separator_and_actions(tmp_path):
    rows = ["uid;iid;ts;buy;view"]
    rng = np.random.default_rng(0)
    for k in range(200):
        u, i = int(rng.integers(0, 9)), int(rng.integers(0, 40))
        buy, view = int(rng.random() < 0.3), int(rng.random() < 0.8)
        rows.append(f"{u};{i};{1000 + k * 7};{buy};{view}")
    p = tmp_path / "events.txt.csv"
    p.write_text("\n".join(rows) + "\n")
    spec = TableSpec(str(p), user_col="uid", item_col="iid", time_col="ts", time_unit="ms",
                     sep=";", action_cols=["buy", "view"],
                     positive={"any_of": ["view"], "none_of": ["buy"]})
    seqs, log = load(spec, tmp_path / "c", min_len=2)
    want = oracle(str(p), "uid", "iid", "ts", "ms", ("buy", "view"), ["view"], ["buy"], 2,
                  delimiter=";")
    assert as_dict(seqs, log) == want
    assert seqs.action_names == ("buy", "view")
    rule = PositiveRule(("buy",), action_names=("buy", "view"))
    seqs2, _ = load(TableSpec(str(p), user_col="uid", item_col="iid", time_col="ts", sep=";",
                              time_unit="ms", action_cols=["buy", "view"], positive=rule),
                    tmp_path / "c", min_len=2)
    assert as_dict(seqs2, log)[0] == oracle(str(p), "uid", "iid", "ts", "ms", ("buy", "view"),
                                            ["buy"], (), 2, delimiter=";")[0]


def test_time_units_and_parquet_temporal_types(tmp_path):
    secs = np.array([1600000000, 1600000001, 1600000003, 1600000007], dtype=np.int64)
    base = {"user_id": [1, 1, 1, 1], "item_id": [5, 6, 7, 8]}
    results = {}
    for name, col, unit in [
        ("s", pa.array(secs), "s"),
        ("ms", pa.array(secs * 1000), "ms"),
        ("float_s", pa.array(secs.astype(np.float64)), "s"),
        ("ts_s", pa.array(secs, pa.timestamp("s")), "s"),
        ("ts_ms", pa.array(secs * 1000, pa.timestamp("ms", tz="UTC")), "s"),
        ("ts_us", pa.array(secs * 10 ** 6, pa.timestamp("us")), "ms"),
        ("ts_ns", pa.array(secs * 10 ** 9, pa.timestamp("ns")), "s"),
    ]:
        p = str(tmp_path / f"{name}.parquet")
        pq.write_table(pa.table({**base, "timestamp": col}), p)
        seqs, _ = load(TableSpec([p], time_unit=unit), tmp_path / "c")
        results[name] = seqs.times.tolist()
    assert all(v == (secs * 1000).tolist() for v in results.values()), results
    p = tmp_path / "dec.csv"  # decimal seconds: rounded to the nearest millisecond
    p.write_text("user_id,item_id,timestamp\n1,5,1600000000.0004\n1,6,1600000000.0006\n"
                 "1,7,1.6000000015e9\n1,8,1600000002\n")
    seqs, _ = load(TableSpec([str(p)]), tmp_path / "c")
    assert seqs.times.tolist() == [1600000000000, 1600000000001, 1600000001500, 1600000002000]
    d = tmp_path / "date.parquet"
    pq.write_table(pa.table({**base, "timestamp": pa.array([0, 1, 2, 3], pa.date32())}), d)
    seqs, _ = load(TableSpec([str(d)]), tmp_path / "c")
    assert seqs.times.tolist() == [0, 86400000, 172800000, 259200000]


def test_timestamp_ties_keep_file_order(tmp_path):
    p = tmp_path / "ties.csv"
    p.write_text("user_id,item_id,timestamp\n7,30,5\n7,10,5\n8,1,1\n7,20,5\n7,5,4\n8,2,1\n8,3,1\n")
    seqs, log = load(TableSpec([str(p)]), tmp_path / "c")
    got, _ = as_dict(seqs, log)
    assert [v for v, _, _ in got[7]] == [5, 30, 10, 20]
    assert [v for v, _, _ in got[8]] == [1, 2, 3]


def test_exact_duplicates_dropped_repeats_kept(tmp_path):
    """A row repeating an earlier (user, item, timestamp) is dropped (the first row kept, with
    its action bits) and counted, in text-id tables too; the same item at another time is a
    repeat consumption and stays."""
    p = tmp_path / "dup.csv"
    p.write_text("user_id,item_id,timestamp,click\nu1,a,5,1\nu1,b,6,0\nu1,a,5,0\nu1,a,9,1\n"
                 "u2,a,5,1\nu1,b,6,1\nu1,c,7,0\nu2,b,8,0\n")
    spec = TableSpec([str(p)], action_cols=["click"])
    seqs, log = load(spec, tmp_path / "c", min_len=2)
    got, _ = as_dict(seqs, log)
    assert got == {"u1": [("a", 5000, 1), ("b", 6000, 0), ("c", 7000, 0), ("a", 9000, 1)],
                   "u2": [("a", 5000, 1), ("b", 8000, 0)]}
    assert log.meta["rows"] == 8 and log.meta["duplicates_dropped"] == 2
    assert seqs.duplicates_dropped == 2
    want, _ = oracle(str(p), actions=("click",), min_len=2, text_ids=True)
    assert got == want


def test_text_ids_auto_and_explicit(tmp_path):
    p = tmp_path / "asin.csv"
    p.write_text("user_id,item_id,timestamp\nA1,0001234567,1\nA1,B00ZZ,2\nA1,1234567,3\n"
                 "B2,B00ZZ,1\nB2,0001234567,2\nB2,B00AA,3\n")
    seqs, log = load(TableSpec([str(p)]), tmp_path / "c")
    got, items = as_dict(seqs, log)
    assert items == ["0001234567", "1234567", "B00AA", "B00ZZ"]  # leading zero: text ids
    assert got == {"A1": [("0001234567", 1000, 0), ("B00ZZ", 2000, 0), ("1234567", 3000, 0)],
                   "B2": [("B00ZZ", 1000, 0), ("0001234567", 2000, 0), ("B00AA", 3000, 0)]}
    ints = tmp_path / "ints.csv"
    ints.write_text("user_id,item_id,timestamp\n1,10,1\n1,9,2\n1,100,3\n")
    seqs, log = load(TableSpec([str(ints)], id_type="str"), tmp_path / "c")
    assert seqs.item_vocab.to_pylist() == ["10", "100", "9"]  # byte-wise sorted text
    assert as_dict(seqs, log)[0] == {"1": [("10", 1000, 0), ("9", 2000, 0), ("100", 3000, 0)]}
    with pytest.raises(DataError) as e:
        load(TableSpec([str(p)], id_type="int"), tmp_path / "c")
    assert (e.value.row, e.value.line, e.value.column) == (1, 2, "user_id")
    late = tmp_path / "late.csv"
    late.write_text("user_id,item_id,timestamp\n1,10,1\n1,11,2\n1,B0X,3\n")
    with pytest.raises(DataError) as e:
        load(TableSpec([str(late)]), tmp_path / "c")
    assert (e.value.row, e.value.column) == (3, "item_id")
    assert "id_type='str'" in str(e.value)
    empty_id = tmp_path / "empty_id.csv"
    empty_id.write_text("user_id,item_id,timestamp\nA,x,1\nA,,2\n")
    with pytest.raises(DataError, match=r"row 2 \(file line 3\), column 'item_id': empty value"):
        load(TableSpec([str(empty_id)]), tmp_path / "c")


def test_missing_column_names_it_and_lists_present(tmp_path):
    p = tmp_path / "e.csv"
    p.write_text("user,item_id,timestamp\n1,2,3\n")
    with pytest.raises(DataError) as e:
        preprocess_table(TableSpec([str(p)]), str(tmp_path / "c"))
    assert e.value.column == "user_id" and "user, item_id, timestamp" in str(e.value)
    q = tmp_path / "e.parquet"
    pq.write_table(pa.table({"user_id": [1], "item": [2], "timestamp": [3]}), q)
    with pytest.raises(DataError, match=r"header, column 'item_id': missing column; the file's "
                                        r"columns are: user_id, item, timestamp"):
        preprocess_table(TableSpec([str(q)]), str(tmp_path / "c"))
    with pytest.raises(DataError, match="missing column"):
        preprocess_table(TableSpec([str(p)], user_col="user", action_cols=["click"]),
                         str(tmp_path / "c"))


@pytest.mark.parametrize("field,value,match", [
    ("files", [], "TableSpec.files"),
    ("files", [3], "TableSpec.files"),
    ("user_col", "", "TableSpec.user_col"),
    ("time_col", None, "TableSpec.time_col"),
    ("time_unit", "us", "TableSpec.time_unit"),
    ("sep", ",,", "TableSpec.sep"),
    ("sep", '"', "TableSpec.sep"),
    ("format", "json", "TableSpec.format"),
    ("id_type", "float", "TableSpec.id_type"),
    ("action_cols", "click", "TableSpec.action_cols"),
    ("action_cols", [f"a{i}" for i in range(9)], "at most 8"),
    ("action_cols", ["user_id"], "named twice"),
    ("item_col", "user_id", "named twice"),
    ("positive", {"any_of": ["click"]}, "a positive rule needs TableSpec.action_cols"),
])
def test_spec_validation(field, value, match):
    kw = {"files": ["x.csv"], field: value}
    with pytest.raises(ValueError, match=match):
        TableSpec(**kw)


def test_spec_validation_rules_and_formats(tmp_path):
    with pytest.raises(ValueError, match="TableSpec.positive.*unknown"):
        TableSpec(["x.csv"], action_cols=["click"], positive={"any_of": ["buy"]})
    with pytest.raises(ValueError, match="TableSpec.positive.*needs 'any_of'"):
        TableSpec(["x.csv"], action_cols=["click"], positive={"none_of": ["click"]})
    with pytest.raises(ValueError, match="TableSpec.sep: Parquet"):
        TableSpec(["x.parquet"], format="parquet", sep=",")
    with pytest.raises(ValueError, match="min_len"):
        load_table_sequences(TableSpec(["x.csv"]), str(tmp_path), min_len=1)
    odd = tmp_path / "events.dat"
    odd.write_text("user_id,item_id,timestamp\n1,2,3\n")
    with pytest.raises(DataError, match=r"events.dat: cannot tell the format.*'\.dat'"):
        preprocess_table(TableSpec([str(odd)]), str(tmp_path / "c"))
    assert preprocess_table(TableSpec([str(odd)], format="csv"), str(tmp_path / "c"))
    with pytest.raises(DataError, match="no file matches"):
        preprocess_table(TableSpec([str(tmp_path / "none_*.csv")]), str(tmp_path / "c"))
    notpq = tmp_path / "fake.parquet"
    notpq.write_text("user_id,item_id,timestamp\n")
    with pytest.raises(DataError, match="fake.parquet: not a readable Parquet file"):
        preprocess_table(TableSpec([str(notpq)]), str(tmp_path / "c"))


def test_cache_reuse_options_and_globs(tmp_path):
    a = generate_events_table(str(tmp_path / "part-0.csv"), 30, 60, seed=1)
    b = generate_events_table(str(tmp_path / "part-1.parquet"), 30, 60, seed=2,
                              format="parquet")
    spec = TableSpec([str(tmp_path / "part-*.csv"), str(tmp_path / "part-*.parquet")])
    c1 = preprocess_table(spec, str(tmp_path / "c"))
    mtime = os.path.getmtime(os.path.join(c1, "meta.json"))
    assert preprocess_table(spec, str(tmp_path / "c")) == c1
    assert os.path.getmtime(os.path.join(c1, "meta.json")) == mtime
    c2 = preprocess_table(TableSpec(spec.files, time_unit="ms"), str(tmp_path / "c"))
    assert c2 != c1
    log = EventLog.load(c1)
    assert log.meta["files"] == [os.path.abspath(a), os.path.abspath(b)]
    n_rows = sum(1 for _ in open(a)) - 1 + pq.ParquetFile(b).metadata.num_rows
    assert log.meta["rows"] == n_rows and log.meta["id_types"] == {"user": "int", "item": "int"}
    assert not [d for d in os.listdir(tmp_path / "c") if d.startswith(".tmp")]
