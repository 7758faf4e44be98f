"""Typed options: the one way a component declares its settings, their rules and their errors.

Every component owns its options (like TorchRec's ``ShardingType`` / ``ParameterConstraints``):

* a string choice is a ``Literal`` type defined next to the component that interprets it
  (``PipelineKind = Literal["sync", "sparse_dist", "semi_async"]`` in
  ``distributed/train_pipeline``); :func:`choices` lists its values, so the list is written once;
* a range rule is metadata on the dataclass field (:func:`option`), checked by :func:`check_fields`;
* a rule across fields is one function next to the component, raising :class:`OptionError`
  with the key it names; callers that nest the options (the trainer's config sections) pass a
  ``key`` function so the same rule names ``train.staleness`` there and ``staleness`` in a
  library call.

:func:`from_mapping` builds a dataclass of options from JSON / YAML values, converting and
checking every field by its type (``"train.batch_size: 0 is not an integer >= 1"``).

This module imports nothing of the package: every layer may use it.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Type, TypeVar

__all__ = ["OptionError", "Key", "choices", "check_choice", "option", "check_fields",
           "from_mapping", "convert", "prefixed"]

Key = Callable[[str], str]
"""Names an option in an error message (identity for a library call, ``"train." + name`` for a
config section)."""

T = TypeVar("T")


class OptionError(ValueError):
    """A value breaks a rule: ``key`` names the option (a dotted config path or an argument),
    ``rule`` says what is wrong; ``str()`` is ``"<key>: <rule>"``."""

    def __init__(self, key: str, rule: str) -> None:
        super().__init__(f"{key}: {rule}")
        self.key, self.rule = key, rule

    def __reduce__(self):  # picklable (errors travel between ranks)
        return (type(self), (self.key, self.rule))


def _same(name: str) -> str:
    return name


def prefixed(prefix: str) -> Key:
    """A :data:`Key` that names option ``x`` as ``<prefix>.x`` (and the section itself, ``""``,
    as ``<prefix>``)."""
    return lambda name: (f"{prefix}.{name}" if name else prefix) if prefix else name


def choices(literal: Any) -> Tuple[Any, ...]:
    """The values of a ``Literal[...]`` type (optionally inside ``Optional``), in order."""
    if typing.get_origin(literal) is typing.Union:
        literal = next(a for a in typing.get_args(literal) if a is not type(None))
    if typing.get_origin(literal) is not typing.Literal:
        raise TypeError(f"{literal!r} is not a Literal type")
    return typing.get_args(literal)


def check_choice(key: str, value: Any, literal: Any) -> Any:
    """``value`` if it is one of ``literal``'s values, else :class:`OptionError` naming ``key``."""
    allowed = choices(literal)
    if value not in allowed or isinstance(value, bool) != isinstance(allowed[0], bool):
        if all(isinstance(a, str) for a in allowed) and not isinstance(value, str):
            raise OptionError(key, f"{value!r} is not a string")
        raise OptionError(key, f"{value!r} is not one of {list(allowed)}")
    return value


def option(default: Any = dataclasses.MISSING, *, min: Optional[float] = None,
           gt: Optional[float] = None, below: Optional[float] = None, finite: bool = False,
           default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with a range rule checked by :func:`check_fields`: ``min`` (``>=``),
    ``gt`` (``>``), ``below`` (``<``), ``finite`` (not inf / nan).  ``None`` values pass (the
    field's type says whether None is allowed)."""
    meta = {k: v for k, v in (("min", min), ("gt", gt), ("below", below)) if v is not None}
    if finite:
        meta["finite"] = True
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _range_rule(value: Any, meta: Mapping[str, Any], integer: bool) -> Optional[str]:
    if meta.get("finite") and not math.isfinite(value):
        return f"{value} is not a finite number"
    lo, hi = meta.get("min"), meta.get("below")
    if lo is not None and hi is not None and not lo <= value < hi:
        return f"{value} is not in [{lo:g}, {hi:g})"
    if lo is not None and value < lo:
        return f"{value} is not an integer >= {int(lo)}" if integer else f"{value} is not >= {lo:g}"
    if "gt" in meta and not value > meta["gt"]:
        return f"{value} is not > {meta['gt']:g}"
    if hi is not None and not value < hi:
        return f"{value} is not < {hi:g}"
    return None


def check_fields(obj: Any, key: Key = _same) -> None:
    """Check every field of dataclass ``obj`` against its :func:`option` range rule (and the
    ``Literal`` of its type)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is None:
            continue
        tp = hints[f.name]
        if _literal_of(tp) is not None:
            check_choice(key(f.name), value, _literal_of(tp))
            continue
        if not f.metadata:
            continue
        items = value if isinstance(value, (list, tuple)) else [value]
        for i, v in enumerate(items):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue  # a Literal member of a Union ("auto"), checked by its type
            rule = _range_rule(v, f.metadata, isinstance(v, int) and not isinstance(v, float))
            if rule is not None:
                name = key(f.name) + (f"[{i}]" if isinstance(value, (list, tuple)) else "")
                raise OptionError(name, rule)


def _literal_of(tp: Any) -> Any:
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else tp
    return tp if typing.get_origin(tp) is typing.Literal else None


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return f"{_describe(args[0])} or null"
    if origin in (list, List, tuple, Tuple, Sequence):
        return f"a list of {_describe(typing.get_args(tp)[0])}"
    if origin in (dict, Dict, Mapping):
        return "a mapping"
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp)))


def convert(key: str, value: Any, tp: Any) -> Any:
    """``value`` (from JSON / YAML) as type ``tp``: ints stay ints (``2.0`` -> 2), numbers become
    floats, ``Literal`` values must be listed, lists and mappings convert item by item;
    :class:`OptionError` naming ``key`` otherwise."""
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        if value is None:
            return None
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return convert(key, value, args[0])
        for a in args:  # the first member that takes the value
            try:
                return convert(key, value, a)
            except OptionError:
                pass
        raise OptionError(key, f"{value!r} is not {' or '.join(_describe(a) for a in args)}")
    if tp is Any:
        return value
    if origin is typing.Literal:
        return check_choice(key, value, tp)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif origin in (list, List, tuple, Tuple, Sequence):
        if isinstance(value, (list, tuple)):
            inner = typing.get_args(tp)[0]
            return [convert(f"{key}[{i}]", v, inner) for i, v in enumerate(value)]
    elif origin in (dict, Dict, Mapping):
        if isinstance(value, Mapping):
            return dict(value)
    elif dataclasses.is_dataclass(tp):
        return from_mapping(tp, value, prefixed(key))
    raise OptionError(key, f"{value!r} is not {_describe(tp)}")


def from_mapping(cls: Type[T], raw: Any, key: Key = _same, section: str = "") -> T:
    """An instance of dataclass ``cls`` from a mapping of its field names (unknown keys are an
    error naming them and listing the known ones); every value converted by :func:`convert` and
    range-checked by :func:`check_fields`.  ``section`` names the mapping itself in errors."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise OptionError(section or key(""), f"expected a mapping of keys, got {raw!r}")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls) if f.init]
    for k in raw:
        if k not in known:
            raise OptionError(key(str(k)), f"unknown key (known: {', '.join(known)})")
    obj = cls(**{k: convert(key(k), v, hints[k]) for k, v in raw.items()})
    check_fields(obj, key)
    return obj
