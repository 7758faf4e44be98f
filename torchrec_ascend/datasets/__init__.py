"""KuaiRand data: streaming readers, preprocessing into cached per-user sequences, and a
deterministic generator of KuaiRand-format CSV files.  numpy + pyarrow only (no torchrec)."""

from __future__ import annotations

from .preprocess import EventLog, PreprocessStats, Sequences, load_kuairand, peak_rss_mb, preprocess
from .reader import (
    KuaiRandDataError,
    detect_format,
    iter_log_chunks,
    read_user_features,
    read_video_features,
)
from .schema import ACTION_BITS, PositiveRule, action_mask
from .synthetic import SyntheticConfig, generate

__all__ = [
    "ACTION_BITS", "EventLog", "KuaiRandDataError", "PositiveRule", "PreprocessStats",
    "Sequences", "SyntheticConfig", "action_mask", "detect_format", "generate",
    "iter_log_chunks", "load_kuairand", "peak_rss_mb", "preprocess", "read_user_features",
    "read_video_features",
]
