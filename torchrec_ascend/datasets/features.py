"""Side features as small categorical codes, ready for embedding tables.

A ranking model looks a user's (or an item's) side features up in embedding tables, so every
feature becomes an integer code ``1..n`` (0: missing, or an entity the file does not list):

* a text column (KuaiRand's ``user_active_degree``, ``*_range``, ``video_type``, ``tag``, ...)
  or an identifier (a column named ``*_id``: ``author_id``, ``music_id``): one code per distinct
  value;
* an integer column with at most :data:`MAX_CATEGORIES` distinct values (KuaiRand's
  ``onehot_feat*``, ``is_live_streamer``, ``music_type``, ...): one code per value;
* any other number (counts, durations): a logarithmic bucket, ``1 + floor(log2(1 + max(v, 0)))`` (a count of 0 and one of 1 differ; 1,000
  and 1,500 share a bucket);
* a column with one value everywhere carries nothing and is left out.

:func:`encode_values` is the same rule for one array (the ranking data encodes its context
columns with it).  :func:`side_features` maps a feature file's rows onto the data's own entity
ids (a user or item id of the interactions); ids the file repeats are a :class:`~.errors.DataError`
naming the id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

from .errors import DataError
from .reader import FeatureTable

__all__ = ["SideFeatures", "side_features", "encode_values", "log2_buckets", "MAX_CATEGORIES"]

MAX_CATEGORIES = 256
"""An integer column with more distinct values than this is bucketed logarithmically."""


def log2_buckets(values: np.ndarray) -> np.ndarray:
    """``1 + floor(log2(1 + max(v, 0)))`` for finite values, 0 for NaN (int64)."""
    v = np.asarray(values, dtype=np.float64)
    out = np.zeros(v.shape, dtype=np.int64)
    ok = np.isfinite(v)
    out[ok] = 1 + np.floor(np.log2(1.0 + np.maximum(v[ok], 0.0))).astype(np.int64)
    return out


def encode_values(values: np.ndarray, categorical: Optional[bool] = None) -> Tuple[np.ndarray, int]:
    """``(codes, cardinality)`` of one column (module docstring): codes in ``[0, cardinality)``,
    0 for missing (NaN).  ``categorical``: force one code per distinct value (True) or log
    buckets (False); None decides by the rule above."""
    v = np.asarray(values)
    if v.dtype.kind in "iu":
        v = v.astype(np.float64)
    finite = np.isfinite(v)
    distinct = np.unique(v[finite])
    if categorical is None:
        categorical = len(distinct) <= MAX_CATEGORIES and bool(np.all(distinct == np.floor(distinct)))
    if categorical:
        codes = np.zeros(v.shape, dtype=np.int64)
        codes[finite] = 1 + np.searchsorted(distinct, v[finite])
        return codes, len(distinct) + 1
    codes = log2_buckets(v)
    return codes, int(codes.max(initial=0)) + 1


@dataclass
class SideFeatures:
    """Codes of side features: ``codes [n_entities, F]`` int64 (row = the entity's dense index,
    0 = missing), one column per ``names[f]`` with ``cardinalities[f]`` codes (0 included)."""

    names: Tuple[str, ...]
    codes: np.ndarray
    cardinalities: Tuple[int, ...]

    @property
    def num_features(self) -> int:
        return len(self.names)


def side_features(table: FeatureTable, entity_ids: np.ndarray,
                  columns: Optional[Sequence[str]] = None) -> SideFeatures:
    """The features of ``table`` (a user or video features file, :mod:`.reader`) for the
    entities ``entity_ids`` (their raw ids, in the data's dense order); ``columns``: the ones to
    use (default: every column of the file but the id)."""
    ids = np.asarray(table.ids, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    if len(sorted_ids) > 1:
        dup = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
        if len(dup):
            row = int(order[dup[0] + 1]) + 1
            raise DataError(table.path, row, None, f"id {int(sorted_ids[dup[0]])} is listed "
                                                   "twice (one row per id)")
    want = np.asarray(entity_ids, dtype=np.int64)
    pos = np.searchsorted(sorted_ids, want).clip(max=max(len(sorted_ids) - 1, 0))
    found = (sorted_ids[pos] == want) if len(sorted_ids) else np.zeros(len(want), dtype=bool)
    rows = order[pos]
    names, codes, cards = [], [], []
    for name in (columns if columns is not None else table.columns):
        if name not in table.columns:
            raise DataError(table.path, 0, name, f"missing column; the file's columns are: "
                                                 f"{', '.join(table.columns)}")
        col = table.columns[name]
        category = name in table.text_columns or name.endswith("_id")
        c, card = encode_values(col, categorical=True if category else None)
        if card <= 2 and len(np.unique(c)) <= 1:
            continue  # one value everywhere
        per_entity = np.where(found, c[rows], 0)
        names.append(name)
        codes.append(per_entity)
        cards.append(card)
    mat = np.stack(codes, axis=1) if codes else np.zeros((len(want), 0), dtype=np.int64)
    return SideFeatures(tuple(names), mat.astype(np.int64), tuple(cards))
