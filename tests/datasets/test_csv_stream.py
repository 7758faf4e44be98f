"""Bad data in delimited files: one parametrised body for the KuaiRand reader and the generic
table reader.  Every case must raise DataError naming the file, the data row, the file line and
the column, whatever the line ends (LF / CRLF), the quoting (plain / every field quoted, with a
line break and a delimiter inside a value and a blank line before the bad row) and the block
size (a tiny one puts the bad row in a later piece).  The expected file line comes from an
independent oracle: Python's csv module."""

from __future__ import annotations

import csv
import gzip
import os
import pickle

import numpy as np
import pyarrow.csv as pcsv
import pytest

from torchrec_ascend.datasets import (
    DataError,
    EventLog,
    KuaiRandDataError,
    TableSpec,
    preprocess,
    preprocess_table,
)
from torchrec_ascend.datasets.csv_stream import CsvReader, iter_csv, read_header
from torchrec_ascend.datasets.schema import ACTION_COLUMNS, LOG_COLUMNS

N_ROWS = 50
BAD = 37  # the data row each case breaks
COL = {c: i for i, c in enumerate(LOG_COLUMNS)}


def base_rows():
    """Cells of a valid KuaiRand official log (as text)."""
    rows = []
    for i in range(N_ROWS):
        r = ["0"] * len(LOG_COLUMNS)
        r[COL["user_id"]] = str(1 + i % 4)
        r[COL["video_id"]] = str(100 + i)
        r[COL["date"]], r[COL["hourmin"]] = "20220408", "900"
        r[COL["time_ms"]] = str(1649347200000 + 1000 * i)
        r[COL["is_click"]] = str(i % 2)
        r[COL["tab"]] = str(i % 5)
        rows.append(r)
    return rows


def write_log(path, rows, eol="\n", quoted=False, trailing_eol=True):
    """Write ``rows`` (lists of str or bytes cells); the quoted layout quotes every str field,
    puts a line break and a comma into row 3's unused ``tab`` value and a blank line after row
    10.  Bytes cells are written verbatim (unquoted)."""
    def cell(v):
        if isinstance(v, bytes):
            return v
        return ('"' + v.replace('"', '""') + '"').encode() if quoted else v.encode()

    lines = [b",".join(cell(c) for c in LOG_COLUMNS)]
    for k, r in enumerate(rows, start=1):
        r = list(r)
        if quoted and k == 3:
            r[COL["tab"]] = "two\nlines, one comma"
        lines.append(b",".join(cell(c) for c in r))
        if quoted and k == 10:
            lines.append(b"")
    data = eol.encode().join(lines) + (eol.encode() if trailing_eol else b"")
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def oracle_location(path, data_row):
    """(file line) of data row ``data_row`` by the csv module (blank lines are not rows)."""
    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as f:
        reader = csv.reader(f)
        next(reader)
        prev, row = reader.line_num, 0
        for rec in reader:
            start, prev = prev + 1, reader.line_num
            if not rec:
                continue
            row += 1
            if row == data_row:
                return start
    raise AssertionError(f"no data row {data_row}")


def _set(col, value):
    def f(rows):
        rows[BAD - 1][COL[col]] = value
        return rows
    return f


def _extra(rows):
    rows[BAD - 1].append("7")
    return rows


def _fewer(rows):
    rows[BAD - 1].pop()
    return rows


def _truncate_last(rows):
    del rows[-1][5:]
    return rows


