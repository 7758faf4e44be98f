"""KuaiRand reader, preprocessing cache and generator, against a plain-Python oracle (csv module)."""

from __future__ import annotations

import csv
import os

import numpy as np
import pytest

from torchrec_ascend.datasets import (
    ACTION_BITS,
    EventLog,
    KuaiRandDataError,
    PositiveRule,
    SyntheticConfig,
    detect_format,
    generate,
    load_kuairand,
    preprocess,
    read_user_features,
    read_video_features,
)
from torchrec_ascend.datasets.schema import ACTION_COLUMNS, LOG_COLUMNS, SAMPLE_LOG_COLUMNS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE_DIR = os.environ.get("KUAIRAND_SAMPLE_DIR",
                            os.path.join(REPO, "..", "shared", "data", "kuairand-27k-sample"))
SAMPLE_FILE = os.path.join(SAMPLE_DIR, "processed_standard_kcore_15.tsv")

SMALL = SyntheticConfig(num_users=60, num_items=150, num_clusters=6, mean_len=12, max_len=80,
                        random_log_rows=50, seed=3)


@pytest.fixture(scope="module")
def small_files(tmp_path_factory):
    return generate(str(tmp_path_factory.mktemp("syn")), SMALL)


def oracle_events(path):
    """(user, time, file order) sorted events with the action byte, by the csv module."""
    delim = "\t" if "\t" in open(path).readline() else ","
    rows = list(csv.DictReader(open(path, newline=""), delimiter=delim))
    out = []
    for i, r in enumerate(rows):
        a = 0
        for name, bit in ACTION_BITS.items():
            col = ACTION_COLUMNS[name]
            if col in r:
                a |= bit * int(r[col])
        if "label" in r and "is_like" not in r:
            a |= ACTION_BITS["like"] if int(r["label"]) == 1 else ACTION_BITS["hate"]
        out.append((int(r["user_id"]), int(r["time_ms"]), i, int(r["video_id"]), a))
    out.sort()
    return out


def first_of_duplicates(events):
    """The events without the later rows of each (user, time, item): the reader's policy."""
    seen, out = set(), []
    for e in events:
        key = (e[0], e[1], e[3])
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def check_cache_against_oracle(cache_dir, paths):
    ev = EventLog.load(cache_dir)
    want = []
    for p in paths:
        want += oracle_events(p)
    want.sort(key=lambda e: (e[0], e[1]))  # stable: file order within (user, time) ties
    want = first_of_duplicates(want)
    by_user = {}
    for u, t, _, v, a in want:
        by_user.setdefault(u, []).append((v, t, a))
    assert ev.num_users == len(by_user)
    assert sorted(ev.user_ids.tolist()) == sorted(by_user)
    item_ids = np.asarray(ev.item_ids)
    assert item_ids.tolist() == sorted({e[3] for e in want})
    for k, u in enumerate(ev.user_ids):
        s, e = ev.user_offsets[k], ev.user_offsets[k + 1]
        got = list(zip(item_ids[ev.items[s:e]].tolist(), ev.times[s:e].tolist(),
                       ev.actions[s:e].tolist()))
        assert got == by_user[int(u)], f"user {u}"


@pytest.mark.parametrize("block_size,num_buckets", [(1 << 20, 4), (4096, 7), (4096, 1)])
def test_preprocess_matches_oracle(small_files, tmp_path, block_size, num_buckets):
    path = small_files["log_standard"]
    cache = preprocess([path], str(tmp_path), num_buckets=num_buckets, block_size=block_size)
    check_cache_against_oracle(cache, [path])
    assert not [d for d in os.listdir(tmp_path) if d.startswith(".tmp")]  # no leftovers


def test_two_files_and_cache_reuse(small_files, tmp_path):
    paths = [small_files["log_standard"], small_files["log_random"]]
    c1 = preprocess(paths, str(tmp_path), block_size=8192)
    check_cache_against_oracle(c1, paths)
    mtime = os.path.getmtime(os.path.join(c1, "meta.json"))
    assert preprocess(paths, str(tmp_path)) == c1  # cache hit: not rebuilt
    assert os.path.getmtime(os.path.join(c1, "meta.json")) == mtime


def test_positive_sequences_rule(small_files, tmp_path):
    path = small_files["log_standard"]
    rule = PositiveRule(any_of=("click",), none_of=("hate",))
    seqs = load_kuairand([path], str(tmp_path), rule, min_len=3)
    want = {}
    for u, t, _, v, a in first_of_duplicates(oracle_events(path)):
        if a & 1 and not a & 32:
            want.setdefault(u, []).append(v)
    want = {u: s for u, s in want.items() if len(s) >= 3}
    ev = EventLog.load(preprocess([path], str(tmp_path)))
    got = {}
    for k, u in enumerate(seqs.user_ids):
        got[int(u)] = np.asarray(ev.item_ids)[seqs.items[seqs.offsets[k]:seqs.offsets[k + 1]]].tolist()
    assert got == want


