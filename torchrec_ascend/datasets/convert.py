"""Column converters: one pyarrow array (any source: CSV text, Parquet typed) -> a checked value.

Every reader sends each column it needs through :func:`convert` with the column's *kind*:

=========== =========================================================================== ==========
kind        accepts                                                                     gives
=========== =========================================================================== ==========
``int``     integers; integral decimals (``"3892024.0"``, ``7.0``) as that integer;     int64
            text ``[+-]digits[.000]`` (spaces around allowed); int64 range only
``nonneg_`` the same, >= 0 (KuaiRand's ids)                                             int64
``int``
``text``    any non-empty text (UTF-8), integers as their decimal text                  pa string
``raw``     any text (UTF-8), empty allowed (feature files)                             pa string
``flag``    0 / 1 (integers, integral decimals, booleans)                               uint8
``time_s``  numbers of seconds (integers exact, decimals rounded to the nearest ms);    int64 ms
            timestamp / date types (their own unit)
``time_ms`` the same in milliseconds                                                    int64 ms
=========== =========================================================================== ==========

A value outside these rules is reported as :class:`Bad` (the index of the *first* bad element
and the problem), never converted approximately: ``12.5`` is not an id, ``1e3`` is not an id
(exponents are accepted only for times), NaN / infinity / empty / invalid UTF-8 are errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

KINDS = ("int", "nonneg_int", "text", "raw", "flag", "time_s", "time_ms")
_INT64_MAX = np.iinfo(np.int64).max
_INT_TEXT = r"^[+-]?[0-9]+(\.0*)?$"  # after trimming spaces/tabs
_NUM_TEXT = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"
_EXPECT = {"int": "an integer", "nonneg_int": "a non-negative integer", "raw": "text",
           "flag": "0 or 1", "time_s": "a number (seconds)",
           "time_ms": "a number (milliseconds)", "text": "an id"}

Converted = Union[np.ndarray, pa.Array]


@dataclass(frozen=True)
class Bad:
    """The first bad element of a column: its index in the array and what is wrong."""

    index: int
    problem: str


def type_problem(t: pa.DataType, kind: str) -> Optional[str]:
    """Why a column of arrow type ``t`` can never hold values of ``kind`` (None: it can)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    textual = pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
        or pa.types.is_large_binary(t)
    ok = textual or pa.types.is_null(t)
    if kind in ("int", "nonneg_int"):
        ok = ok or pa.types.is_integer(t) or pa.types.is_floating(t)
    elif kind in ("text", "raw"):
        ok = ok or pa.types.is_integer(t)
    elif kind == "flag":
        ok = ok or pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
    elif kind in ("time_s", "time_ms"):
        ok = ok or pa.types.is_integer(t) or pa.types.is_floating(t) or \
            pa.types.is_timestamp(t) or pa.types.is_date(t)
    else:
        raise ValueError(f"kind: {kind!r} is not one of {KINDS}")
    return None if ok else f"type {t} cannot be read as {_EXPECT[kind]}"


