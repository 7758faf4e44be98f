"""A small KuaiRand-format impression log for ranking tests: random users over five days, each
impression with a click, a long view after some clicks, a tab and a watch time."""

from __future__ import annotations

import os
from typing import List, Tuple

import numpy as np

from ..datasets import EventLog, preprocess
from ..datasets.schema import LOG_COLUMNS
from ..models.generative_ranker import RankerSpec
from ..training.ranking.data import RankingData, TimeSplit, kuairand_tasks

__all__ = ["write_log", "tiny_ranking_data", "spec_of", "DAY_MS", "T0_MS"]

DAY_MS = 86_400_000
T0_MS = 1_650_000_000_000  # 2022-04-15 05:20 UTC

Row = Tuple[int, int, int, int, int, int, int]


def write_log(path: str, rows: List[Row]) -> str:
    """An official KuaiRand log of ``(user, video, time_ms, click, long_view, tab, play_ms)``."""
    lines = [",".join(LOG_COLUMNS)]
    for u, v, t, click, lv, tab, play in rows:
        vals = {c: 0 for c in LOG_COLUMNS}
        vals.update(user_id=u, video_id=v, date=20220415, hourmin=900, time_ms=t, is_click=click,
                    long_view=lv, tab=tab, play_time_ms=play, duration_ms=60000)
        lines.append(",".join(str(vals[c]) for c in LOG_COLUMNS))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def tiny_ranking_data(folder: str, users: int = 12, seed: int = 0) -> RankingData:
    """Ranking data (tasks ``is_click``, ``long_view``; the last local day the test, the one
    before the validation) of a random log written into ``folder``."""
    rng = np.random.default_rng(seed)
    rows: List[Row] = []
    for u in range(users):
        n = int(rng.integers(1, 15))
        for t in np.sort(T0_MS + rng.integers(0, 5 * DAY_MS, n)):
            click = int(rng.random() < 0.4)
            rows.append((u, int(rng.integers(0, 30)), int(t), click,
                         click * int(rng.random() < 0.5), int(rng.integers(0, 4)),
                         int(rng.integers(0, 90000))))
    path = write_log(os.path.join(folder, "log_standard_x.csv"), rows)
    log = EventLog.load(preprocess([path], os.path.join(folder, "c"),
                                   context=("tab", "duration_ms", "play_time_ms")))
    tasks = [t for t in kuairand_tasks(["official"]) if t.name in ("is_click", "long_view")]
    return RankingData(log, tasks, TimeSplit(1, 1, 8.0), ["tab", "duration_ms"],
                       ["play_time_ms"], source=path)


def spec_of(data: RankingData) -> RankerSpec:
    """The tables of ``data`` without side features."""
    return RankerSpec(data.num_items, data.num_users,
                      context={c.name: c.cardinality for c in data.context},
                      outcomes=tuple(c.name for c in data.context if c.outcome))
