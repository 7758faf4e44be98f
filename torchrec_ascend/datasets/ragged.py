"""Vectorised numpy helpers for ragged (jagged) arrays: offsets from lengths, index ranges."""

from __future__ import annotations

import numpy as np

__all__ = ["offsets_of", "ranges"]


def offsets_of(lengths: np.ndarray) -> np.ndarray:
    """int64 offsets ``[n + 1]`` (``0, l0, l0 + l1, ...``) of ``lengths [n]``."""
    off = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    return off


def ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, e)`` for every pair (empty where ``e <= s``), int64."""
    lens = np.maximum(np.asarray(ends) - np.asarray(starts), 0)
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    first = np.repeat(np.asarray(starts) - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
    return first + np.arange(total, dtype=np.int64)