def convert(arr: pa.Array, kind: str) -> Union[Converted, Bad]:
    """Check and convert one column (see the module table); :class:`Bad` on the first bad value."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    problem = type_problem(arr.type, kind)
    if problem is not None:
        return Bad(0, problem)
    if kind == "raw":
        if not _is_text(arr.type):
            arr = pc.cast(arr, pa.string())
        if arr.null_count:
            empty = b"" if pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type) else ""
            arr = pc.fill_null(arr, pa.scalar(empty, arr.type))
    if arr.null_count:
        return Bad(_first(arr.is_null()), f"empty value, expected {_EXPECT[kind]}")
    t = arr.type
    if _is_text(t):
        text = _valid_text(arr)
        if isinstance(text, Bad) or kind == "raw":
            return text
        if kind == "text":
            return _non_empty(text)
        return _from_text(text, kind)
    if kind == "text":  # integer column read as text ids
        return pc.cast(arr, pa.string())
    if pa.types.is_boolean(t):  # only flags accept booleans (type_problem)
        return arr.to_numpy(zero_copy_only=False).astype(np.uint8)
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        return _from_temporal(arr)
    if pa.types.is_floating(t):
        return _from_float(arr.to_numpy(zero_copy_only=False).astype(np.float64), kind)
    return _from_int(arr, kind)


def convert_columns(table: Union[pa.Table, pa.RecordBatch], kinds: Mapping[str, str],
                    order: Mapping[str, int]
                    ) -> Tuple[Dict[str, Converted], Optional[Tuple[int, int, str, str]]]:
    """Convert every ``kinds`` column of ``table``; also the first bad cell in file order:
    ``(row index, column position in ``order``, column, problem)`` (None if all are good)."""
    out: Dict[str, Converted] = {}
    bads = []
    for c, kind in kinds.items():
        v = convert(table.column(c), kind)
        if isinstance(v, Bad):
            bads.append((v.index, order[c], c, v.problem))
        else:
            out[c] = v
    return out, (min(bads) if bads else None)


# -- helpers ---------------------------------------------------------------------------------------
def _first(mask: Union[pa.Array, np.ndarray]) -> int:
    if isinstance(mask, pa.Array):
        mask = pc.fill_null(mask, False).to_numpy(zero_copy_only=False)
    return int(np.flatnonzero(mask)[0])


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or \
        pa.types.is_large_binary(t)


def _valid_text(arr: pa.Array) -> Union[pa.Array, Bad]:
    """Binary -> string, naming the first element that is not UTF-8."""
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        return arr
    target = pa.large_string() if pa.types.is_large_binary(arr.type) else pa.string()
    try:
        return pc.cast(arr, target)
    except pa.ArrowInvalid:
        for i, v in enumerate(arr.to_pylist()):
            try:
                v.decode("utf-8")
            except UnicodeDecodeError:
                return Bad(i, f"bytes {_clip(v)!r} are not valid UTF-8")
        raise  # pyarrow refused a column that Python decodes: not a data error we can name


def _non_empty(text: pa.Array) -> Union[pa.Array, Bad]:
    empty = pc.equal(pc.utf8_length(text), 0)
    if pc.any(empty).as_py():
        return Bad(_first(empty), "empty value, expected an id")
    return text


def _clip(v: Union[str, bytes], n: int = 60) -> Union[str, bytes]:
    """A cell as quoted in a message: at most ``n`` characters (a huge field stays readable)."""
    if len(v) <= n:
        return v
    return v[: n - 3] + (b"..." if isinstance(v, bytes) else "...")  # type: ignore[operator]


def _bad_value(kind: str, shown: object) -> str:
    return f"value {shown!r}, expected {_EXPECT[kind]}"


Check = Tuple[np.ndarray, Callable[[int], str]]  # (bad mask, problem of element i)


def _earliest(checks: Sequence[Check]) -> Optional[Bad]:
    """The first element (lowest index) any check flags, with the first flagging check's text."""
    best: Optional[Tuple[int, int]] = None
    for k, (mask, _) in enumerate(checks):
        if mask.any():
            i = _first(mask)
            if best is None or i < best[0]:
                best = (i, k)
    if best is None:
        return None
    return Bad(best[0], checks[best[1]][1](best[0]))


def _shower(shown: Optional[pa.Array], values: np.ndarray) -> Callable[[int], str]:
    """How element i is quoted in a message: its text if there is one, else its value."""
    if shown is not None:
        return lambda i: _clip(shown[i].as_py())
    if values.dtype.kind == "f":
        return lambda i: str(float(values[i]))
    return lambda i: str(int(values[i]))


def _quick_text(text: pa.Array, kind: str) -> Optional[Union[np.ndarray, Bad]]:
    """The common clean columns through pyarrow's own casts (no regexes); None: take the full
    path.  The casts accept a subset of the rules with the same values, except hexadecimal
    integers and non-finite floats, which are sent to the full path."""
    if pc.any(pc.match_substring(text, "x", ignore_case=True)).as_py():
        return None
    try:
        v = pc.cast(text, pa.int64()).to_numpy()
    except pa.ArrowInvalid:
        v = None
    if v is not None:
        out, checks = _int_values(v, kind, _shower(text, v))
        bad = _earliest(checks)
        return bad if bad is not None else out
    if kind not in ("time_s", "time_ms"):
        return None
    try:
        f = pc.cast(text, pa.float64()).to_numpy()
    except pa.ArrowInvalid:
        return None
    with np.errstate(invalid="ignore", over="ignore"):
        ms = f * (1000.0 if kind == "time_s" else 1.0)
        exact = np.abs(ms) < 2.0 ** 53  # integers among decimals stay exact
    return np.rint(ms).astype(np.int64) if exact.all() else None


def _from_text(text: pa.Array, kind: str) -> Union[np.ndarray, Bad]:
    quick = _quick_text(text, kind)
    if quick is not None:
        return quick
    s = pc.utf8_trim(text, characters=" \t")
    is_int = pc.match_substring_regex(s, _INT_TEXT).to_numpy(zero_copy_only=False)
    if kind in ("time_s", "time_ms"):
        is_num = pc.match_substring_regex(s, _NUM_TEXT).to_numpy(zero_copy_only=False)
    else:
        is_num = is_int
    empty = pc.equal(pc.utf8_length(s), 0).to_numpy(zero_copy_only=False)
    show = _shower(text, is_int)
    checks: List[Check] = [
        (empty, lambda i: f"empty value, expected {_EXPECT[kind]}"),
        (~is_num, lambda i: _bad_value(kind, show(i)))]
    ints, overflow = _text_ints(s, is_int)
    checks.append((overflow, lambda i: f"value {show(i)!r}, expected {_EXPECT[kind]} in the "
                                       "int64 range"))
    out, more = _int_values(ints, kind, show)
    checks += more
    if not is_int.all():  # times given as decimals: rounded; integers stay exact
        floats = pc.cast(pc.if_else(pa.array(is_int | ~is_num), "0", s), pa.float64()).to_numpy()
        fout, more = _float_values(floats, kind, show)
        checks += more
        out = np.where(is_int, out, fout)
    bad = _earliest(checks)
    return bad if bad is not None else out