def test_generator_deterministic_heavy_tailed(tmp_path):
    a = generate(str(tmp_path / "a"), SMALL)
    b = generate(str(tmp_path / "b"), SMALL)
    for k in a:
        assert open(a[k], "rb").read() == open(b[k], "rb").read(), k
    assert open(a["log_standard"]).readline().strip().split(",") == list(LOG_COLUMNS)
    ev = EventLog.load(preprocess([a["log_standard"]], str(tmp_path / "c")))
    lens = np.diff(ev.user_offsets)
    assert lens.max() > 3 * np.median(lens)  # heavy tail
    counts = np.bincount(ev.items, minlength=ev.num_items)
    top = np.sort(counts)[::-1]
    assert top[: len(top) // 10].sum() > 0.3 * counts.sum()  # popular head


def test_feature_files(small_files):
    uf = read_user_features(small_files["user_features"])
    assert len(uf.ids) == SMALL.num_users and "user_active_degree" in uf.columns
    assert uf.columns["user_active_degree"].dtype.kind in "iu"  # string column -> codes
    vf = read_video_features(small_files["video_features"])
    assert len(vf.ids) == SMALL.num_items and "video_duration" in vf.columns


# -- the shared sample's format -----------------------------------------------------------------
def write_sample_like(path, rows):
    with open(path, "w") as f:
        f.write("\t".join(SAMPLE_LOG_COLUMNS) + "\n")
        for r in rows:
            d = dict.fromkeys(SAMPLE_LOG_COLUMNS, "0")
            d.update(r)
            f.write("\t".join(str(d[c]) for c in SAMPLE_LOG_COLUMNS) + "\n")


def test_sample_variant_label(tmp_path):
    p = str(tmp_path / "s.tsv")
    write_sample_like(p, [
        {"user_id": 5, "video_id": 9, "time_ms": 30, "label": 0, "is_click": 1},
        {"user_id": 5, "video_id": 7, "time_ms": 10, "label": 1, "timestamp": "2022-04-08 01:00:00"},
        {"user_id": 2, "video_id": 7, "time_ms": 20, "label": 1, "long_view": 1},
    ])
    assert detect_format(p).kind == "sample"
    ev = EventLog.load(preprocess([p], str(tmp_path / "c")))
    check_cache_against_oracle(preprocess([p], str(tmp_path / "c")), [p])
    acts = {(int(ev.user_ids[k]), int(ev.item_ids[ev.items[i]])): int(ev.actions[i])
            for k in range(ev.num_users) for i in range(ev.user_offsets[k], ev.user_offsets[k + 1])}
    assert acts == {(5, 9): 32 | 1, (5, 7): 2, (2, 7): 2 | 64}


@pytest.mark.skipif(not os.path.isfile(SAMPLE_FILE), reason="shared KuaiRand sample not present")
def test_real_sample(tmp_path):
    seqs = load_kuairand([SAMPLE_FILE], str(tmp_path), PositiveRule(any_of=("like",)), min_len=2)
    ev = EventLog.load(preprocess([SAMPLE_FILE], str(tmp_path)))
    # numbers from the sample's README (41,828 rows, 33,745 of them likes); 124 rows repeat an
    # earlier (user, video, time_ms) with the same label (counted by pandas' duplicated()):
    # 38 of them likes
    assert ev.meta["rows"] == 41828 and ev.num_users == 664 and ev.num_items == 9359
    assert ev.meta["duplicates_dropped"] == 124 and len(ev.items) == 41828 - 124
    assert int(PositiveRule(any_of=("like",))(np.asarray(ev.actions)).sum()) == 33745 - 38
    assert seqs.num_users == 664 and len(seqs.items) == 33745 - 38
    # within a user, time never decreases
    t = np.asarray(ev.times)
    same_user = np.repeat(np.arange(ev.num_users), np.diff(ev.user_offsets))
    assert np.all((np.diff(t) >= 0) | (np.diff(same_user) != 0))


def test_exact_duplicates_dropped_repeats_kept(tmp_path):
    """Rows that repeat an earlier (user, video, time_ms) are dropped, the first in file order
    kept (its action bits too) and counted; the same video at another time is kept."""
    rows = [",".join(LOG_COLUMNS)]
    for user, video, t, click in [(1, 10, 1000, 1), (1, 11, 2000, 0), (1, 10, 1000, 0),
                                  (1, 10, 3000, 1), (2, 10, 1000, 1), (1, 11, 2000, 1)]:
        rows.append(",".join(str(v) for v in [user, video, 20220408, 900, t, click] + [0] * 13))
    path = tmp_path / "log_standard_dup.csv"
    _write(path, rows)
    ev = EventLog.load(preprocess([str(path)], str(tmp_path / "c")))
    assert ev.meta["rows"] == 6 and ev.meta["duplicates_dropped"] == 2
    ids = np.asarray(ev.item_ids)
    got = {int(u): list(zip(ids[ev.items[s:e]].tolist(), ev.times[s:e].tolist(),
                            ev.actions[s:e].tolist()))
           for u, s, e in zip(ev.user_ids, ev.user_offsets[:-1], ev.user_offsets[1:])}
    assert got == {1: [(10, 1000, 1), (11, 2000, 0), (10, 3000, 1)], 2: [(10, 1000, 1)]}
    seqs = EventLog.load(preprocess([str(path)], str(tmp_path / "c"))).positive_sequences(
        None, min_len=2)
    assert seqs.duplicates_dropped == 2


# -- bad data ------------------------------------------------------------------------------------
def _official_rows(n=5):
    return [",".join(LOG_COLUMNS)] + [
        ",".join(str(v) for v in [1, 10 + i, 20220408, 900, 1000 + i] + [0] * 14) for i in range(n)]


def _write(path, lines):
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return str(path)


def test_missing_column(tmp_path):
    lines = _official_rows()
    hdr = lines[0].split(",")
    i = hdr.index("video_id")
    lines = [",".join(c for j, c in enumerate(l.split(",")) if j != i) for l in lines]
    p = _write(tmp_path / "log_standard_x.csv", lines)
    with pytest.raises(KuaiRandDataError) as e:
        preprocess([p], str(tmp_path / "c"))
    assert p in str(e.value) and "header" in str(e.value) and "'video_id'" in str(e.value)
    assert not os.listdir(tmp_path / "c") if os.path.isdir(tmp_path / "c") else True


@pytest.mark.parametrize("bad,col", [("abc", "video_id"), ("", "user_id"), ("1.5e3x", "time_ms")])
def test_non_numeric_id_names_row_and_column(tmp_path, bad, col):
    lines = _official_rows(3000)  # several blocks with the small block size below
    cells = lines[2001].split(",")
    cells[LOG_COLUMNS.index(col)] = bad
    lines[2001] = ",".join(cells)
    p = _write(tmp_path / "log.csv", lines)
    with pytest.raises(KuaiRandDataError) as e:
        preprocess([p], str(tmp_path / "c"), block_size=4096)
    assert e.value.path == p and e.value.row == 2001 and e.value.column == col
    assert "row 2001 (file line 2002)" in str(e.value) and repr(col) in str(e.value)


def test_action_not_binary(tmp_path):
    lines = _official_rows()
    cells = lines[3].split(",")
    cells[LOG_COLUMNS.index("is_like")] = "2"
    lines[3] = ",".join(cells)
    p = _write(tmp_path / "log.csv", lines)
    with pytest.raises(KuaiRandDataError, match=r"row 3 .*'is_like'.*value '2'"):
        preprocess([p], str(tmp_path / "c"))


def test_empty_and_unreadable(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(KuaiRandDataError, match="empty.csv.*empty"):
        preprocess([str(empty)], str(tmp_path / "c"))
    header_only = _write(tmp_path / "h.csv", _official_rows(0))
    with pytest.raises(KuaiRandDataError, match="no data rows"):
        preprocess([header_only], str(tmp_path / "c"))
    with pytest.raises(KuaiRandDataError, match="nope.csv.*does not exist"):
        preprocess([str(tmp_path / "nope.csv")], str(tmp_path / "c"))
    with pytest.raises(KuaiRandDataError, match="no file matches"):
        preprocess([str(tmp_path / "log_*_none.csv")], str(tmp_path / "c"))
    with pytest.raises(KuaiRandDataError, match="directory"):
        detect_format(str(tmp_path))
    if os.geteuid() != 0:
        locked = _write(tmp_path / "locked.csv", _official_rows())
        os.chmod(locked, 0)
        with pytest.raises(KuaiRandDataError, match="locked.csv.*cannot be read"):
            preprocess([locked], str(tmp_path / "c"))


def test_positive_rule_validation():
    with pytest.raises(ValueError, match="unknown"):
        PositiveRule(any_of=("clik",))
    with pytest.raises(ValueError, match="any_of"):
        PositiveRule(any_of=())
    r = PositiveRule.from_config({"any_of": ["like", "follow"], "none_of": ["hate"]})
    a = np.array([0, 2, 4, 2 | 32, 1, 6], dtype=np.uint8)
    assert r(a).tolist() == [False, True, True, False, False, True]
