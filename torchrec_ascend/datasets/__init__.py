"""Sequential data: streaming, validating readers (KuaiRand logs; any user/item/timestamp table
as CSV / TSV / Parquet), preprocessing into cached per-user sequences, and deterministic
generators (KuaiRand-format files, a generic events table).  numpy + pyarrow only (no torchrec).

Every data error is a :class:`DataError` (``KuaiRandDataError`` is the same class) naming the
file, the data row, the file line and the column; docs/datasets.md has the format and contract.
"""

from __future__ import annotations

from .errors import DataError, KuaiRandDataError
from .preprocess import (
    EventLog,
    PreprocessStats,
    Sequences,
    build_cache,
    load_kuairand,
    peak_rss_mb,
    preprocess,
)
from .reader import (
    detect_format,
    iter_log_chunks,
    read_user_features,
    read_video_features,
)
from .movielens import RATINGS_COLUMNS, convert_ratings
from .schema import ACTION_BITS, PositiveRule, action_mask
from .synthetic import SyntheticConfig, generate
from .synthetic_events import generate_events_table
from .table import TableSource, TableSpec, load_table_sequences, preprocess_table

__all__ = [
    "ACTION_BITS", "DataError", "EventLog", "KuaiRandDataError", "PositiveRule",
    "PreprocessStats", "Sequences", "SyntheticConfig", "action_mask", "build_cache",
    "detect_format", "generate", "iter_log_chunks", "load_kuairand", "peak_rss_mb",
    "preprocess", "read_user_features", "read_video_features", "TableSource", "TableSpec",
    "generate_events_table", "load_table_sequences", "preprocess_table", "RATINGS_COLUMNS",
    "convert_ratings",
]
