"""Streaming, validating readers for KuaiRand CSV files.

The log files go through the generic delimited-text reader (:mod:`.csv_stream`: newline-aligned
pieces of ``block_size`` bytes parsed by pyarrow, bounded memory), so KuaiRand and any other table
share one error contract: every data error is a :class:`~.errors.DataError` (``KuaiRandDataError``
is the same class) naming the file, the data row (1 = the first row after the header), the file
line and the column.  KuaiRand's ids must be non-negative integers (an integral decimal such as
``3892024.0`` reads as 3892024; ``12.5`` is an error), ``time_ms`` an integer, the action columns
0 or 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, List, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .csv_stream import DEFAULT_BLOCK_SIZE, CsvReader
from .csv_stream import read_header as read_csv_header
from .errors import DataError, KuaiRandDataError
from .schema import (
    ACTION_BITS,
    ACTION_COLUMNS,
    LOG_COLUMNS,
    SAMPLE_LOG_COLUMNS,
    USER_FEATURE_COLUMNS,
    VIDEO_FEATURE_COLUMNS,
    LogFormat,
)

__all__ = ["DEFAULT_BLOCK_SIZE", "KuaiRandDataError", "detect_format", "iter_int_columns",
           "iter_log_chunks", "read_header", "read_user_features", "read_video_features"]


def read_header(path: str) -> Tuple[Tuple[str, ...], str]:
    """Column names and delimiter (tab if the header line has a tab, else comma)."""
    h = read_csv_header(path)
    return h.columns, h.delimiter


def detect_format(path: str) -> LogFormat:
    """Official log (``is_like``/``is_hate``) or the shared sample (``label``); checks columns."""
    cols, delim = read_header(path)
    kind = "sample" if ("label" in cols and "is_like" not in cols) else "official"
    required = SAMPLE_LOG_COLUMNS if kind == "sample" else LOG_COLUMNS
    # the builder needs ids, time and the action columns; other official columns are optional
    fmt = LogFormat(kind, delim, cols)
    for c in _log_kinds(fmt):
        if c not in cols:
            raise DataError(path, 0, c, f"missing column (a KuaiRand {kind} log has "
                                        f"{', '.join(required)}); the file's columns are: "
                                        f"{', '.join(cols)}")
    return fmt


def _log_kinds(fmt: LogFormat) -> Dict[str, str]:
    kinds = {"user_id": "nonneg_int", "video_id": "nonneg_int", "time_ms": "int"}
    kinds.update({ACTION_COLUMNS[a]: "flag" for a in fmt.actions})
    if fmt.kind == "sample":
        kinds["label"] = "flag"
    return kinds


def iter_int_columns(path: str, columns: Sequence[str], delim: str,
                     block_size: int = DEFAULT_BLOCK_SIZE
                     ) -> Iterator[Tuple[int, Dict[str, np.ndarray]]]:
    """Stream ``columns`` of ``path`` as int64 numpy arrays: yields ``(first_row, arrays)``."""
    header = read_csv_header(path, delim)
    yield from CsvReader(header, {c: "int" for c in columns}, block_size)  # type: ignore[misc]


def iter_log_chunks(path: str, block_size: int = DEFAULT_BLOCK_SIZE, context: Sequence[str] = ()
                    ) -> Iterator[Tuple[int, Dict[str, np.ndarray]]]:
    """Stream a KuaiRand log (official or sample format).

    Yields ``(first_row, {"user_id", "video_id", "time_ms": int64, "actions": uint8, <context
    column>: int64 ...})``; the action byte ORs :data:`~torchrec_ascend.datasets.schema.
    ACTION_BITS` (the sample's ``label`` = 1 sets ``like``, 0 sets ``hate``); ``context``: other
    integer columns to read (a missing one is a :class:`DataError` naming it).
    """
    fmt = detect_format(path)
    header = read_csv_header(path, fmt.delimiter)
    kinds = _log_kinds(fmt)
    for c in context:
        if c not in fmt.columns:
            raise DataError(path, 0, c, f"missing column (asked for as a context column); the "
                                        f"file's columns are: {', '.join(fmt.columns)}")
        kinds.setdefault(c, "int")
    for row, arr in CsvReader(header, kinds, block_size):
        actions = np.zeros(len(arr["user_id"]), dtype=np.uint8)
        if fmt.kind == "sample":
            actions |= np.where(arr["label"] == 1, ACTION_BITS["like"],
                                ACTION_BITS["hate"]).astype(np.uint8)
        for a in fmt.actions:
            actions |= arr[ACTION_COLUMNS[a]] * np.uint8(ACTION_BITS[a])
        yield row, {"user_id": arr["user_id"], "video_id": arr["video_id"],
                    "time_ms": arr["time_ms"], "actions": actions,
                    **{c: arr[c].astype(np.int64) for c in context}}


@dataclass
class FeatureTable:
    """Numeric columns of a features file as float64 (empty = NaN); other columns
    (``text_columns``) as category codes (index into the sorted distinct texts)."""

    path: str
    ids: np.ndarray
    columns: Dict[str, np.ndarray]
    text_columns: Tuple[str, ...] = ()


def read_feature_table(path: str, id_column: str, expected: Sequence[str],
                       block_size: int = DEFAULT_BLOCK_SIZE) -> FeatureTable:
    """Read ``user_features_*.csv`` / ``video_features_basic_*.csv``: validated non-negative
    integer id column, other expected columns as numbers or category codes (e.g.
    ``user_active_degree``)."""
    header = read_csv_header(path)
    if id_column not in header.columns:
        raise DataError(path, 0, id_column, f"missing column (expected columns: "
                                            f"{', '.join(expected)}); the file's columns are: "
                                            f"{', '.join(header.columns)}")
    others = [c for c in header.columns if c != id_column and c in expected]
    kinds = {id_column: "nonneg_int", **{c: "raw" for c in others}}
    ids: List[np.ndarray] = []
    parts: Dict[str, List[pa.Array]] = {c: [] for c in others}
    for _, arr in CsvReader(header, kinds, block_size):
        ids.append(arr[id_column])  # type: ignore[arg-type]
        for c in others:
            parts[c].append(arr[c])  # type: ignore[arg-type]
    out: Dict[str, np.ndarray] = {}
    text_cols = []
    for c, ps in parts.items():
        text = pa.chunked_array(ps, pa.string()).combine_chunks() if ps else pa.array([], pa.string())
        out[c], is_text = _numbers_or_codes(text)
        if is_text:
            text_cols.append(c)
    all_ids = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
    return FeatureTable(path, all_ids, out, tuple(text_cols))


def _numbers_or_codes(text: pa.Array) -> Tuple[np.ndarray, bool]:
    """(float64 with NaN for empty cells, False) if every non-empty cell is a number, else
    (category codes, True)."""
    t = pc.utf8_trim(text, characters=" \t")
    empty = pc.equal(t, "")
    try:
        return (pc.cast(pc.if_else(empty, None, t), pa.float64()).to_numpy(zero_copy_only=False),
                False)
    except pa.ArrowInvalid:
        _, codes = np.unique(text.to_numpy(zero_copy_only=False).astype(str), return_inverse=True)
        return codes, True


def read_user_features(path: str) -> FeatureTable:
    """``user_features_*.csv`` (Pure / 1K / 27K)."""
    return read_feature_table(path, "user_id", USER_FEATURE_COLUMNS)


def read_video_features(path: str) -> FeatureTable:
    """``video_features_basic_*.csv`` (Pure / 1K / 27K)."""
    return read_feature_table(path, "video_id", VIDEO_FEATURE_COLUMNS)
