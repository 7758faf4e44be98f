"""Streaming, validating reader of delimited text files (CSV / TSV), in bounded memory.

The file (optionally compressed: ``.gz``, ``.bz2``, ``.zst``, ``.lz4``, by extension) is read in
pieces of about ``block_size`` bytes, each ending at a record end; pyarrow's CSV parser converts
each piece (``pyarrow.csv.read_csv``: its streaming reader's memory grows with the file,
docs/kuairand.md), and every needed column goes through :func:`~.convert.convert`.  Any
problem is a :class:`~.errors.DataError` naming file, data row, file line and column.

Format: the first record is the header (column names).  Fields are separated by one character;
quoting follows RFC 4180: a field is either unquoted (no ``"`` in it) or enclosed in double
quotes, inside which the delimiter and line breaks are data and a quote is written twice.  Lines
end with ``\\n`` or ``\\r\\n``; blank lines are skipped (they are not data rows).  Refused, with
the line named: a ``"`` inside an unquoted field or text after a closing quote (record
boundaries are found by quote parity, which such a quote would shift), a quote never closed, a
bare ``\\r`` line end, a record with a different number of fields than the header.

Fast path: each piece is parsed with the needed columns typed (int64 / string; if that fails,
times as doubles), which is pyarrow's own speed; a piece that still fails (an integral decimal
id, an empty cell, a bad value, a malformed record) is parsed again as raw bytes and checked cell
by cell to find and name the first problem, or to convert what the typed parses cannot.  A file
that needed that once is read that way to its end.  File lines are counted only for an error.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from .convert import Converted, convert_columns
from .errors import DataError

DEFAULT_BLOCK_SIZE = 16 << 20  # bytes of text per piece
MAX_RECORD_BYTES = 64 << 20    # a record longer than this (an unclosed quote?) is an error
COMPRESSED = (".gz", ".bz2", ".zst", ".lz4")
_FAST_TYPES = {"int": pa.int64(), "nonneg_int": pa.int64(), "flag": pa.int64(),
               "time_s": pa.int64(), "time_ms": pa.int64(), "text": pa.string(),
               "raw": pa.string()}
_NL, _CR, _QUOTE = 10, 13, 34


def check_file(path: str) -> None:
    """DataError unless ``path`` is an existing, readable, non-empty regular file."""
    if not os.path.exists(path):
        raise DataError(path, 0, None, "file does not exist")
    if os.path.isdir(path):
        raise DataError(path, 0, None, "is a directory, expected a data file")
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as e:
        raise DataError(path, 0, None, f"cannot be read ({e.strerror or e})") from e
    if os.path.getsize(path) == 0:
        raise DataError(path, 0, None, "file is empty (no header)")


def _open(path: str) -> pa.NativeFile:
    compression = "detect" if path.lower().endswith(COMPRESSED) else None
    try:
        return pa.input_stream(path, compression=compression)
    except (OSError, pa.ArrowException) as e:
        raise DataError(path, 0, None, f"cannot be opened ({e})") from e


def _read(stream: pa.NativeFile, path: str, n: int) -> bytes:
    try:
        return stream.read(n)
    except (OSError, pa.ArrowException) as e:  # a damaged compressed stream
        raise DataError(path, 0, None, f"cannot be decompressed / read ({e})") from e


@dataclass(frozen=True)
class CsvHeader:
    """A delimited file's header: column names, delimiter, and where the data starts."""

    path: str
    columns: Tuple[str, ...]
    delimiter: str
    nbytes: int  # bytes of the header record, line end included
    lines: int   # physical lines of the header record (1 unless a name holds a line break)

    def require(self, needed: Sequence[str], what: str = "") -> None:
        """DataError naming the first missing column and listing the columns present."""
        for c in needed:
            if c not in self.columns:
                raise DataError(self.path, 0, c, f"missing column{what}; the file's columns "
                                f"are: {', '.join(self.columns)}")


