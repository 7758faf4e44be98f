"""Any sequential data set: a user / item / timestamp table (CSV, TSV or Parquet) -> Sequences.

    spec = TableSpec(files=["events.csv"])                 # user_id, item_id, timestamp (s)
    seqs = load_table_sequences(spec, cache_root="data_cache/tables", min_len=3)

The files are streamed (CSV / TSV in newline-aligned pieces, Parquet batch by batch), validated
cell by cell (:mod:`.convert`; errors are :class:`~.errors.DataError` naming file, row, file line
and column) and preprocessed with the same bucketed, bounded-memory, cached machinery as KuaiRand
(:func:`~.preprocess.build_cache`).  docs/datasets.md documents the format.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Literal, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .csv_stream import COMPRESSED, DEFAULT_BLOCK_SIZE, CsvHeader, CsvReader, check_file, read_header
from .errors import DataError
from .parquet_stream import DEFAULT_BATCH_ROWS, check_parquet_columns, iter_parquet, open_parquet
from .preprocess import EventChunk, EventLog, Sequences, build_cache, cache_key, expand_paths
from ..options import Key, OptionError, check_choice, choices, prefixed
from .schema import PositiveRule

TableFormat = Literal["csv", "tsv", "parquet"]
FORMATS = choices(TableFormat)
TimeUnit = Literal["s", "ms"]
TIME_UNITS = choices(TimeUnit)
IdType = Literal["auto", "int", "str"]
ID_TYPES = choices(IdType)
_EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet",
               ".pq": "parquet", ".parq": "parquet"}
_AUTO_INT = re.compile(r"^[+-]?(0|[1-9][0-9]*)(\.0*)?$")  # no leading zero: "007" is text


@dataclass
class TableOptions:
    """How to read a table of interactions (the trainer's ``data`` section embeds these fields).

    user_col / item_col / time_col: column names (defaults ``user_id``, ``item_id``,
    ``timestamp``).  time_unit: ``"s"`` or ``"ms"`` for numeric times (integers exact, decimals
    rounded to the nearest ms; Parquet timestamp / date columns carry their own unit).
    sep: the delimiter of CSV / TSV files (one character); None: tab for ``tsv``, else tab if the
    header line has one, else comma.  format: ``"csv"`` | ``"tsv"`` | ``"parquet"``, or None to
    tell each file's format by its extension (``.csv``, ``.tsv`` / ``.tab``, ``.parquet`` /
    ``.pq``, optionally compressed ``.gz`` / ``.bz2`` / ``.zst`` / ``.lz4`` for text).
    action_cols: up to 8 columns of 0/1 values, column ``action_cols[i]`` = bit ``1 << i`` of the
    action byte (for ranking: the label columns).  positive: which rows are positives,
    ``{"any_of": [...], "none_of": [...]}`` over ``action_cols`` (or a :class:`PositiveRule`
    with those ``action_names``); None: every row.  id_type: ``"int"`` (ids are integers),
    ``"str"`` (ids are text, e.g. Amazon ASINs, mapped to dense indices through a cached
    vocabulary), or ``"auto"``: per id column, by the Parquet column type, or for CSV / TSV by
    the first data row's value (an integer without a leading zero: integer ids; anything else:
    text).  context_cols: integer columns kept with each event (what was known when it happened,
    e.g. the page it was shown on; ranking reads them as candidate features).
    """

    user_col: str = "user_id"
    item_col: str = "item_id"
    time_col: str = "timestamp"
    time_unit: TimeUnit = "s"
    sep: Optional[str] = None
    format: Optional[TableFormat] = None
    action_cols: List[str] = field(default_factory=list)
    positive: Optional[Dict[str, List[str]]] = None
    id_type: IdType = "auto"
    context_cols: List[str] = field(default_factory=list)

    def check_options(self, key: Key = prefixed("TableSpec")) -> Optional[PositiveRule]:
        """Every rule of the options (:class:`OptionError` naming the key); returns the
        positive rule as a :class:`PositiveRule` (None: every row is positive)."""
        for name in ("user_col", "item_col", "time_col"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v:
                raise OptionError(key(name), f"expected a column name, got {v!r}")
        check_choice(key("time_unit"), self.time_unit, TimeUnit)
        if self.format is not None:
            check_choice(key("format"), self.format, TableFormat)
        if self.sep is not None:
            if not isinstance(self.sep, str) or len(self.sep) != 1 or self.sep in '"\r\n':
                raise OptionError(key("sep"), f"expected one character other than a quote or a "
                                              f"line break, or None (auto-detect), got {self.sep!r}")
            if self.format == "parquet":
                raise OptionError(key("sep"), "Parquet files have no separator")
        check_choice(key("id_type"), self.id_type, IdType)
        acts = self.action_cols
        for name in ("action_cols", "context_cols"):
            cols = getattr(self, name)
            if isinstance(cols, str) or not all(isinstance(a, str) and a for a in cols):
                raise OptionError(key(name), f"expected a list of column names, got {cols!r}")
        if len(acts) > 8:
            raise OptionError(key("action_cols"), f"at most 8 (one byte of action bits), got "
                                                  f"{len(acts)}")
        cols = [self.user_col, self.item_col, self.time_col, *acts, *self.context_cols]
        dup = sorted({c for c in cols if cols.count(c) > 1})
        if dup:
            raise OptionError(key(""), f"column(s) {dup} named twice (user_col, item_col, "
                                       "time_col, action_cols and context_cols must be distinct)")
        return _rule(self.positive, tuple(acts), key)



@dataclass(init=False)
class TableSpec(TableOptions):
    """Where a table of interactions is (``files``) and how to read it (:class:`TableOptions`).

    files: paths or glob patterns (sorted expansion), read in order; a single path is accepted.
    Construction checks every option (``ValueError`` ``"TableSpec.<field>: <rule>"``) and
    stores ``positive`` as a :class:`PositiveRule` (or None)."""

    files: Tuple[str, ...] = ()

    def __init__(self, files: Union[str, os.PathLike, Sequence[str]], **options: Any) -> None:
        super().__init__(**options)
        if isinstance(files, (str, os.PathLike)):
            files = [files]
        if not isinstance(files, (list, tuple)) or not files:
            raise OptionError("TableSpec.files", f"expected a non-empty list of paths, got {files!r}")
        for f in files:
            if not isinstance(f, (str, os.PathLike)) or not str(f):
                raise OptionError("TableSpec.files", f"{f!r} is not a path")
        self.files = tuple(os.fspath(f) for f in files)
        self.positive = self.check_options()  # type: ignore[assignment]
        self.action_cols = tuple(self.action_cols)  # type: ignore[assignment]
        self.context_cols = tuple(self.context_cols)  # type: ignore[assignment]

    @property
    def kinds(self) -> Dict[str, str]:
        """Column -> converter kind, ids as ``text`` (checked per file once resolved)."""
        k = {self.user_col: "text", self.item_col: "text", self.time_col: f"time_{self.time_unit}"}
        k.update({a: "flag" for a in self.action_cols})
        k.update({c: "int" for c in self.context_cols})
        return k


def _rule(positive: Any, acts: Tuple[str, ...], key: Key) -> Optional[PositiveRule]:
    if positive is None:
        return None
    if not acts:
        raise OptionError(key("positive"), f"a positive rule needs {key('action_cols')}")
    try:
        if isinstance(positive, PositiveRule):
            if positive.action_names and positive.action_names != acts:
                raise ValueError(f"action_names {list(positive.action_names)} differ from "
                                 f"action_cols {list(acts)}")
            return PositiveRule(positive.any_of, positive.none_of, acts)
        return PositiveRule.from_config(positive, acts)
    except ValueError as e:
        raise OptionError(key("positive"), str(e)) from None


def file_format(path: str, fmt: Optional[str]) -> str:
    """``fmt``, or the format told by ``path``'s extension (DataError if it tells none)."""
    if fmt is not None:
        return fmt
    name = path.lower()
    for c in COMPRESSED:
        if name.endswith(c):
            name = name[: -len(c)]
            break
    ext = os.path.splitext(name)[1]
    found = _EXTENSIONS.get(ext)
    if found is None or (found == "parquet" and name != path.lower()):
        raise DataError(path, 0, None, f"cannot tell the format from the extension {ext!r} "
                                       f"(known: {', '.join(sorted(_EXTENSIONS))}); set format "
                                       f"to one of {list(FORMATS)}")
    return found


