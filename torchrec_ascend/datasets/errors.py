"""The one error class of the data readers: bad input named by file, row, file line and column.

Every reader (KuaiRand logs, generic CSV / TSV / Parquet tables) raises :class:`DataError` for bad
data, never a dependency's exception: the message is one line,

``<path>: row <r> (file line <l>), column '<c>': <problem>``

where ``row`` counts data rows from 1 (the header is not a data row; blank lines are not rows) and
``file line`` is the 1-based physical line where that row starts (they differ after a quoted field
holding a line break, or after blank lines).  Parquet files have no lines: ``row <r>`` only.
Row 0 is the file itself (``<path>: <problem>``) or, with a column, its header / schema
(``<path>: header, column '<c>': <problem>``).
"""

from __future__ import annotations

from typing import Optional, Tuple

_AUTO = -1  # line = row + 1 (one header line, no blank lines, no line breaks inside fields)


class DataError(ValueError):
    """Bad input data; carries ``path``, ``row`` (1-based data row, 0 = file / header),
    ``line`` (1-based file line of the row, None where the file has no lines), ``column``
    (None where the problem is not in one column) and ``problem`` (the text after the location).

    ``line`` defaults to ``row + 1`` (data row ``r`` of a file with one header line is line
    ``r + 1``).  Picklable, so it can be sent between ranks (``broadcast_object_list``)."""

    def __init__(self, path: str, row: int, column: Optional[str], problem: str,
                 line: Optional[int] = _AUTO) -> None:
        if line == _AUTO:
            line = row + 1 if row > 0 else None
        self.path, self.row, self.column, self.problem, self.line = path, row, column, problem, line
        super().__init__(format_location(path, row, line, column) + problem)

    def __reduce__(self) -> Tuple[object, ...]:
        return (type(self), (self.path, self.row, self.column, self.problem, self.line))


def format_location(path: str, row: int, line: Optional[int], column: Optional[str]) -> str:
    """``"<path>: row 5 (file line 6), column 'x': "`` (the prefix of every message)."""
    col = f"column {column!r}" if column else ""
    if row > 0:
        where = f"row {row}" + (f" (file line {line})" if line is not None else "")
        return f"{path}: {where}{', ' + col if col else ''}: "
    if col:
        return f"{path}: header, {col}: "
    return f"{path}: "


# The KuaiRand reader's historical name; the same class (``except KuaiRandDataError`` catches
# errors of the generic table reader too).
KuaiRandDataError = DataError