def read_header(path: str, sep: Optional[str] = None) -> CsvHeader:
    """Read the header record; ``sep=None``: tab if the header line has a tab, else comma."""
    check_file(path)
    with _open(path) as stream:
        data = b""
        while True:
            buf = _read(stream, path, 1 << 16)
            data += buf
            end = _last_record_end(data, first=True)
            if end >= 0 or not buf:
                break
            if len(data) > MAX_RECORD_BYTES:
                raise DataError(path, 0, None, f"no line end in the first {len(data)} bytes")
    if not data:
        raise DataError(path, 0, None, "file is empty (no header)")
    if end < 0:  # header only, no line end
        if data.count(b'"') % 2:
            raise DataError(path, 0, None, "the header has an unclosed double quote")
        end = len(data)
    raw = data[:end].rstrip(b"\r")
    if raw.startswith(b"\xef\xbb\xbf"):  # UTF-8 byte order mark
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(path, 0, None, f"the header (line 1) is not valid UTF-8 ({e.reason} "
                                       f"at byte {e.start})") from e
    if not text.strip():
        raise DataError(path, 0, None, "the first line is empty (expected a header naming the "
                                       "columns)")
    delim = sep if sep is not None else ("\t" if "\t" in text else ",")
    try:
        names = next(csv.reader([text], delimiter=delim, quotechar='"', strict=True))
    except csv.Error as e:
        raise DataError(path, 0, None, f"the header (line 1) cannot be parsed ({e})") from e
    cols = tuple(n.strip() for n in names)
    return CsvHeader(path, cols, delim, min(end + 1, len(data)), data[:end].count(b"\n") + 1)


def _last_record_end(data: bytes, first: bool = False) -> int:
    """Offset of the last (``first``: the first) ``\\n`` outside quotes, -1 if none."""
    pos = data.find(b"\n") if first else data.rfind(b"\n")
    if pos < 0 or data.find(b'"') < 0:
        return pos
    b = np.frombuffer(data, np.uint8)
    q = np.flatnonzero(b == _QUOTE)
    nl = np.flatnonzero(b == _NL)
    outside = nl[(np.searchsorted(q, nl) & 1) == 0]
    if not len(outside):
        return -1
    return int(outside[0] if first else outside[-1])


@dataclass
class _Layout:
    """Where the non-empty records of a piece are (found by quote parity)."""

    starts: np.ndarray   # byte offset of each record
    lines: np.ndarray    # newlines before it in the piece
    nfields: np.ndarray  # fields of each record
    # the first structural problem: (record index, byte offset, column index, problem)
    problem: Optional[Tuple[int, int, int, str]]


def _layout(piece: bytes, delim: str) -> _Layout:
    b = np.frombuffer(piece, np.uint8)
    n = len(b)
    nl = np.flatnonzero(b == _NL)
    q = np.flatnonzero(b == _QUOTE)
    d = np.flatnonzero(b == ord(delim))
    if len(q):
        ends = nl[(np.searchsorted(q, nl) & 1) == 0]
        d = d[(np.searchsorted(q, d) & 1) == 0]
    else:
        ends = nl
    if not len(ends) or ends[-1] != n - 1:  # an unclosed quote runs to the end of the piece
        ends = np.append(ends, n - 1)
    starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
    content_end = ends - ((ends > starts) & (b[np.maximum(ends - 1, 0)] == _CR))
    nonempty = content_end > starts
    # structural problems, by byte offset
    bad_at, bad_what = [], []
    if len(q):
        k = np.arange(len(q))
        opening = (k & 1) == 0
        prev = np.where(q > 0, b[np.maximum(q - 1, 0)], _NL)
        nxt = np.where(q + 1 < n, b[np.minimum(q + 1, n - 1)], _NL)
        seps = np.array([ord(delim), _NL, _CR, _QUOTE])
        bad_open = opening & ~np.isin(prev, seps)
        bad_close = ~opening & ~np.isin(nxt, seps)
        if bad_open.any():
            bad_at.append(int(q[np.argmax(bad_open)]))
            bad_what.append('a double quote (") inside an unquoted field (quote the whole '
                            'field and write the inner quote twice)')
        if bad_close.any():
            bad_at.append(int(q[np.argmax(bad_close)]))
            bad_what.append("text after the closing quote of a quoted field")
        if len(q) % 2:
            bad_at.append(int(q[-1]))
            bad_what.append('a quoted field starts here and is never closed (unbalanced ")')
    cr = np.flatnonzero(b == _CR)
    if len(cr):
        bare = cr[(cr + 1 >= n) | (b[np.minimum(cr + 1, n - 1)] != _NL)]
        if len(q):
            bare = bare[(np.searchsorted(q, bare) & 1) == 0]
        if len(bare):
            bad_at.append(int(bare[0]))
            bad_what.append("a carriage return (\\r) not followed by a line feed: bare-CR line "
                            "ends are not read (convert the file to \\n or \\r\\n line ends)")
    nfields = np.searchsorted(d, content_end) - np.searchsorted(d, starts) + 1
    rec = np.flatnonzero(nonempty)
    problem = None
    if bad_at:
        j = int(np.argmin(bad_at))
        pos = bad_at[j]
        r_all = int(np.searchsorted(starts, pos, side="right")) - 1
        r = int(np.searchsorted(rec, r_all))
        col = int(np.searchsorted(d, pos) - np.searchsorted(d, starts[r_all]))
        problem = (r, pos, col, bad_what[j])
        rec = np.concatenate([rec[:r], [r_all]]).astype(np.int64)  # records up to the problem
    return _Layout(starts[rec], np.searchsorted(nl, starts[rec]), nfields[rec], problem)


