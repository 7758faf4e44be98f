"""The ``ranking`` section of a config (``task = "ranking"``): tasks, the time split, the example
windows, the token layout and the heads.  Every rule is checked here (:class:`OptionError`
naming the key)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Literal, Optional

from ...models.generative_ranker import ActionLayout
from ...options import Key, OptionError, option, prefixed

__all__ = ["RankingConfig", "RankingModel", "RANKING_METRICS"]

RankingModel = Literal["hstu", "dlrm"]
"""The ranking task's models: the HSTU ranker, TorchRec's DLRM baseline."""

RANKING_METRICS = ("mean_auc", "mean_gauc")
"""``eval.metric`` of a ranking run: the mean over tasks, or ``<task>.auc`` / ``<task>.gauc``."""


@dataclass
class RankingConfig:
    """The ranking task (docs/ranking.md).

    tasks: the label names to train and report (empty: every task of the data with both classes
    in the training days).  task_weights: ``{task: weight}`` of the loss (default 1).  layout:
    ``summed`` (a history impression's action added to its item token) or ``interleaved``
    (a token of its own).  max_candidates: impressions per example window (2: on the validation
    days, 2 beat 1, 4 and 16 on the shared Pure slice and 16 on the 27K sample, docs/ranking.md
    -- a window's later candidates see less of the user's recent past).  test_days /
    valid_days: the time split (the last days are the test, the ones before the validation).
    utc_offset_hours: where calendar days start (null: the data's -- KuaiRand's Beijing time,
    UTC+8; tables UTC).  head_dims: the task MLP's hidden widths.  dlrm_dense_dims /
    dlrm_over_dims: the DLRM baseline's dense and over arch hidden widths; dlrm_sparse_lr: its
    tables' row-wise Adagrad learning rate (``train.sparse_lr`` is the ranker's; 0.05 was DLRM's
    best on the Pure slice's validation day, against 0.02 and 0.01, docs/ranking.md).
    ctr_smoothing: the no-history baseline's prior weight (pseudo-impressions) of a user's and an
    item's rate.  item_stats: give both models each impression's item statistics (its earlier
    impressions by every user: count and per-task rates, :mod:`.item_stats`);
    item_stats_smoothing: their rates' prior weight (pseudo-impressions; the Pure slice's config
    sets 30, above 10 and 100 on its validation day over 3 seeds, while 10 was better on the 27K
    sample's, docs/ranking.md); user_stats: also give them the user's own statistics (the same
    counts and rates over the user's earlier impressions; a candidate's as of its window's
    first candidate), smoothed alike.  head_stats: the HSTU ranker's task MLP also reads the raw
    statistics (a wide input next to their projection; on in the Pure slice's config: +0.0016
    mean validation AUC there, -0.0014 on the 27K sample's, docs/ranking.md).  refit: once a model's step is chosen on the validation
    days (the restored best, else the last), train it again from scratch on the training and
    validation days together for the same share of its run, and report the test of that
    model (``results.json``: ``refit``; the validation metrics stay the first model's; the CTR
    baseline's test rates are counted over the same days; :mod:`..refit`).  watch_time_weight:
    > 0 adds the watch-time regression to both models -- one more output predicting
    ``log1p(seconds)`` of the candidate's ``play_time_ms``, squared error with this weight in the
    loss; RMSE / MAE / R^2 under ``watch_time`` in the metrics (0: off, the default).
    """

    tasks: List[str] = field(default_factory=list)
    task_weights: Dict[str, float] = field(default_factory=dict)
    layout: ActionLayout = "summed"
    max_candidates: int = option(2, min=1)
    test_days: int = option(1, min=1)
    valid_days: int = option(1, min=1)
    utc_offset_hours: Optional[float] = option(None, min=-14, below=15)
    head_dims: List[int] = option(min=1, default_factory=lambda: [256])
    dlrm_dense_dims: List[int] = option(min=1, default_factory=lambda: [128])
    dlrm_over_dims: List[int] = option(min=1, default_factory=lambda: [256, 128])
    dlrm_sparse_lr: float = option(0.05, gt=0, finite=True)
    ctr_smoothing: float = option(10.0, gt=0, finite=True)
    item_stats: bool = True
    item_stats_smoothing: float = option(10.0, gt=0, finite=True)
    user_stats: bool = False
    head_stats: bool = False
    refit: bool = False
    watch_time_weight: float = option(0.0, min=0, finite=True)

    def check(self, max_seq_len: int, key: Key = prefixed("ranking"),
              model_key: Key = prefixed("model")) -> None:
        """The rules that involve other sections: a window must fit the sequence with room for
        history."""
        for name, w in self.task_weights.items():
            if not isinstance(w, (int, float)) or isinstance(w, bool) or not w >= 0:
                raise OptionError(key(f"task_weights.{name}"), f"{w!r} is not a number >= 0")
        unknown = set(self.task_weights) - set(self.tasks) if self.tasks else set()
        if unknown:
            raise OptionError(key("task_weights"), f"{sorted(unknown)} are not in "
                                                   f"{key('tasks')} {self.tasks}")
        if self.max_candidates + 3 > max_seq_len:
            raise OptionError(key("max_candidates"), f"{self.max_candidates} leaves no room for "
                                                     f"history in {model_key('max_seq_len')}="
                                                     f"{max_seq_len} (contextual tokens + "
                                                     "history + candidates)")
