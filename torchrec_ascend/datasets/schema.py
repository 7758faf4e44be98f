"""KuaiRand file schemas, the action bitmask and the positive rule.

KuaiRand (Gao et al., CIKM 2022, CC BY-SA 4.0) ships, for each of its Pure / 1K / 27K variants,
``log_standard_*.csv`` and ``log_random_*.csv`` interaction logs plus ``user_features_*.csv`` and
``video_features_basic_*.csv``.  A filtered real sample of 27K
(``../shared/data/kuairand-27k-sample``) uses a ``label`` column instead of ``is_like`` /
``is_hate``; :data:`SAMPLE_LOG_COLUMNS` is its schema.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, Mapping, Optional, Sequence, Tuple

import numpy as np

# -- the action bitmask (one byte per event) ---------------------------------------------------
ACTION_BITS: Dict[str, int] = {
    "click": 1,
    "like": 2,
    "follow": 4,
    "comment": 8,
    "forward": 16,
    "hate": 32,
    "long_view": 64,
    "profile_enter": 128,
}
# official log column holding each action (0/1 values)
ACTION_COLUMNS: Dict[str, str] = {
    "click": "is_click",
    "like": "is_like",
    "follow": "is_follow",
    "comment": "is_comment",
    "forward": "is_forward",
    "hate": "is_hate",
    "long_view": "long_view",
    "profile_enter": "is_profile_enter",
}

# -- file schemas --------------------------------------------------------------------------------
LOG_COLUMNS: Tuple[str, ...] = (
    "user_id", "video_id", "date", "hourmin", "time_ms", "is_click", "is_like", "is_follow",
    "is_comment", "is_forward", "is_hate", "long_view", "play_time_ms", "duration_ms",
    "profile_stay_time", "comment_stay_time", "is_profile_enter", "is_rand", "tab",
)
SAMPLE_LOG_COLUMNS: Tuple[str, ...] = (
    "user_id", "video_id", "date", "hourmin", "time_ms", "is_click", "is_follow", "is_comment",
    "is_forward", "long_view", "play_time_ms", "duration_ms", "comment_stay_time",
    "is_profile_enter", "label", "timestamp",
)
USER_FEATURE_COLUMNS: Tuple[str, ...] = (
    "user_id", "user_active_degree", "is_lowactive_period", "is_live_streamer", "is_video_author",
    "follow_user_num", "follow_user_num_range", "fans_user_num", "fans_user_num_range",
    "friend_user_num", "friend_user_num_range", "register_days", "register_days_range",
) + tuple(f"onehot_feat{i}" for i in range(18))
VIDEO_FEATURE_COLUMNS: Tuple[str, ...] = (
    "video_id", "author_id", "video_type", "upload_dt", "upload_type", "visible_status",
    "video_duration", "server_width", "server_height", "music_id", "music_type", "tag",
)

OFFICIAL_ACTIONS: Tuple[str, ...] = tuple(ACTION_BITS)
# the sample has label (1 = like, 0 = hate) instead of is_like / is_hate
SAMPLE_ACTIONS: Tuple[str, ...] = tuple(a for a in ACTION_BITS if a not in ("like", "hate"))


def action_mask(names: Iterable[str], bits: Optional[Mapping[str, int]] = None) -> int:
    """OR of the bits of the named actions (``bits``: name -> bit value, default KuaiRand's
    :data:`ACTION_BITS`); ValueError on an unknown name."""
    table = ACTION_BITS if bits is None else bits
    m = 0
    for n in names:
        if n not in table:
            raise ValueError(f"action {n!r}: unknown; expected one of {sorted(table)}")
        m |= table[n]
    return m


def action_bits(names: Sequence[str]) -> Dict[str, int]:
    """Bit of each action named in order: ``names[i]`` is bit ``1 << i`` (at most 8)."""
    if len(names) > 8:
        raise ValueError(f"actions: at most 8 fit the action byte, got {len(names)}")
    return {n: 1 << i for i, n in enumerate(names)}


@dataclass(frozen=True)
class PositiveRule:
    """Which events count as positives: any action of ``any_of`` and none of ``none_of``.

    ``action_names`` are the actions in bit order (bit ``i`` = ``action_names[i]``); empty means
    KuaiRand's :data:`ACTION_BITS` (click, like, follow, comment, forward, hate, long_view,
    profile_enter).  A generic table's rule names its action columns
    (:class:`~torchrec_ascend.datasets.table.TableSpec` fills ``action_names`` in).

    The shared 27K sample's ``label == 1`` is its ``like`` bit (``label == 0`` sets ``hate``),
    so its default rule is ``PositiveRule(any_of=("like",))``.  Official logs default to clicks.
    """

    any_of: Tuple[str, ...] = ("click",)
    none_of: Tuple[str, ...] = ()
    action_names: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for f in ("any_of", "none_of", "action_names"):
            v = getattr(self, f)
            if isinstance(v, str) or not all(isinstance(n, str) for n in v):
                raise ValueError(f"PositiveRule.{f}: expected a list of action names, got {v!r}")
            object.__setattr__(self, f, tuple(v))
        if not self.any_of:
            raise ValueError("PositiveRule.any_of: must name at least one action")
        bits = self.bits
        action_mask(self.any_of, bits)
        action_mask(self.none_of, bits)

    @property
    def bits(self) -> Dict[str, int]:
        """Action name -> bit value."""
        return action_bits(self.action_names) if self.action_names else dict(ACTION_BITS)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Sequence[str]],
                    action_names: Sequence[str] = ()) -> "PositiveRule":
        """From ``{"any_of": [...], "none_of": [...]}`` (``any_of`` defaults to click for
        KuaiRand; a table's rule must give it)."""
        if not isinstance(cfg, Mapping):
            raise ValueError(f"positive rule: expected a mapping with 'any_of' / 'none_of', "
                             f"got {cfg!r}")
        unknown = set(cfg) - {"any_of", "none_of"}
        if unknown:
            raise ValueError(f"positive rule: unknown keys {sorted(unknown)}")
        if action_names and "any_of" not in cfg:
            raise ValueError(f"positive rule: needs 'any_of' (a list of the action columns "
                             f"{list(action_names)})")
        return cls(tuple(cfg.get("any_of", ("click",))), tuple(cfg.get("none_of", ())),
                   tuple(action_names))

    def __call__(self, actions: np.ndarray) -> np.ndarray:
        """Boolean mask of positive events for a uint8 action-bitmask array."""
        bits = self.bits
        a = actions.astype(np.int32, copy=False)
        pos = (a & action_mask(self.any_of, bits)) != 0
        if self.none_of:
            pos &= (a & action_mask(self.none_of, bits)) == 0
        return pos


@dataclass
class LogFormat:
    """What :func:`~torchrec_ascend.datasets.reader.detect_format` found in a header."""

    kind: str  # "official" | "sample"
    delimiter: str
    columns: Tuple[str, ...] = field(default_factory=tuple)

    @property
    def actions(self) -> Tuple[str, ...]:
        return OFFICIAL_ACTIONS if self.kind == "official" else SAMPLE_ACTIONS