# case -> (mutation, expected row, expected column, a substring of the problem, trailing eol)
CASES = {
    "too_many_fields": (_extra, BAD, None, "20 fields, but the header has 19 columns", True),
    "too_few_fields": (_fewer, BAD, "tab", "18 fields", True),
    "truncated_last_line": (_truncate_last, N_ROWS, "is_click", "truncated", False),
    "decimal_id": (_set("video_id", "12.5"), BAD, "video_id", "'12.5'", True),
    "exponent_id": (_set("video_id", "1e3"), BAD, "video_id", "'1e3'", True),
    "hex_id": (_set("user_id", "0x10"), BAD, "user_id", "'0x10'", True),
    "id_beyond_int64": (_set("user_id", "9223372036854775808"), BAD, "user_id", "int64 range", True),
    "empty_id": (_set("user_id", ""), BAD, "user_id", "empty value", True),
    "text_time": (_set("time_ms", "noon"), BAD, "time_ms", "'noon'", True),
    "time_beyond_int64": (_set("time_ms", "-99999999999999999999"), BAD, "time_ms", "int64", True),
    "action_2": (_set("is_click", "2"), BAD, "is_click", "'2', expected 0 or 1", True),
    "action_text": (_set("is_like", "yes"), BAD, "is_like", "'yes', expected 0 or 1", True),
    "bad_utf8": (_set("video_id", b"1\xff2"), BAD, "video_id", "not valid UTF-8", True),
    "stray_quote": (_set("tab", b'a"b'), BAD, "tab", "inside an unquoted field", True),
    "text_after_quote": (_set("tab", b'"a"b'), BAD, "tab", "after the closing quote", True),
}
LAYOUTS = {  # eol, quoted, block size: each dimension against the others
    "lf-plain-big": ("\n", False, 1 << 20),
    "crlf-plain-tiny": ("\r\n", False, 97),
    "lf-quoted-tiny": ("\n", True, 97),
    "crlf-quoted-big": ("\r\n", True, 1 << 20),
}
KUAIRAND_ACTIONS = tuple(ACTION_COLUMNS.values())


def read_kuairand(path, cache, block_size):
    return preprocess([path], str(cache), block_size=block_size, num_buckets=3)


def read_table(path, cache, block_size):
    spec = TableSpec([path], user_col="user_id", item_col="video_id", time_col="time_ms",
                     time_unit="ms", action_cols=KUAIRAND_ACTIONS)
    return preprocess_table(spec, str(cache), block_size=block_size, num_buckets=3)


READERS = {"kuairand": read_kuairand, "table": read_table}


def check_error(e: DataError, path, row, line, column, problem):
    msg = str(e)
    assert isinstance(e, DataError) and isinstance(e, ValueError)
    assert (e.path, e.row, e.line, e.column) == (path, row, line, column), msg
    assert problem in e.problem, msg
    assert "\n" not in msg and msg.startswith(f"{path}: row {row} (file line {line})")
    if column is not None:
        assert f"column {column!r}" in msg


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("reader", sorted(READERS))
def test_bad_data_named(tmp_path, reader, case, layout):
    mutate, row, column, problem, trailing = CASES[case]
    eol, quoted, block = LAYOUTS[layout]
    path = write_log(tmp_path / "log_standard_x.csv", mutate(base_rows()), eol, quoted, trailing)
    with pytest.raises(DataError) as e:
        READERS[reader](path, tmp_path / "cache", block)
    check_error(e.value, path, row, oracle_location(path, row), column, problem)
    cache = tmp_path / "cache"
    assert not cache.exists() or not os.listdir(cache)  # nothing half-written is left


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("reader", sorted(READERS))
def test_good_data_every_layout(tmp_path, reader, layout):
    """The same layouts without a bad cell read to the csv module's values; an integral
    decimal id (3892024.0) reads as the integer (documented decision)."""
    eol, quoted, block = LAYOUTS[layout]
    rows = base_rows()
    rows[4][COL["video_id"]] = "3892024.0"
    rows[5][COL["user_id"]] = " 3 "
    path = write_log(tmp_path / "log.csv", rows, eol, quoted)
    ev = EventLog.load(READERS[reader](path, tmp_path / "cache", block))
    want = {}
    for r in rows:
        u, v, t = int(r[COL["user_id"]]), int(float(r[COL["video_id"]])), int(r[COL["time_ms"]])
        want.setdefault(u, []).append((v, t, int(r[COL["is_click"]])))
    got = {}
    for k, u in enumerate(ev.user_ids):
        s, e = ev.user_offsets[k], ev.user_offsets[k + 1]
        got[int(u)] = list(zip(np.asarray(ev.item_ids)[ev.items[s:e]].tolist(),
                               ev.times[s:e].tolist(), (ev.actions[s:e] & 1).tolist()))
    assert got == {u: sorted(x, key=lambda y: y[1]) for u, x in want.items()}
    assert 3892024 in np.asarray(ev.item_ids).tolist()