def _text_ints(s: pa.Array, is_int: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """int64 of the integer-looking texts (0 elsewhere), and which are outside int64."""
    clean = pc.replace_substring_regex(s, r"\.0*$", "")
    clean = pc.replace_substring_regex(clean, r"^\+", "")
    clean = pc.if_else(pa.array(is_int), clean, "0")
    digits = pc.utf8_length(pc.replace_substring_regex(clean, r"^-", "")).to_numpy()
    overflow = np.zeros(len(is_int), dtype=bool)
    for i in np.flatnonzero(digits >= 19):
        overflow[i] = not -_INT64_MAX - 1 <= int(clean[int(i)].as_py()) <= _INT64_MAX
    if overflow.any():
        clean = pc.if_else(pa.array(overflow), "0", clean)
    return pc.cast(clean, pa.int64()).to_numpy(), overflow


def _from_int(arr: pa.Array, kind: str) -> Union[np.ndarray, Bad]:
    raw = v = arr.to_numpy(zero_copy_only=False)
    checks: List[Check] = []
    if arr.type == pa.uint64():
        big = raw > _INT64_MAX  # the message quotes the file's value, not the zeroed one
        checks.append((big, lambda i: f"value {str(int(raw[i]))!r}, expected {_EXPECT[kind]} "
                                      "in the int64 range"))
        v = np.where(big, 0, raw)
    v = v.astype(np.int64)
    out, more = _int_values(v, kind, _shower(None, v))
    bad = _earliest(checks + more)
    return bad if bad is not None else out


def _int_values(v: np.ndarray, kind: str, show: Callable[[int], str]
                ) -> Tuple[np.ndarray, List[Check]]:
    """Integers -> the kind's values, and the checks that flag the bad ones."""
    if kind == "nonneg_int":
        return v, [(v < 0, lambda i: _bad_value(kind, show(i)))]
    if kind == "flag":
        return v.astype(np.uint8), [((v != 0) & (v != 1), lambda i: _bad_value(kind, show(i)))]
    if kind == "time_s":
        big = np.abs(v) > _INT64_MAX // 1000
        return np.where(big, 0, v) * 1000, [
            (big, lambda i: f"value {show(i)!r}, expected seconds that fit int64 as milliseconds")]
    return v, []


def _from_float(f: np.ndarray, kind: str) -> Union[np.ndarray, Bad]:
    out, checks = _float_values(f, kind, _shower(None, f))
    bad = _earliest(checks)
    return bad if bad is not None else out


def _float_values(f: np.ndarray, kind: str, show: Callable[[int], str]
                  ) -> Tuple[np.ndarray, List[Check]]:
    """Floats -> the kind's values (times rounded to ms; others must be integral)."""
    finite = np.isfinite(f)
    if kind in ("time_s", "time_ms"):
        with np.errstate(invalid="ignore", over="ignore"):
            ms = np.rint(f * (1000.0 if kind == "time_s" else 1.0))
            bad = ~(np.abs(ms) < 2.0 ** 63)
        return np.where(bad, 0, ms).astype(np.int64), [
            (bad, lambda i: f"value {show(i)!r}, expected {_EXPECT[kind]} that fits int64 "
                            "milliseconds")]
    with np.errstate(invalid="ignore"):
        frac = ~finite | (np.floor(f) != f)
        big = ~frac & ~(np.abs(f) < 2.0 ** 63)
    v = np.where(frac | big, 0, f).astype(np.int64)
    out, more = _int_values(v, kind, show)
    return out, [(frac, lambda i: _bad_value(kind, show(i))),
                 (big, lambda i: f"value {show(i)!r}, expected {_EXPECT[kind]} in the int64 "
                                 "range")] + more


def _from_temporal(arr: pa.Array) -> Union[np.ndarray, Bad]:
    t = arr.type
    if pa.types.is_date32(t):
        return arr.cast(pa.int32()).to_numpy().astype(np.int64) * 86_400_000
    v = arr.cast(pa.int64()).to_numpy()
    if pa.types.is_date64(t):
        return v
    unit = t.unit
    if unit == "s":
        bad = _earliest([(np.abs(v) > _INT64_MAX // 1000,
                          lambda i: f"timestamp {int(v[i])} s does not fit int64 milliseconds")])
        return bad if bad is not None else v * 1000
    if unit == "ms":
        return v
    return np.floor_divide(v, 1000 if unit == "us" else 1_000_000)