class CsvReader:
    """Iterate the needed columns of one delimited file, converted and checked.

    ``kinds`` maps column name -> converter kind (:data:`~.convert.KINDS`).  Iterating yields
    ``(first_row, {column: values})`` per piece (``first_row`` 0-based: rows before the piece).
    """

    def __init__(self, header: CsvHeader, kinds: Mapping[str, str],
                 block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if block_size < 1:
            raise ValueError(f"block_size: must be >= 1 byte, got {block_size}")
        header.require(list(kinds))
        for c in kinds:
            if header.columns.count(c) > 1:
                raise DataError(header.path, 0, c, "the header names this column more than once")
        self.header, self.kinds, self.block_size = header, dict(kinds), block_size
        self.path = header.path
        self._ncols = len(header.columns)
        # pyarrow gets unique names (later duplicates of unused columns renamed)
        seen: Dict[str, int] = {}
        names: List[str] = []
        for c in header.columns:
            names.append(c if c not in seen else f"{c}\x00{seen[c]}")
            seen[c] = seen.get(c, 0) + 1
        self._names = names
        self._order = {c: header.columns.index(c) for c in kinds}
        # typed parses to try, in order: ids/flags/times int64; then times as doubles (decimal
        # seconds); past them (mode len(_typed)) every piece is cell-checked
        fast = {c: _FAST_TYPES[k] for c, k in self.kinds.items()}
        self._typed = [fast]
        if any(k.startswith("time_") for k in self.kinds.values()):
            self._typed.append({c: pa.float64() if k.startswith("time_") else t
                                for (c, t), k in zip(fast.items(), self.kinds.values())})
        self._mode = 0
        self.rows = 0

    # -- the stream --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Tuple[int, Dict[str, Converted]]]:
        self.rows, self.offset = 0, self.header.nbytes
        for piece, final_newline in self._pieces():
            out, n = self._convert_piece(piece, self.offset, final_newline)
            if n:
                yield self.rows, out
            self.rows += n
            self.offset += len(piece)

    def _line_at(self, offset: int) -> int:
        """File line of the byte at ``offset`` of the (decompressed) stream.  Counted only when
        an error is raised, by reading the file again up to there: the fast path never counts."""
        n, left = 0, offset
        with _open(self.path) as stream:
            while left > 0:
                buf = _read(stream, self.path, min(left, 1 << 24))
                if not buf:
                    break
                n += buf.count(b"\n")
                left -= len(buf)
        return n + 1

    def _pieces(self) -> Iterator[Tuple[bytes, bool]]:
        limit = max(MAX_RECORD_BYTES, 4 * self.block_size)
        with _open(self.path) as stream:
            _read(stream, self.path, self.header.nbytes)
            rest = b""
            while True:
                buf = _read(stream, self.path, self.block_size)
                data = rest + buf if rest else buf
                if not buf:
                    if data:
                        ends = data.endswith(b"\n")
                        yield (data if ends else data + b"\n"), ends
                    return
                cut = _last_record_end(data) + 1
                if cut == 0:
                    if len(data) > limit:
                        self._too_long(data)
                    rest = data
                    continue
                rest = data[cut:]
                yield data[:cut], True

    def _too_long(self, data: bytes) -> None:
        lay = _layout(data[: MAX_RECORD_BYTES] + b"\n", self.header.delimiter)
        raise DataError(self.path, self.rows + 1, None,
                        f"a record longer than {MAX_RECORD_BYTES >> 20} MiB (an unclosed "
                        "quote?)" + (f": {lay.problem[3]}" if lay.problem else ""),
                        line=self._line_at(self.offset))

    # -- one piece ---------------------------------------------------------------------------
    def _parse(self, piece: bytes, types: Mapping[str, pa.DataType]) -> pa.Table:
        return pcsv.read_csv(
            pa.py_buffer(piece),
            read_options=pcsv.ReadOptions(column_names=self._names),
            parse_options=pcsv.ParseOptions(delimiter=self.header.delimiter, quote_char='"',
                                            double_quote=True, escape_char=False,
                                            newlines_in_values=b'"' in piece,
                                            ignore_empty_lines=True),
            convert_options=pcsv.ConvertOptions(include_columns=list(self.kinds),
                                                column_types=dict(types), null_values=[""],
                                                strings_can_be_null=False,
                                                quoted_strings_can_be_null=False))

    def _convert_piece(self, piece: bytes, offset: int, final_newline: bool
                       ) -> Tuple[Dict[str, Converted], int]:
        """Values of one piece starting at byte ``offset``, and its number of rows."""
        layout = None
        if b'"' in piece or (b"\r" in piece and piece.count(b"\r") != piece.count(b"\r\n")):
            layout = _layout(piece, self.header.delimiter)
            if layout.problem is not None:
                return self._slow_piece(piece, offset, final_newline, layout)
        hex_like = (b"x" in piece or b"X" in piece) and (b"0x" in piece or b"0X" in piece)
        if not hex_like:  # pyarrow's int64 parser reads hexadecimal
            for mode in range(self._mode, len(self._typed)):
                got = self._typed_piece(piece, self._typed[mode])
                if got is not None:
                    self._mode = mode
                    return got
        got = self._slow_piece(piece, offset, final_newline, layout)
        self._mode = len(self._typed)  # this file needs the cell-checked path: keep it
        return got

    def _typed_piece(self, piece: bytes, types: Mapping[str, pa.DataType]
                     ) -> Optional[Tuple[Dict[str, Converted], int]]:
        """The piece parsed with typed columns, or None if that fails anywhere (the slow path
        then finds and names the problem, quoting the cell's own text)."""
        try:
            table = self._parse(piece, types)
        except pa.ArrowInvalid:
            return None
        if any(table.column(c).null_count for c in self.kinds):
            return None
        out, bad = convert_columns(table, self.kinds, self._order)
        if bad is not None:
            return None
        for c, t in types.items():  # decimals parsed as doubles: exact only below 2^53
            if t == pa.float64() and not (np.abs(out[c]) < 2 ** 53).all():  # type: ignore[arg-type]
                return None
        return out, table.num_rows

    def _raise_value(self, bad: Tuple[int, int, str, str], offset: int, layout: _Layout) -> None:
        i, _, c, problem = bad
        raise DataError(self.path, self.rows + i + 1, c, problem,
                        line=self._line_at(offset) + int(layout.lines[i]))

    def _slow_piece(self, piece: bytes, offset: int, final_newline: bool,
                    layout: Optional[_Layout]) -> Tuple[Dict[str, Converted], int]:
        """Parse as raw bytes, check every cell; raise the first problem in file order."""
        layout = layout or _layout(piece, self.header.delimiter)
        n = len(layout.starts)
        struct = None  # (record index, column, problem)
        if layout.problem is not None:
            r, _, ci, what = layout.problem
            struct = (r, self.header.columns[ci] if ci < self._ncols else None, what)
        wrong = np.flatnonzero(layout.nfields[: struct[0] if struct else n] != self._ncols)
        if len(wrong):
            r = int(wrong[0])
            nf = int(layout.nfields[r])
            what = f"{nf} field{'s' if nf != 1 else ''}, but the header has {self._ncols} columns"
            col = None
            if nf < self._ncols:
                col = self.header.columns[nf]
                what += f" (this row has no {col!r} or later)"
                if not final_newline and r == n - 1:
                    what += "; the file ends without a line end: is it truncated?"
            struct = (r, col, what)
        good = struct[0] if struct else n
        out: Dict[str, Converted] = {}
        if good:
            prefix = piece if good == n else piece[: int(layout.starts[good])]
            try:
                table = self._parse(prefix, {c: pa.binary() for c in self.kinds})
            except pa.ArrowInvalid as e:  # our record split disagrees with pyarrow's
                line = self._line_at(offset)
                last_line = line + prefix.count(b"\n")
                raise DataError(self.path, self.rows + 1, None,
                                f"rows {self.rows + 1}-{self.rows + good} (file lines {line}-"
                                f"{last_line}) cannot be parsed: {e}") from e
            if table.num_rows != good:
                line = self._line_at(offset)
                last_line = line + prefix.count(b"\n")
                raise DataError(self.path, self.rows + 1, None,
                                f"pyarrow found {table.num_rows} rows where {good} records "
                                f"start (file lines {line}-{last_line})")
            out, bad = convert_columns(table, self.kinds, self._order)
            if bad is not None:
                self._raise_value(bad, offset, layout)
        if struct is not None:
            r, col, what = struct
            raise DataError(self.path, self.rows + r + 1, col, what,
                            line=self._line_at(offset) + int(layout.lines[r]))
        return out, n


def iter_csv(path: str, kinds: Mapping[str, str], sep: Optional[str] = None,
             block_size: int = DEFAULT_BLOCK_SIZE) -> Iterator[Tuple[int, Dict[str, Converted]]]:
    """Stream the ``kinds`` columns of a delimited file: ``(first_row, {column: values})``."""
    yield from CsvReader(read_header(path, sep), kinds, block_size)