class _Vocab:
    """Text ids -> codes in first-appearance order (memory ~ distinct ids)."""

    def __init__(self) -> None:
        self._code: Dict[str, int] = {}
        self._texts: List[str] = []

    def codes(self, text: pa.Array) -> np.ndarray:
        enc = pc.dictionary_encode(text)
        distinct = enc.dictionary.to_pylist()  # first-appearance order within the chunk
        get = self._code.get
        per = np.array([get(s, -1) for s in distinct], dtype=np.int64)
        for j in np.flatnonzero(per < 0):  # texts not seen before, in order
            s = distinct[j]
            per[j] = self._code[s] = len(self._texts)
            self._texts.append(s)
        return per[enc.indices.to_numpy(zero_copy_only=False)]

    def array(self) -> pa.Array:
        return pa.array(self._texts, pa.large_string())


@dataclass
class _File:
    path: str
    format: str
    header: Optional[CsvHeader]  # CSV / TSV only


class TableSource:
    """A :class:`TableSpec`'s files, checked up front, as a :class:`~.preprocess.EventSource`.

    Construction checks every file (exists, readable, format, the named columns present, Parquet
    column types) and resolves ``id_type="auto"``, before any row is converted."""

    def __init__(self, spec: TableSpec, block_size: int = DEFAULT_BLOCK_SIZE,
                 batch_rows: int = DEFAULT_BATCH_ROWS) -> None:
        if block_size < 1:
            raise ValueError(f"block_size: must be >= 1 byte, got {block_size}")
        if batch_rows < 1:
            raise ValueError(f"batch_rows: must be >= 1, got {batch_rows}")
        self.spec, self.block_size, self.batch_rows = spec, block_size, batch_rows
        self.files = expand_paths(spec.files)
        self._files = [self._inspect(p) for p in self.files]
        self.id_types = self._resolve_id_types((spec.user_col, spec.item_col))
        self.kinds = dict(spec.kinds)
        for c, t in self.id_types.items():
            self.kinds[c] = "int" if t == "int" else "text"
        for f in self._files:
            if f.format == "parquet":
                check_parquet_columns(f.path, open_parquet(f.path), self.kinds)
        self._vocabs = {c: _Vocab() for c, t in self.id_types.items() if t == "str"}
        self.context = tuple(spec.context_cols)
        self.meta: Dict[str, Any] = {
            "source": "table", "action_names": list(spec.action_cols),
            "id_types": {"user": self.id_types[spec.user_col], "item": self.id_types[spec.item_col]},
            "columns": {"user": spec.user_col, "item": spec.item_col, "time": spec.time_col},
            "time_unit": spec.time_unit}

    def _inspect(self, path: str) -> _File:
        fmt = file_format(path, self.spec.format)
        check_file(path)
        needed = list(self.spec.kinds)
        if fmt == "parquet":
            names = open_parquet(path).schema_arrow.names
            for c in needed:
                if c not in names:
                    raise DataError(path, 0, c, f"missing column; the file's columns are: "
                                                f"{', '.join(names)}")
            return _File(path, fmt, None)
        sep = self.spec.sep if self.spec.sep is not None else ("\t" if fmt == "tsv" else None)
        header = read_header(path, sep)
        header.require(needed)
        return _File(path, fmt, header)

    def _resolve_id_types(self, columns: Sequence[str]) -> Dict[str, str]:
        """Each id column's type: ``spec.id_type``, or for "auto" the first file with rows
        decides (Parquet: the column type; CSV / TSV: the first data row's value)."""
        if self.spec.id_type != "auto":
            return {c: self.spec.id_type for c in columns}
        for f in self._files:
            if f.format == "parquet":
                schema = open_parquet(f.path).schema_arrow
                out = {}
                for c in columns:
                    t = schema.field(c).type
                    t = t.value_type if pa.types.is_dictionary(t) else t
                    out[c] = "int" if pa.types.is_integer(t) or pa.types.is_floating(t) else "str"
                return out
            rows = iter(CsvReader(f.header, {c: "raw" for c in columns},
                                  min(self.block_size, 1 << 16)))
            try:
                _, arr = next(rows)
            except StopIteration:
                continue  # no data rows in this file
            finally:
                rows.close()  # type: ignore[attr-defined]
            first = {c: pc.utf8_trim(arr[c], characters=" \t")[0].as_py() for c in columns}
            return {c: "int" if _AUTO_INT.match(v) else "str" for c, v in first.items()}
        return {c: "int" for c in columns}  # no data rows anywhere: reported later

    def options(self) -> str:
        """What, beyond the files, decides the cache's content."""
        s = self.spec
        return json.dumps({"formats": [f.format for f in self._files],
                           "delimiters": [f.header.delimiter if f.header else None
                                          for f in self._files],
                           "kinds": self.kinds, "action_cols": list(s.action_cols),
                           "context_cols": list(s.context_cols)},
                          sort_keys=True)

    def _iter_file(self, f: _File) -> Iterator[Tuple[int, Dict[str, Any]]]:
        if f.format == "parquet":
            return iter_parquet(f.path, self.kinds, self.batch_rows)
        return iter(CsvReader(f.header, self.kinds, self.block_size))  # type: ignore[arg-type]

    def chunks(self) -> Iterator[Tuple[str, EventChunk]]:
        s = self.spec
        for f in self._files:
            it = self._iter_file(f)
            while True:
                try:
                    _, arr = next(it)
                except StopIteration:
                    break
                except DataError as e:
                    raise self._with_hint(e) from None
                keys = {}
                for role, c in (("user", s.user_col), ("item", s.item_col)):
                    v = self._vocabs.get(c)
                    keys[role] = v.codes(arr[c]) if v is not None else arr[c]
                actions = np.zeros(len(keys["user"]), dtype=np.uint8)
                for i, a in enumerate(s.action_cols):
                    actions |= arr[a] << np.uint8(i)
                yield f.path, {"user": keys["user"], "item": keys["item"],
                               "time_ms": arr[s.time_col], "actions": actions,
                               **{c: arr[c] for c in s.context_cols}}

    def _with_hint(self, e: DataError) -> DataError:
        if self.spec.id_type == "auto" and self.id_types.get(e.column) == "int" and \
                e.problem.startswith("value "):
            return DataError(e.path, e.row, e.column,
                             e.problem + " (id_type='auto' read this column as integer ids from "
                             "its first value; set id_type='str' for text ids)", e.line)
        return e

    def vocab(self, which: str) -> Optional[pa.Array]:
        c = self.spec.user_col if which == "user" else self.spec.item_col
        v = self._vocabs.get(c)
        return v.array() if v is not None else None


