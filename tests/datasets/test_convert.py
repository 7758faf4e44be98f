"""Column converters against plain-Python oracles (str methods, int(), float(), round)."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from torchrec_ascend.datasets.convert import Bad, convert, type_problem

I64 = 2 ** 63


def oracle_int(s):
    """The documented integer rule, written without regexes or pyarrow."""
    t = s.strip(" \t")
    sign = 1
    if t[:1] in ("+", "-"):
        sign, t = (-1 if t[0] == "-" else 1), t[1:]
    whole, dot, frac = t.partition(".")
    if not whole or not (whole.isascii() and whole.isdigit()) or frac.strip("0"):
        return None
    v = sign * int(whole)
    return v if -I64 <= v < I64 else None


def oracle_time_ms(s, per_unit):
    t = s.strip(" \t")
    v = oracle_int(t)
    if v is not None:
        v *= per_unit
        return v if -I64 < v < I64 and abs(v) <= (I64 - 1) // per_unit * per_unit else None
    if not t or set(t) - set("0123456789+-.eE") or not any(c.isdigit() for c in t.split("e")[0].split("E")[0]):
        return None
    try:
        f = float(t)
    except ValueError:
        return None
    ms = round(f * per_unit)  # Python rounds half to even, like numpy's rint
    return ms if math.isfinite(f) and abs(ms) < I64 else None


TEXT = st.text(alphabet="0123456789+-. eE\tx", max_size=12) | st.sampled_from([
    "9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
    "3892024.0", "12.5", "007", "5.", ".5", "1e3", "nan", "inf", "", " 4 ", "+8", "0x10",
    "00000000000000000000012", "9223372036854775.807e3"])


def _value(out, i=0):
    return None if isinstance(out, Bad) else int(out[i])


@given(st.lists(TEXT, min_size=1, max_size=6))
def test_int_rule_matches_oracle(cells):
    out = convert(pa.array(cells, pa.string()), "int")
    want = [oracle_int(c) for c in cells]
    if all(w is not None for w in want):
        assert isinstance(out, np.ndarray) and out.tolist() == want
    else:
        assert isinstance(out, Bad) and out.index == next(i for i, w in enumerate(want) if w is None)
        assert repr(cells[out.index]) in out.problem or "empty value" in out.problem


@given(st.lists(TEXT, min_size=1, max_size=6), st.sampled_from(["time_s", "time_ms"]))
def test_time_rule_matches_oracle(cells, kind):
    per = 1000 if kind == "time_s" else 1
    out = convert(pa.array(cells, pa.binary()), kind)
    want = [oracle_time_ms(c, per) for c in cells]
    if all(w is not None for w in want):
        assert isinstance(out, np.ndarray) and out.tolist() == want, (cells, out)
    else:
        assert isinstance(out, Bad), (cells, out)
        assert out.index == next(i for i, w in enumerate(want) if w is None), (cells, out)


def test_typed_sources_agree_with_text():
    ints = [0, -5, 3892024, I64 - 1, -I64]
    assert convert(pa.array(ints, pa.int64()), "int").tolist() == ints
    assert convert(pa.array([str(v) for v in ints]), "int").tolist() == ints
    assert convert(pa.array([1.0, -2.0, 3892024.0]), "int").tolist() == [1, -2, 3892024]
    assert convert(pa.array([2 ** 63 - 1], pa.uint64()), "int").tolist() == [I64 - 1]
    for arr, problem in [(pa.array([1.0, 12.5]), "'12.5'"), (pa.array([float("nan")]), "'nan'"),
                         (pa.array([2.0 ** 63]), "int64 range"), (pa.array([1, None]), "empty"),
                         (pa.array([0, 2 ** 63], pa.uint64()), "value '9223372036854775808', expected an integer in the int64 range"),
                         (pa.array([b"1", b"\xfe"]), "not valid UTF-8")]:
        out = convert(arr, "int")
        assert isinstance(out, Bad) and problem in out.problem, (arr, out)
    assert convert(pa.array([-1, 2]), "nonneg_int") == Bad(0, "value '-1', expected a non-negative integer")


def test_flags_and_text_ids():
    for arr in (pa.array([0, 1, 1]), pa.array([False, True, True]), pa.array([0.0, 1.0, 1.0]),
                pa.array(["0", " 1", "1.0"]), pa.array([0, 1, 1], pa.int8())):
        out = convert(arr, "flag")
        assert out.dtype == np.uint8 and out.tolist() == [0, 1, 1], arr
    assert convert(pa.array([0, 3]), "flag") == Bad(1, "value '3', expected 0 or 1")
    assert convert(pa.array(["1", "yes"]), "flag") == Bad(1, "value 'yes', expected 0 or 1")
    text = convert(pa.array(["B00X", "0012"]), "text")
    assert text.to_pylist() == ["B00X", "0012"]
    assert convert(pa.array([12, -3]), "text").to_pylist() == ["12", "-3"]
    assert convert(pa.array(["a", ""]), "text") == Bad(1, "empty value, expected an id")
    d = pa.array(["x", "y", "x"]).dictionary_encode()
    assert convert(d, "text").to_pylist() == ["x", "y", "x"]
    assert convert(pa.array(["", None]), "raw").to_pylist() == ["", ""]


def test_temporal_types():
    v = np.array([-1, 0, 1999, 10 ** 6], dtype=np.int64)
    want_floor = {"s": v * 1000, "ms": v, "us": np.floor_divide(v, 1000),
                  "ns": np.floor_divide(v, 10 ** 6)}
    for unit, want in want_floor.items():
        for kind in ("time_s", "time_ms"):  # the type's unit wins over time_unit
            got = convert(pa.array(v, pa.timestamp(unit, tz="Asia/Shanghai")), kind)
            assert got.tolist() == want.tolist(), unit
    assert convert(pa.array([1, 2], pa.date32()), "time_s").tolist() == [86400000, 172800000]
    assert convert(pa.array([5, 6], pa.date64()), "time_s").tolist() == [5, 6]
    assert isinstance(convert(pa.array([I64 // 10], pa.timestamp("s")), "time_s"), Bad)


@pytest.mark.parametrize("typ,kind,ok", [
    (pa.int32(), "int", True), (pa.float32(), "int", True), (pa.bool_(), "int", False),
    (pa.string(), "int", True), (pa.float64(), "text", False), (pa.int64(), "text", True),
    (pa.bool_(), "flag", True), (pa.timestamp("ms"), "time_s", True), (pa.date32(), "time_ms", True),
    (pa.timestamp("ms"), "int", False), (pa.list_(pa.int64()), "time_s", False),
    (pa.dictionary(pa.int32(), pa.string()), "text", True),
])
def test_type_problem(typ, kind, ok):
    assert (type_problem(typ, kind) is None) == ok
    with pytest.raises(ValueError, match="kind"):
        type_problem(typ, "float")