@pytest.mark.parametrize("reader", sorted(READERS))
def test_file_level_errors(tmp_path, reader):
    read = READERS[reader]
    empty = tmp_path / "empty.csv"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match=r"empty\.csv: file is empty") as e:
        read(str(empty), tmp_path / "c", 1 << 20)
    assert e.value.row == 0 and e.value.line is None
    header_only = write_log(tmp_path / "h.csv", [])
    with pytest.raises(DataError, match="no data rows"):
        read(header_only, tmp_path / "c", 1 << 20)
    lines = open(write_log(tmp_path / "x.csv", base_rows())).read().splitlines()
    drop = LOG_COLUMNS.index("video_id")
    cut = [",".join(c for j, c in enumerate(l.split(",")) if j != drop) for l in lines]
    missing = tmp_path / "m.csv"
    missing.write_text("\n".join(cut) + "\n")
    with pytest.raises(DataError) as e:
        read(str(missing), tmp_path / "c", 1 << 20)
    msg = str(e.value)
    assert e.value.column == "video_id" and "header, column 'video_id'" in msg
    assert "user_id, date, hourmin" in msg  # the columns present are listed
    bad_header = tmp_path / "bh.csv"
    bad_header.write_bytes(b"user_id,vid\xffeo_id\n1,2\n")
    with pytest.raises(DataError, match="header.*not valid UTF-8"):
        read(str(bad_header), tmp_path / "c", 1 << 20)
    with pytest.raises(DataError, match="nope.csv: file does not exist"):
        read(str(tmp_path / "nope.csv"), tmp_path / "c", 1 << 20)


@pytest.mark.parametrize("cell,problem", [(b'"never closed', "never closed"),
                                          (b"1\r2", "carriage return")])
@pytest.mark.parametrize("reader", sorted(READERS))
def test_unclosed_quote_and_bare_cr(tmp_path, reader, cell, problem):
    rows = base_rows()
    rows[BAD - 1][COL["tab"]] = cell
    path = write_log(tmp_path / "q.csv", rows)
    with pytest.raises(DataError) as e:
        READERS[reader](path, tmp_path / "c", 97)
    check_error(e.value, path, BAD, BAD + 1, "tab", problem)


def test_negative_ids_kuairand_only(tmp_path):
    rows = base_rows()
    rows[BAD - 1][COL["video_id"]] = "-5"
    path = write_log(tmp_path / "n.csv", rows)
    with pytest.raises(DataError) as e:
        read_kuairand(path, tmp_path / "c", 1 << 20)
    check_error(e.value, path, BAD, BAD + 1, "video_id", "non-negative")
    ev = EventLog.load(read_table(path, tmp_path / "c", 1 << 20))  # a generic id may be negative
    assert -5 in np.asarray(ev.item_ids).tolist()


def test_unused_columns_are_not_checked(tmp_path):
    rows = base_rows()
    rows[BAD - 1][COL["play_time_ms"]] = "not a number"
    path = write_log(tmp_path / "u.csv", rows)
    assert EventLog.load(read_kuairand(path, tmp_path / "c", 1 << 20)).meta["rows"] == N_ROWS


def test_first_error_in_file_order(tmp_path):
    """Two problems in one piece: the earlier row is reported, also when the later one is
    structural (a pyarrow parse error) and the earlier one a value."""
    rows = base_rows()
    rows[9][COL["is_click"]] = "5"
    rows[BAD - 1].append("9")
    path = write_log(tmp_path / "two.csv", rows)
    with pytest.raises(DataError) as e:
        read_kuairand(path, tmp_path / "c", 1 << 20)
    check_error(e.value, path, 10, 11, "is_click", "'5'")
    rows = base_rows()
    rows[9][COL["user_id"]] = "4"
    rows[9][COL["time_ms"]] = "x"
    rows[9][COL["video_id"]] = "y"  # two bad cells in one row: the leftmost column
    path = write_log(tmp_path / "two2.csv", rows)
    with pytest.raises(DataError) as e:
        read_kuairand(path, tmp_path / "c", 1 << 20)
    assert (e.value.row, e.value.column) == (10, "video_id")


