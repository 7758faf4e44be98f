"""Streaming, validating readers for KuaiRand CSV files (pyarrow's columnar CSV engine).

Files are never loaded whole: the file is read in newline-aligned pieces of ``block_size`` bytes,
each parsed by pyarrow's CSV reader, and :func:`iter_log_chunks` yields one piece at a time as
numpy arrays (ids, time, one-byte action bitmask).  Every data error is a :class:`KuaiRandDataError`
(a ``ValueError``) naming the file, the row and the column: rows are counted from 1 for the first
data row (the header is line 1 of the file, so data row ``r`` is file line ``r + 1``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from .schema import (
    ACTION_BITS,
    ACTION_COLUMNS,
    LOG_COLUMNS,
    LOG_ID_COLUMNS,
    SAMPLE_LOG_COLUMNS,
    USER_FEATURE_COLUMNS,
    VIDEO_FEATURE_COLUMNS,
    LogFormat,
)

DEFAULT_BLOCK_SIZE = 16 << 20  # bytes of CSV text per block


class KuaiRandDataError(ValueError):
    """Bad KuaiRand input: carries ``path``, ``row`` (1-based data row, 0 = header/file) and
    ``column``."""

    def __init__(self, path: str, row: int, column: Optional[str], problem: str) -> None:
        where = "header" if row == 0 else f"row {row} (file line {row + 1})"
        col = f", column {column!r}" if column else ""
        super().__init__(f"{path}: {where}{col}: {problem}")
        self.path, self.row, self.column, self.problem = path, row, column, problem


def _open_check(path: str) -> None:
    if not os.path.exists(path):
        raise KuaiRandDataError(path, 0, None, "file does not exist")
    if os.path.isdir(path):
        raise KuaiRandDataError(path, 0, None, "is a directory, expected a CSV file")
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as e:
        raise KuaiRandDataError(path, 0, None, f"cannot be read ({e.strerror or e})") from e
    if os.path.getsize(path) == 0:
        raise KuaiRandDataError(path, 0, None, "file is empty (no header)")


def read_header(path: str) -> Tuple[Tuple[str, ...], str]:
    """Column names and delimiter (tab if the header line has a tab, else comma)."""
    _open_check(path)
    with open(path, "rb") as f:
        line = f.readline().decode("utf-8", errors="replace").rstrip("\r\n")
    if not line.strip():
        raise KuaiRandDataError(path, 0, None, "empty header line")
    delim = "\t" if "\t" in line else ","
    cols = tuple(c.strip().strip('"') for c in line.split(delim))
    return cols, delim


def detect_format(path: str) -> LogFormat:
    """Official log (``is_like``/``is_hate``) or the shared sample (``label``); checks columns."""
    cols, delim = read_header(path)
    kind = "sample" if ("label" in cols and "is_like" not in cols) else "official"
    required = SAMPLE_LOG_COLUMNS if kind == "sample" else LOG_COLUMNS
    # the builder needs ids, time and the action columns; other official columns are optional
    fmt = LogFormat(kind, delim, cols)
    needed = list(LOG_ID_COLUMNS) + [ACTION_COLUMNS[a] for a in fmt.actions]
    if kind == "sample":
        needed.append("label")
    for c in needed:
        if c not in cols:
            raise KuaiRandDataError(
                path, 0, c, f"missing column (a KuaiRand {kind} log has {', '.join(required)})")
    return fmt


def _locate_bad_value(path: str, delim: str, columns: Sequence[str], row0: int,
                      block_size: int) -> KuaiRandDataError:
    """After a conversion failure: rescan as strings, return the error for the first bad cell."""
    opts = pcsv.ConvertOptions(include_columns=list(columns),
                               column_types={c: pa.string() for c in columns})
    reader = pcsv.open_csv(path, read_options=pcsv.ReadOptions(block_size=block_size),
                           parse_options=pcsv.ParseOptions(delimiter=delim), convert_options=opts)
    row = 0
    for batch in reader:
        for c in columns:
            col = batch.column(c)
            ok = pc.match_substring_regex(col, r"^\s*[-+]?\d+(\.0*)?\s*$")
            bad = pc.invert(pc.fill_null(ok, False))
            if pc.any(bad).as_py():
                i = int(np.flatnonzero(bad.to_numpy(zero_copy_only=False))[0])
                v = col[i].as_py()
                what = "empty value" if v in (None, "") else f"non-numeric value {v!r}"
                return KuaiRandDataError(path, row + i + 1, c, f"{what}, expected an integer")
        row += batch.num_rows
    return KuaiRandDataError(path, row0 + 1, None, "unparseable row")


def _pieces(path: str, block_size: int) -> Iterator[bytes]:
    """The data lines of ``path`` (header skipped) in pieces of about ``block_size`` bytes, each
    ending at a line end.  Bounded memory: pyarrow's streaming reader (``open_csv``) was measured
    to grow with the file (docs/kuairand.md); parsing one piece at a time does not."""
    with open(path, "rb") as f:
        f.readline()
        rest = b""
        while True:
            buf = f.read(block_size)
            if not buf:
                if rest.strip():
                    yield rest + b"\n"
                return
            data = rest + buf
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                rest = data
                continue
            rest = data[cut:]
            yield data[:cut]


def iter_int_columns(path: str, columns: Sequence[str], delim: str,
                     block_size: int = DEFAULT_BLOCK_SIZE) -> Iterator[Tuple[int, Dict[str, np.ndarray]]]:
    """Stream ``columns`` of ``path`` as int64 numpy arrays: yields ``(first_row, arrays)``.

    pyarrow parses each newline-aligned piece of about ``block_size`` bytes (:func:`_pieces`)."""
    header, _ = read_header(path)
    opts = pcsv.ConvertOptions(include_columns=list(columns),
                               column_types={c: pa.int64() for c in columns},
                               strings_can_be_null=True)
    ropts = pcsv.ReadOptions(column_names=list(header))
    popts = pcsv.ParseOptions(delimiter=delim)
    row = 0
    for piece in _pieces(path, block_size):
        try:
            table = pcsv.read_csv(pa.py_buffer(piece), read_options=ropts, parse_options=popts,
                                  convert_options=opts)
        except pa.ArrowInvalid as e:
            raise _locate_bad_value(path, delim, columns, row, block_size) from e
        out: Dict[str, np.ndarray] = {}
        for c in columns:
            col = table.column(c).combine_chunks()
            if col.null_count:
                i = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
                raise KuaiRandDataError(path, row + i + 1, c, "empty value, expected an integer")
            out[c] = col.to_numpy()
        del table
        if len(out[columns[0]]):
            yield row, out
        row += len(out[columns[0]])


def iter_log_chunks(path: str, block_size: int = DEFAULT_BLOCK_SIZE
                    ) -> Iterator[Tuple[int, Dict[str, np.ndarray]]]:
    """Stream a KuaiRand log (official or sample format).

    Yields ``(first_row, {"user_id", "video_id", "time_ms": int64, "actions": uint8})``; the
    action byte ORs :data:`~torchrec_ascend.datasets.schema.ACTION_BITS` (the sample's
    ``label`` = 1 sets ``like``, 0 sets ``hate``).
    """
    fmt = detect_format(path)
    act_cols = [ACTION_COLUMNS[a] for a in fmt.actions]
    extra = ["label"] if fmt.kind == "sample" else []
    cols = list(LOG_ID_COLUMNS) + act_cols + extra
    for row, arr in iter_int_columns(path, cols, fmt.delimiter, block_size):
        actions = np.zeros(len(arr["user_id"]), dtype=np.uint8)
        flags = [(ACTION_BITS[a], ACTION_COLUMNS[a]) for a in fmt.actions]
        if fmt.kind == "sample":
            lab = arr["label"]
            _check_binary(path, row, "label", lab)
            actions |= np.where(lab == 1, ACTION_BITS["like"], ACTION_BITS["hate"]).astype(np.uint8)
        for bit, c in flags:
            v = arr[c]
            # long_view etc. are 0/1 in every KuaiRand release; anything else is a data error
            _check_binary(path, row, c, v)
            actions |= (v.astype(np.uint8) * np.uint8(bit))
        for c in ("user_id", "video_id"):
            neg = arr[c] < 0
            if neg.any():
                i = int(np.flatnonzero(neg)[0])
                raise KuaiRandDataError(path, row + i + 1, c, f"negative id {int(arr[c][i])}")
        yield row, {"user_id": arr["user_id"], "video_id": arr["video_id"],
                    "time_ms": arr["time_ms"], "actions": actions}


def _check_binary(path: str, row: int, column: str, v: np.ndarray) -> None:
    bad = (v != 0) & (v != 1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise KuaiRandDataError(path, row + i + 1, column, f"value {int(v[i])}, expected 0 or 1")


@dataclass
class FeatureTable:
    """Numeric columns of a features file; string columns are kept as pyarrow dictionary codes."""

    path: str
    ids: np.ndarray
    columns: Dict[str, np.ndarray]


def read_feature_table(path: str, id_column: str, expected: Sequence[str],
                       block_size: int = DEFAULT_BLOCK_SIZE) -> FeatureTable:
    """Read ``user_features_*.csv`` / ``video_features_basic_*.csv``: validated integer id column,
    other columns as float64 (numbers) or category codes (strings, e.g. ``user_active_degree``)."""
    cols, delim = read_header(path)
    if id_column not in cols:
        raise KuaiRandDataError(path, 0, id_column,
                                f"missing column (expected columns: {', '.join(expected)})")
    ids = [a[id_column] for _, a in iter_int_columns(path, [id_column], delim, block_size)]
    others = [c for c in cols if c != id_column and c in expected]
    reader = pcsv.open_csv(path, read_options=pcsv.ReadOptions(block_size=block_size),
                           parse_options=pcsv.ParseOptions(delimiter=delim),
                           convert_options=pcsv.ConvertOptions(include_columns=others))
    parts: Dict[str, list] = {c: [] for c in others}
    for batch in reader:
        for c in others:
            col = batch.column(c)
            if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
                parts[c].append(pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False))
            else:
                parts[c].append(pc.cast(col, pa.string()).to_numpy(zero_copy_only=False))
    out: Dict[str, np.ndarray] = {}
    for c, ps in parts.items():
        arr = np.concatenate(ps) if ps else np.zeros(0)
        if arr.dtype == object:
            _, arr = np.unique(arr.astype(str), return_inverse=True)
        out[c] = arr
    all_ids = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
    return FeatureTable(path, all_ids, out)


def read_user_features(path: str) -> FeatureTable:
    """``user_features_*.csv`` (Pure / 1K / 27K)."""
    return read_feature_table(path, "user_id", USER_FEATURE_COLUMNS)


def read_video_features(path: str) -> FeatureTable:
    """``video_features_basic_*.csv`` (Pure / 1K / 27K)."""
    return read_feature_table(path, "video_id", VIDEO_FEATURE_COLUMNS)
