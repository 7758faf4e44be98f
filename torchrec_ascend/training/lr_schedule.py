"""The dense learning rate over a run (``train.lr_schedule``): a factor of ``train.lr`` per step."""

from __future__ import annotations

import math
from typing import Callable, Literal, Optional

from ..options import choices

__all__ = ["LrSchedule", "LR_SCHEDULES", "lr_schedule"]

LrSchedule = Literal["constant", "cosine"]
"""``constant``: ``train.lr`` throughout; ``cosine``: from ``train.lr`` at the first step down to
0 after the last (half a cosine over the run's total steps)."""
LR_SCHEDULES = choices(LrSchedule)


def lr_schedule(kind: LrSchedule, total: int) -> Optional[Callable[[int], float]]:
    """The factor of the learning rate at step ``s`` (0-based) of a ``total``-step run; None for
    ``constant`` (no change)."""
    if kind == "constant":
        return None
    if kind == "cosine":
        return lambda s: 0.5 * (1.0 + math.cos(math.pi * min(max(s, 0), total) / max(total, 1)))
    raise ValueError(f"unknown learning-rate schedule {kind!r}; one of {LR_SCHEDULES}")