def preprocess_table(spec: TableSpec, cache_root: str, num_buckets: int = 32,
                     block_size: int = DEFAULT_BLOCK_SIZE, batch_rows: int = DEFAULT_BATCH_ROWS,
                     force: bool = False, progress: bool = False) -> str:
    """Check the files, then build (or reuse) the cache for ``spec``; returns its folder."""
    if not isinstance(spec, TableSpec):
        raise ValueError(f"spec: expected a TableSpec, got {type(spec).__name__}")
    if num_buckets < 1:
        raise ValueError(f"num_buckets: must be >= 1, got {num_buckets}")
    source = TableSource(spec, block_size, batch_rows)
    out_dir = os.path.join(cache_root, f"table-{cache_key(source.files, source.options())}")
    if os.path.isfile(os.path.join(out_dir, "meta.json")) and not force:
        return out_dir
    return build_cache(source, out_dir, num_buckets, progress)


def load_table_sequences(spec: TableSpec, cache_root: str, min_len: int = 3,
                         progress: bool = False, **kw: Any) -> Sequences:
    """Preprocess (cached) and return the positive sequences (``spec.positive``; None: every
    row) of users with at least ``min_len`` of them.  ``kw``: :func:`preprocess_table`'s."""
    if not isinstance(min_len, int) or min_len < 2:
        raise ValueError(f"min_len: must be an integer >= 2 (one history item and one target), "
                         f"got {min_len!r}")
    cache = preprocess_table(spec, cache_root, progress=progress, **kw)
    return EventLog.load(cache).positive_sequences(spec.positive, min_len)  # type: ignore[arg-type]
