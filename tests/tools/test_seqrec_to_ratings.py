"""tools/seqrec_to_ratings.py: the three public layouts against hand-made oracles, its errors,
and (when the fetched files are at ``$SEQREC_RAW_DIR``, skipped otherwise) the published counts of
the real files."""

from __future__ import annotations

import importlib
import os

import pytest

RAW = os.environ.get("SEQREC_RAW_DIR", "/work/data/seqrec/raw")


def _tool():
    return importlib.import_module("tools.seqrec_to_ratings")


def _file(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_pairs_positions_as_time_and_dense_ids(tmp_path):
    t = _tool()
    # users 7 and 3 interleaved; user 9 has 2 events (dropped at min_len 3); ids not dense
    path = _file(tmp_path, "v.txt", "7 50\n3 20\n7 10\n7 50\n3 40\n3 20\n9 10\n9 60\n")
    rows = t.normalise(t.read_pairs(path), min_len=3)
    # users 3 -> 1, 7 -> 2; items {10, 20, 40, 50} -> 1..4 (60 only in the dropped user)
    assert rows == [(1, 2, 0), (1, 3, 1), (1, 2, 2),
                    (2, 4, 0), (2, 1, 1), (2, 4, 2)]


def test_lines_with_times_ties_broken_in_file_order(tmp_path):
    t = _tool()
    items = _file(tmp_path, "i.txt", "1 5 6 7 8\n2 6 5 6\n")
    times = _file(tmp_path, "t.txt", "2 100 100 50\n1 86400 86400 86400 172800\n")
    rows = t.normalise(t.read_lines(items, times), min_len=3)
    # user 1: three events on one day -> +0, +1, +2 s; user 2: 100, 100 -> 101, 50 -> 102
    assert rows == [(1, 1, 86400), (1, 2, 86401), (1, 3, 86402), (1, 4, 172800),
                    (2, 2, 100), (2, 1, 101), (2, 2, 102)]


def test_udata_sorted_by_time_ties_in_file_order(tmp_path):
    t = _tool()
    # tab / space separated, users interleaved, user 5's events out of time order with a tie
    path = _file(tmp_path, "u.data", "5\t30\t4\t900\n2 10 3 50\n5 10 1  100\n2\t20\t5\t40\n"
                                     "5 20 2 100\n2 30 1 60\n")
    rows = t.normalise(t.read_udata(path), min_len=3)
    # user 2 -> 1: 20@40, 10@50, 30@60; user 5 -> 2: 10@100, 20@100 (file order) -> 101, 30@900
    assert rows == [(1, 2, 40), (1, 1, 50), (1, 3, 60), (2, 1, 100), (2, 2, 101), (2, 3, 900)]


def test_strictly_increasing_is_the_least_change():
    t = _tool()
    assert t.strictly_increasing([]) == []
    assert t.strictly_increasing([5]) == [5]
    assert t.strictly_increasing([3, 3, 3, 10, 4, 11]) == [3, 4, 5, 10, 11, 12]


def test_outputs_hold_the_same_events(tmp_path):
    t = _tool()
    rows = [(1, 2, 0), (1, 1, 1), (1, 2, 2), (2, 3, 5), (2, 1, 6), (2, 2, 9)]
    csv, dat = str(tmp_path / "a.csv"), str(tmp_path / "a.dat")
    t.write_outputs(rows, csv, dat)
    body = open(csv).read().splitlines()
    assert body[0] == "user_id,item_id,timestamp"
    assert [tuple(int(x) for x in r.split(",")) for r in body[1:]] == rows
    assert [tuple(int(x) for x in r.split("::")) for r in open(dat).read().splitlines()] == \
        [(u, i, 1, s) for u, i, s in rows]
    assert t.summary(rows) == {"users": 2, "items": 3, "events": 6, "events_per_user": 3.0,
                               "median_events_per_user": 3.0}


@pytest.mark.parametrize("fmt,text,times,message", [
    ("pairs", "1 2 3\n", None, "v.txt:1: expected 'user item', got 3 fields"),
    ("pairs", "1 2\n1 x\n", None, "v.txt:2: user and item must be integers"),
    ("lines", "1 2 3\n1 4 5\n", None, "v.txt:2: user 1 on a second line"),
    ("lines", "1\n", None, "v.txt:1: a user with no item"),
    ("lines", "1 2 3 4\n", "1 5 6\n", "t.txt:1: user 1 has 2 times and 3 items"),
    ("lines", "1 2 3 4\n", "2 5 6 7\n", "t.txt:1: user 2 is not in"),
    ("lines", "1 2 3 4\n2 3 4 5\n", "1 5 6 7\n", "no times for 1 users"),
    ("pairs", "1 2\n1 3\n", None, "no user has 3 or more events"),
    ("udata", "1 2 3\n", None, "v.txt:1: expected 'user item rating time', got 3 fields"),
])
def test_bad_input_one_line_exit_2_no_output(tmp_path, capsys, fmt, text, times, message):
    t = _tool()
    path = _file(tmp_path, "v.txt", text)
    argv = [fmt, path, "--csv", str(tmp_path / "o.csv"), "--ratings", str(tmp_path / "o.dat")]
    if times is not None:
        argv += ["--times", _file(tmp_path, "t.txt", times)]
    assert t.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not os.path.exists(tmp_path / "o.csv") and not os.path.exists(tmp_path / "o.dat")


# the counts the files' publishers give (S3Rec's README table; TiCoSeRec's README for Yelp-B)
PUBLISHED = [
    ("lines", "s3rec_Sports_and_Outdoors.txt", None, (35598, 18357, 296337)),
    ("lines", "s3rec_Toys_and_Games.txt", None, (19412, 11924, 167597)),
    ("lines", "s3rec_Yelp.txt", None, (30431, 20033, 316354)),
    ("lines", "s3rec_LastFM.txt", None, (1090, 3646, 52551)),
    ("lines", "ticoserec_Sports_Sports_item.txt", "ticoserec_Sports_Sports_time.txt",
     (35598, 18357, 296337)),
    ("lines", "ticoserec_Yelp-B_Yelp_item.txt", "ticoserec_Yelp-B_Yelp_time.txt",
     (None, None, 207045)),
    ("udata", "ml-100k_u.data", None, (943, 1682, 100000)),  # GroupLens' README
]


@pytest.mark.parametrize("fmt,name,times,counts", PUBLISHED)
def test_real_files_match_published_counts(fmt, name, times, counts):
    path = os.path.join(RAW, name)
    if not os.path.isfile(path):
        pytest.skip(f"{path} not present (docs/datasets_public.md: how to fetch it)")
    t = _tool()
    seqs = (t.read_udata(path) if fmt == "udata"
            else t.read_lines(path, os.path.join(RAW, times) if times else None))
    rows = t.normalise(seqs, min_len=3)
    s = t.summary(rows)
    for got, want in zip((s["users"], s["items"], s["events"]), counts):
        if want is not None:
            assert got == want
    last = {}
    for u, _, ts in rows:  # strictly increasing times within each user
        assert ts > last.get(u, -1)
        last[u] = ts
