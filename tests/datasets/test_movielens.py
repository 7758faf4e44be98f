"""MovieLens ratings.dat -> CSV: against a plain-Python oracle (str.split, sorted()), bad lines, and
the real ML-1M file where one is present (``$MOVIELENS_1M_DIR``, else skipped)."""

from __future__ import annotations

import csv
import os

import numpy as np
import pytest

from torchrec_ascend.datasets import (
    RATINGS_COLUMNS,
    DataError,
    EventLog,
    TableSpec,
    convert_ratings,
    load_table_sequences,
    preprocess_table,
)

ML1M_DIR = os.environ.get("MOVIELENS_1M_DIR", "")
ML1M = os.path.join(ML1M_DIR, "ratings.dat") if ML1M_DIR else ""


def write_dat(path, rng, users=40, items=60, per_user=(3, 30), half_stars=False):
    """Random ratings in the ML-1M layout (users in blocks, times unordered within a user)."""
    lines = []
    for u in rng.permutation(np.arange(1, users + 1)):
        for _ in range(int(rng.integers(*per_user))):
            r = rng.integers(1, 11) / 2 if half_stars else int(rng.integers(1, 6))
            lines.append(f"{u}::{int(rng.integers(1, items + 1))}::{r}::"
                         f"{int(rng.integers(9.5e8, 9.6e8))}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return lines


def oracle_sequences(lines, min_len=3):
    """{user: [(movie, time_ms)]} in time order (ties: file order), users with >= min_len."""
    ev = {}
    for k, line in enumerate(lines):
        u, m, _, t = line.split("::")
        ev.setdefault(int(u), []).append((int(t) * 1000, k, int(m)))
    return {u: [(m, t) for t, _, m in sorted(e)] for u, e in ev.items() if len(e) >= min_len}


@pytest.mark.parametrize("half_stars", [False, True])
def test_csv_rows_and_sequences_match_oracle(tmp_path, half_stars):
    rng = np.random.default_rng(16)
    src, dst = tmp_path / "ratings.dat", tmp_path / "ratings.csv"
    lines = write_dat(src, rng, half_stars=half_stars)
    assert convert_ratings(str(src), str(dst)) == len(lines)
    with open(dst, newline="") as f:
        rows = list(csv.reader(f))
    assert tuple(rows[0]) == RATINGS_COLUMNS
    assert [r for r in rows[1:]] == [line.split("::") for line in lines]

    spec = TableSpec(files=[str(dst)])  # the table reader's default column names
    seqs = load_table_sequences(spec, str(tmp_path / "cache"), min_len=3)
    log = EventLog.load(preprocess_table(spec, str(tmp_path / "cache")))
    raw_items = np.asarray(log.item_ids)
    got = {}
    for k in range(seqs.num_users):
        s, e = seqs.offsets[k], seqs.offsets[k + 1]
        got[int(seqs.user_ids[k])] = [(int(raw_items[v]), int(t))
                                      for v, t in zip(seqs.items[s:e], seqs.times[s:e])]
    assert got == oracle_sequences(lines)
    assert seqs.num_items == len({int(x.split("::")[1]) for x in lines})


@pytest.mark.parametrize("line,where,problem", [
    ("1::2::3", "row 2 (file line 2): ", "expected 4 '::'-separated fields"),
    ("1:2::3::4", "row 2 (file line 2): ", "expected 4 '::'-separated fields"),
    ("1::x::3::978300760", "row 2 (file line 2), column 'MovieID': ", "'x' is not a non-negative"),
    ("-1::2::3::978300760", "row 2 (file line 2), column 'UserID': ", "'-1' is not a non-negative"),
    ("1::2::3.5.1::978300760", "row 2 (file line 2), column 'Rating': ",
     "'3.5.1' is not a non-negative number"),
    ("1::2::3::", "row 2 (file line 2), column 'Timestamp': ", "'' is not a non-negative"),
    ("", "row 2 (file line 2): ", "expected 4 '::'-separated fields"),
])
def test_bad_line_names_file_line_and_column_and_leaves_no_output(tmp_path, line, where,
                                                                   problem):
    src, dst = tmp_path / "ratings.dat", tmp_path / "ratings.csv"
    src.write_text("1::1193::5::978300760\n" + line + "\n3::4::5::978300761\n")
    with pytest.raises(DataError) as e:
        convert_ratings(str(src), str(dst))
    assert str(e.value).startswith(f"{src}: {where}{problem}"), str(e.value)
    assert os.listdir(tmp_path) == ["ratings.dat"]


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        convert_ratings(str(tmp_path / "nope.dat"), str(tmp_path / "o.csv"))
    (tmp_path / "empty.dat").write_text("")
    with pytest.raises(DataError, match="empty file"):
        convert_ratings(str(tmp_path / "empty.dat"), str(tmp_path / "o.csv"))
    assert sorted(os.listdir(tmp_path)) == ["empty.dat"]


def test_crlf_line_endings(tmp_path):
    src, dst = tmp_path / "ratings.dat", tmp_path / "ratings.csv"
    src.write_bytes(b"1::10::4::978300760\r\n1::11::5::978300761\r\n")
    assert convert_ratings(str(src), str(dst)) == 2
    assert dst.read_text() == "user_id,item_id,rating,timestamp\n1::10::4::978300760\n" \
        .replace("::", ",") + "1,11,5,978300761\n"


@pytest.mark.skipif(not (ML1M and os.path.isfile(ML1M)),
                    reason="no MovieLens ratings.dat in $MOVIELENS_1M_DIR (GroupLens' ml-1m.zip; "
                           "not redistributable)")
def test_real_ratings_dat_converts_every_line(tmp_path):
    dst = tmp_path / "ratings.csv"
    rows = convert_ratings(ML1M, str(dst))
    with open(ML1M, encoding="latin-1") as f:
        n = sum(1 for _ in f)
    assert rows == n
    seqs = load_table_sequences(TableSpec(files=[str(dst)]), str(tmp_path / "cache"), min_len=3)
    # every MovieLens user has >= 20 ratings: nobody is dropped, every rating is an event
    assert int(seqs.lengths.sum()) == n
    assert seqs.lengths.min() >= 20
    assert np.all(np.diff(seqs.times[seqs.offsets[0]:seqs.offsets[1]]) >= 0)
