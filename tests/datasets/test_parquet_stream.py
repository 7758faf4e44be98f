"""Parquet input: bad values named by row and column (batches of a few rows, so the bad row
is in a later batch), column types checked from the schema before reading."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from torchrec_ascend.datasets import DataError, TableSpec, preprocess_table
from torchrec_ascend.datasets.parquet_stream import iter_parquet

N, BAD = 50, 37


def table(**override):
    cols = {"user_id": pa.array(np.arange(N) % 4, pa.int64()),
            "item_id": pa.array(100 + np.arange(N), pa.int64()),
            "timestamp": pa.array(1600000000 + np.arange(N), pa.int64()),
            "click": pa.array(np.arange(N) % 2, pa.int8())}
    cols.update(override)
    return pa.table(cols)


def with_bad(col, good, bad, typ):
    v = list(good)
    v[BAD - 1] = bad
    return {col: pa.array(v, typ)}


CASES = {
    "decimal_id": (with_bad("item_id", np.arange(N) + 0.0, 12.5, pa.float64()), "item_id", "'12.5'"),
    "nan_id": (with_bad("item_id", np.arange(N) + 0.0, float("nan"), pa.float64()), "item_id", "'nan'"),
    "null_id": (with_bad("user_id", range(N), None, pa.int64()), "user_id", "empty value"),
    "uint64_id": (with_bad("user_id", range(N), 2 ** 63, pa.uint64()), "user_id", "int64 range"),
    "text_id_in_int_column": (with_bad("item_id", [str(i) for i in range(N)], "x7", pa.string()),
                              "item_id", "'x7'"),
    "null_time": (with_bad("timestamp", range(N), None, pa.int64()), "timestamp", "empty value"),
    "inf_time": (with_bad("timestamp", np.arange(N) + 0.5, float("inf"), pa.float64()),
                 "timestamp", "'inf'"),
    "time_beyond_int64_ms": (with_bad("timestamp", range(N), 2 ** 62, pa.int64()), "timestamp",
                             "fit int64"),
    "action_2": (with_bad("click", np.arange(N) % 2, 2, pa.int8()), "click", "'2', expected 0 or 1"),
    "bad_utf8_text_id": (with_bad("item_id", [b"a%d" % i for i in range(N)], b"\xff", pa.binary()),
                         "item_id", "not valid UTF-8"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_values_named_by_row_and_column(tmp_path, case):
    override, column, problem = CASES[case]
    p = str(tmp_path / "t.parquet")
    pq.write_table(table(**override), p, row_group_size=16)
    id_type = "str" if case == "bad_utf8_text_id" else "int"
    spec = TableSpec([p], action_cols=["click"], id_type=id_type)
    with pytest.raises(DataError) as e:
        preprocess_table(spec, str(tmp_path / "c"), batch_rows=8)
    err = e.value
    assert (err.path, err.row, err.line, err.column) == (p, BAD, None, column), str(err)
    assert problem in err.problem and str(err).startswith(f"{p}: row {BAD}, column {column!r}: ")


@pytest.mark.parametrize("column,typ,match", [
    ("item_id", pa.list_(pa.int64()), "list<"),
    ("timestamp", pa.string(), None),  # text times are parsed, not refused
    ("click", pa.timestamp("s"), "cannot be read as 0 or 1"),
    ("user_id", pa.bool_(), "cannot be read as an id"),
])
def test_column_types_checked_up_front(tmp_path, column, typ, match):
    vals = {pa.list_(pa.int64()): [[1]] * N, pa.string(): [str(1600000000 + i) for i in range(N)],
            pa.timestamp("s"): list(range(N)), pa.bool_(): [True] * N}[typ]
    p = str(tmp_path / "t.parquet")
    pq.write_table(table(**{column: pa.array(vals, typ)}), p)
    spec = TableSpec([p], action_cols=["click"])
    if match is None:
        assert preprocess_table(spec, str(tmp_path / "c"))
        return
    with pytest.raises(DataError, match=f"header, column {column!r}: type .*{match}"):
        preprocess_table(spec, str(tmp_path / "c"))


def test_batches_bounded_and_values(tmp_path):
    p = str(tmp_path / "t.parquet")
    pq.write_table(table(click=pa.array(np.arange(N) % 2 == 1)), p, row_group_size=16)
    chunks = list(iter_parquet(p, {"item_id": "int", "click": "flag"}, batch_rows=8))
    assert max(len(c["item_id"]) for _, c in chunks) <= 8
    assert [r for r, _ in chunks] == list(range(0, N, 8))
    assert np.concatenate([c["item_id"] for _, c in chunks]).tolist() == list(range(100, 100 + N))
    assert np.concatenate([c["click"] for _, c in chunks]).tolist() == [i % 2 for i in range(N)]
    with pytest.raises(ValueError, match="batch_rows"):
        list(iter_parquet(p, {"item_id": "int"}, batch_rows=0))


def test_empty_parquet_has_no_rows(tmp_path):
    p = str(tmp_path / "t.parquet")
    pq.write_table(table().slice(0, 0), p)
    with pytest.raises(DataError, match="no data rows"):
        preprocess_table(TableSpec([p]), str(tmp_path / "c"))