def test_pieces_are_bounded(tmp_path, monkeypatch):
    """Bounded memory, shown structurally: pyarrow never parses more than one piece of about
    ``block_size`` bytes (plus the rest of the record it ends in)."""
    rows = base_rows() * 40
    path = write_log(tmp_path / "big.csv", rows, quoted=True)
    sizes = []
    real = pcsv.read_csv

    def spy(buf, *a, **kw):
        sizes.append(buf.size)
        return real(buf, *a, **kw)

    monkeypatch.setattr(pcsv, "read_csv", spy)
    out = list(iter_csv(path, {"user_id": "int", "time_ms": "int"}, block_size=2048))
    assert sum(len(c["user_id"]) for _, c in out) == len(rows)
    longest = max(len(l) for l in open(path, "rb").read().split(b"\n")) + 64
    assert len(sizes) > 20 and max(sizes) <= 2048 + 2 * longest


def test_gzip_and_tsv_and_header_details(tmp_path):
    rows = base_rows()
    plain = write_log(tmp_path / "a.csv", rows)
    gz = tmp_path / "a.csv.gz"
    gz.write_bytes(gzip.compress(open(plain, "rb").read()))
    got = [c["video_id"] for _, c in iter_csv(str(gz), {"video_id": "int"})]
    assert np.concatenate(got).tolist() == [100 + i for i in range(N_ROWS)]
    tsv = tmp_path / "a.tsv"
    tsv.write_bytes(b"\xef\xbb\xbf" + open(plain, "rb").read().replace(b",", b"\t"))  # with a BOM
    h = read_header(str(tsv))
    assert h.delimiter == "\t" and h.columns == LOG_COLUMNS
    bad = tmp_path / "bad.csv.gz"
    bad.write_bytes(gzip.compress(open(plain, "rb").read())[:200])
    with pytest.raises(DataError, match="bad.csv.gz"):
        list(iter_csv(str(bad), {"video_id": "int"}))


def test_error_pickles_and_alias():
    e = DataError("f.csv", 5, "item_id", "value 'x', expected an integer", line=9)
    assert str(e) == "f.csv: row 5 (file line 9), column 'item_id': value 'x', expected an integer"
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is DataError and str(back) == str(e) and back.line == 9
    assert KuaiRandDataError is DataError
    assert str(DataError("f.csv", 3, None, "p")) == "f.csv: row 3 (file line 4): p"
    assert str(DataError("f.parquet", 3, "c", "p", line=None)) == "f.parquet: row 3, column 'c': p"
    assert str(DataError("f.csv", 0, "c", "missing")) == "f.csv: header, column 'c': missing"


@pytest.mark.parametrize("seed", [0, 1])
def test_typed_and_cell_checked_paths_agree(tmp_path, seed):
    """The same cells through the typed parses and through the cell-checked path (forced by a
    hexadecimal-looking text in an unused column) give the csv module's values."""
    rng = np.random.default_rng(seed)
    n = 3000
    times = []
    for k in range(n):
        s = int(rng.integers(1_500_000_000, 1_700_000_000))
        form = rng.integers(0, 4)
        times.append([str(s), f"{s}.{int(rng.integers(0, 1000)):03d}", f"{s / 1e9:.9f}e9",
                      f" {s} "][form] if seed else str(s))
    rows = [f"{int(rng.integers(-50, 50))},{int(rng.integers(0, 10 ** 12))},{t},{k % 2},plain"
            for k, t in enumerate(times)]
    plain = tmp_path / "plain.csv"
    plain.write_text("u,i,t,a,note\n" + "\n".join(rows) + "\n")
    forced = tmp_path / "forced.csv"
    forced.write_text("u,i,t,a,note\n" + "\n".join(r.replace(",plain", ",0x1f") for r in rows)
                      + "\n")
    kinds = {"u": "int", "i": "nonneg_int", "t": "time_s", "a": "flag"}
    want = {"u": [], "i": [], "t": [], "a": []}
    for r in csv.DictReader(open(plain)):
        want["u"].append(int(r["u"]))
        want["i"].append(int(r["i"]))
        want["t"].append(int(np.rint(float(r["t"]) * 1000.0)))
        want["a"].append(int(r["a"]))
    modes = []
    for p in (plain, forced):
        got = {c: [] for c in kinds}
        reader = CsvReader(read_header(str(p)), kinds, block_size=4096)
        for _, arr in reader:
            for c in kinds:
                got[c] += np.asarray(arr[c]).tolist()
        assert got == want, p
        modes.append(reader._mode)
    assert modes == [seed, 2]  # int64 times / doubles for decimals; the forced file: cell-checked
