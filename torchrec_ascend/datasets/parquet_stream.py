"""Streaming, validating reader of Parquet files (pyarrow), batch by batch.

Only the needed columns are read, ``batch_rows`` rows at a time (``ParquetFile.iter_batches``:
memory is one row group's column chunks of those columns, not the file).  Column types are checked
against the converter kind from the schema before any row is read; every value goes through
:func:`~.convert.convert`, so a Parquet file and the same table written as CSV give the same
values and the same errors (rows numbered from 1; Parquet has no file lines).
"""

from __future__ import annotations

from typing import Dict, Iterator, Mapping, Tuple

import pyarrow as pa
import pyarrow.parquet as pq

from .convert import Converted, convert_columns, type_problem
from .csv_stream import check_file
from .errors import DataError

DEFAULT_BATCH_ROWS = 1 << 18


def open_parquet(path: str) -> pq.ParquetFile:
    """Open ``path`` (DataError if it is not a readable Parquet file)."""
    check_file(path)
    try:
        return pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as e:
        raise DataError(path, 0, None, f"not a readable Parquet file ({e})") from e


def check_parquet_columns(path: str, pf: pq.ParquetFile, kinds: Mapping[str, str]) -> None:
    """Every needed column present once, with a type that can hold its kind."""
    schema = pf.schema_arrow
    names = list(schema.names)
    for c, kind in kinds.items():
        if c not in names:
            raise DataError(path, 0, c, f"missing column; the file's columns are: "
                                        f"{', '.join(names)}")
        if names.count(c) > 1:
            raise DataError(path, 0, c, "the schema names this column more than once")
        problem = type_problem(schema.field(c).type, kind)
        if problem is not None:
            raise DataError(path, 0, c, problem)


def iter_parquet(path: str, kinds: Mapping[str, str], batch_rows: int = DEFAULT_BATCH_ROWS
                 ) -> Iterator[Tuple[int, Dict[str, Converted]]]:
    """Stream the ``kinds`` columns: ``(first_row, {column: values})`` per batch."""
    if batch_rows < 1:
        raise ValueError(f"batch_rows: must be >= 1, got {batch_rows}")
    pf = open_parquet(path)
    check_parquet_columns(path, pf, kinds)
    order = {c: i for i, c in enumerate(pf.schema_arrow.names)}
    rows = 0
    batches = pf.iter_batches(batch_size=batch_rows, columns=list(kinds))
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (OSError, pa.ArrowException) as e:
            raise DataError(path, rows + 1, None, f"cannot be read from here on ({e})",
                            line=None) from e
        out, bad = convert_columns(batch, kinds, order)
        if bad is not None:
            i, _, c, problem = bad
            raise DataError(path, rows + i + 1, c, problem, line=None)
        if batch.num_rows:
            yield rows, out
        rows += batch.num_rows
