"""Multi-task ranking: impressions split by time (:mod:`.data`), the ``ranking`` config section
(:mod:`.config`), batches for the HSTU ranker and the DLRM baseline (:mod:`.batches`), exact
per-task evaluation (:mod:`.evaluator`), the no-history CTR baseline (:mod:`.baselines`) and the
task that puts them under the trainer (:mod:`.task`).  docs/ranking.md."""

from __future__ import annotations

from .config import RANKING_METRICS, RankingConfig, RankingModel
from .data import RankingData, TaskSpec, TimeSplit
from .task import RankingTask, prepare_ranking

__all__ = ["RANKING_METRICS", "RankingConfig", "RankingData", "RankingModel", "RankingTask",
           "TaskSpec", "TimeSplit", "prepare_ranking"]
