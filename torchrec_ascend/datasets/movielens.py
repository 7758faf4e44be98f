"""MovieLens ``ratings.dat`` (``UserID::MovieID::Rating::Timestamp``, no header) -> a CSV table.

ML-1M and ML-10M ship their ratings as ``::``-separated lines without a header; the generic
table reader (:func:`torchrec_ascend.datasets.load_table_sequences`) reads one-character
delimiters and a header line.  :func:`convert_ratings` writes the same rows as a CSV with the
header ``user_id,item_id,rating,timestamp`` (the table reader's default column names, seconds),
so the converted file trains with the default config::

    convert_ratings("ml-1m/ratings.dat", "ml-1m/ratings.csv")
    python -m torchrec_ascend.training --data ml-1m/ratings.csv --out runs/ml-1m

Every line is checked (four fields; user, movie and timestamp non-negative integers; the rating a
non-negative number, ML-10M has half stars); a bad line is a :class:`DataError` naming the file,
the line and the column, and no output file is left behind.  The data itself is not shipped
(GroupLens' licence forbids redistribution): https://grouplens.org/datasets/movielens/1m/.
"""

from __future__ import annotations

import os
import re
from typing import Tuple

from .errors import DataError

__all__ = ["RATINGS_COLUMNS", "convert_ratings"]

RATINGS_COLUMNS: Tuple[str, ...] = ("user_id", "item_id", "rating", "timestamp")
_SOURCE_NAMES = ("UserID", "MovieID", "Rating", "Timestamp")
_LINE = re.compile(r"([0-9]+)::([0-9]+)::([0-9]+(?:\.[0-9]+)?)::([0-9]+)")
_INT = re.compile(r"[0-9]+")
_NUM = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def _explain(path: str, lineno: int, text: str) -> DataError:
    """The precise problem of a line that did not match the format."""
    fields = text.split("::")
    if len(fields) != 4:
        return DataError(path, lineno, None, f"expected 4 '::'-separated fields "
                                             f"(UserID::MovieID::Rating::Timestamp), got "
                                             f"{len(fields)}: {text[:80]!r}", line=lineno)
    for name, value in zip(_SOURCE_NAMES, fields):
        ok = _NUM if name == "Rating" else _INT
        if not ok.fullmatch(value):
            what = "a non-negative number" if name == "Rating" else "a non-negative integer"
            return DataError(path, lineno, name, f"{value!r} is not {what}", line=lineno)
    return DataError(path, lineno, None, f"does not parse: {text[:80]!r}", line=lineno)


def convert_ratings(src: str, dst: str) -> int:
    """Convert a MovieLens ``ratings.dat`` at ``src`` into a CSV at ``dst``; returns the rows.

    Streaming (one line at a time); the CSV is written under a temporary name and renamed, so a
    failure leaves no partial ``dst``.  Blank lines are not allowed (``DataError``), nor an empty
    file.  Line ``l`` of ``src`` is data row ``l`` of ``dst`` (its file line ``l + 1``).
    """
    if not os.path.isfile(src):
        raise DataError(src, 0, None, "no such file (a MovieLens ratings.dat)")
    tmp = f"{dst}.tmp-{os.getpid()}"
    rows = 0
    try:
        with open(src, "r", encoding="latin-1", newline="") as fin, \
                open(tmp, "w", encoding="ascii", newline="") as fout:
            fout.write(",".join(RATINGS_COLUMNS) + "\n")
            for lineno, raw in enumerate(fin, start=1):
                text = raw.rstrip("\r\n")
                m = _LINE.fullmatch(text)
                if m is None:
                    raise _explain(src, lineno, text)
                fout.write(",".join(m.groups()) + "\n")
                rows = lineno
        if rows == 0:
            raise DataError(src, 0, None, "empty file (no ratings)")
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return rows
