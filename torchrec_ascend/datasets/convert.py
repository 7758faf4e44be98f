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
from typing import Dict, Mapping, Optional, Tuple, Union

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
                return Bad(i, f"bytes {v!r} are not valid UTF-8")
        raise  # pyarrow refused a column that Python decodes: not a data error we can name


def _non_empty(text: pa.Array) -> Union[pa.Array, Bad]:
    empty = pc.equal(pc.utf8_length(text), 0)
    if pc.any(empty).as_py():
        return Bad(_first(empty), "empty value, expected an id")
    return text


def _bad_value(kind: str, shown: object) -> str:
    return f"value {shown!r}, expected {_EXPECT[kind]}"


def _from_text(text: pa.Array, kind: str) -> Union[np.ndarray, Bad]:
    s = pc.utf8_trim(text, characters=" \t")
    is_int = pc.match_substring_regex(s, _INT_TEXT).to_numpy(zero_copy_only=False)
    if kind in ("time_s", "time_ms"):
        is_num = pc.match_substring_regex(s, _NUM_TEXT).to_numpy(zero_copy_only=False)
    else:
        is_num = is_int
    if not is_num.all():
        i = _first(~is_num)
        v = s[i].as_py()
        return Bad(i, f"empty value, expected {_EXPECT[kind]}" if v == "" else
                   _bad_value(kind, text[i].as_py()))
    ints = _text_ints(s, is_int, text, kind)
    if isinstance(ints, Bad):
        return ints
    if is_int.all():
        return _from_int_values(ints, kind, text)
    # times given as decimals: exact integers where they are integers, rounded elsewhere
    floats = pc.cast(pc.if_else(pa.array(is_int), "0", s), pa.float64()).to_numpy()
    out = _from_float(floats, kind, shown=text)
    if isinstance(out, Bad):
        return out
    exact = _from_int_values(ints, kind, text)
    if isinstance(exact, Bad):
        return exact
    return np.where(is_int, exact, out)


def _text_ints(s: pa.Array, is_int: np.ndarray, text: pa.Array, kind: str
               ) -> Union[np.ndarray, Bad]:
    """int64 of the integer-looking texts (0 elsewhere); Bad if one is outside int64."""
    clean = pc.replace_substring_regex(s, r"\.0*$", "")
    clean = pc.replace_substring_regex(clean, r"^\+", "")
    clean = pc.if_else(pa.array(is_int), clean, "0")
    digits = pc.utf8_length(pc.replace_substring_regex(clean, r"^-", "")).to_numpy()
    long = np.flatnonzero(digits >= 19)
    if len(long):
        for i in long:
            if abs(int(clean[int(i)].as_py())) > _INT64_MAX:
                return Bad(int(i), f"value {text[int(i)].as_py()!r}, expected "
                                   f"{_EXPECT[kind]} in the int64 range")
    return pc.cast(clean, pa.int64()).to_numpy()


def _from_int(arr: pa.Array, kind: str) -> Union[np.ndarray, Bad]:
    if arr.type == pa.uint64():
        v = arr.to_numpy()
        big = v > _INT64_MAX
        if big.any():
            i = _first(big)
            return Bad(i, f"value {str(int(v[i]))!r}, expected {_EXPECT[kind]} in the int64 range")
    return _from_int_values(arr.to_numpy(zero_copy_only=False).astype(np.int64), kind, None)


def _from_int_values(v: np.ndarray, kind: str, shown: Optional[pa.Array]
                     ) -> Union[np.ndarray, Bad]:
    show = (lambda i: shown[i].as_py()) if shown is not None else (lambda i: str(int(v[i])))
    if kind == "nonneg_int":
        bad = v < 0
        if bad.any():
            i = _first(bad)
            return Bad(i, _bad_value(kind, show(i)))
    if kind == "flag":
        bad = (v != 0) & (v != 1)
        if bad.any():
            i = _first(bad)
            return Bad(i, _bad_value(kind, show(i)))
        return v.astype(np.uint8)
    if kind == "time_s":
        bad = np.abs(v) > _INT64_MAX // 1000
        if bad.any():
            i = _first(bad)
            return Bad(i, f"value {show(i)!r}, expected seconds that fit int64 as milliseconds")
        return v * 1000
    return v


def _from_float(f: np.ndarray, kind: str, shown: Optional[pa.Array] = None
                ) -> Union[np.ndarray, Bad]:
    show = (lambda i: shown[i].as_py()) if shown is not None else (lambda i: str(float(f[i])))
    bad = ~np.isfinite(f)
    if kind in ("time_s", "time_ms"):
        ms = np.rint(f * (1000.0 if kind == "time_s" else 1.0))
        bad |= ~(np.abs(ms) < 2.0 ** 63)
        if bad.any():
            i = _first(bad)
            return Bad(i, f"value {show(i)!r}, expected {_EXPECT[kind]} that fits int64 "
                          "milliseconds")
        return ms.astype(np.int64)
    with np.errstate(invalid="ignore"):
        bad |= np.floor(f) != f
        if bad.any():
            i = _first(bad)
            return Bad(i, _bad_value(kind, show(i)))
        big = ~(np.abs(f) < 2.0 ** 63)
    if big.any():
        i = _first(big)
        return Bad(i, f"value {show(i)!r}, expected {_EXPECT[kind]} in the int64 range")
    return _from_int_values(f.astype(np.int64), kind, shown)


def _from_temporal(arr: pa.Array) -> Union[np.ndarray, Bad]:
    t = arr.type
    if pa.types.is_date32(t):
        return arr.cast(pa.int32()).to_numpy().astype(np.int64) * 86_400_000
    v = arr.cast(pa.int64()).to_numpy()
    if pa.types.is_date64(t):
        return v
    unit = t.unit
    if unit == "s":
        bad = np.abs(v) > _INT64_MAX // 1000
        if bad.any():
            i = _first(bad)
            return Bad(i, f"timestamp {arr[i]} does not fit int64 milliseconds")
        return v * 1000
    if unit == "ms":
        return v
    return np.floor_divide(v, 1000 if unit == "us" else 1_000_000)
