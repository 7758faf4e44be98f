"""Ranking data: every impression of every user with its labels, a time split, and the examples.

**Events.**  The cached event log (:mod:`torchrec_ascend.datasets.preprocess`: streaming,
bounded memory, duplicates dropped) keeps *every* impression, not only positives: per user, in
time order, the item, the time, the action byte (the labels) and the context columns.

**Tasks.**  One binary task per action bit: KuaiRand's ``is_click``, ``is_like``, ``is_follow``,
``is_comment``, ``is_forward``, ``is_hate``, ``long_view``, ``is_profile_enter`` (the shared 27K
sample's ``label`` is its like bit; its hate bit is ``1 - label`` there and not a task), or a
table's ``data.action_cols`` (the label columns).  Default: every task with both classes in
the training days.

**Time split** (:class:`TimeSplit`): calendar days (``utc_offset_hours``: KuaiRand's dates are
Beijing's, UTC+8; tables default to UTC) -- the last ``test_days`` days are the test, the
``valid_days`` before them the validation, everything earlier the training.

**Refit** (``ranking.refit``): the split ``train+valid`` -- the training and validation days
together -- is what a model is trained on again, once the validation days have chosen its step
(:mod:`.refit`).

**Examples** (:meth:`RankingData.examples`): a user's impressions of one split, in time order,
cut into windows of at most ``max_candidates`` consecutive impressions; an example's candidates
are one window and its history every earlier impression of the user (any split: the past is
known when a request is served), at most ``max_history`` of them, most recent last.  The
candidates' own labels never reach the input: history ends before the window starts, and the
candidates see the history and themselves only (the target-aware mask).

**Context** (:class:`ContextColumn`): integer features of each impression known when it was
served -- KuaiRand's ``tab``, ``is_rand``, ``duration_ms``, and the hour of day of the time --
feed history and candidates alike; *outcomes* (KuaiRand's ``play_time_ms``) feed history tokens
only.  All are small categorical codes (:func:`~torchrec_ascend.datasets.features.
encode_values`).

**Watch time** (``ranking.watch_time_weight``): ``log1p(seconds)`` of each impression's
:data:`WATCH_TIME_COLUMN`, the optional regression target (NaN where the value is negative:
left out of the loss and the metrics, counted).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...datasets import DataError, EventLog
from ...datasets.features import SideFeatures, encode_values
from ...datasets.schema import ACTION_BITS, ACTION_COLUMNS
from .item_stats import item_statistics

__all__ = ["TRAIN", "VALID", "TEST", "SPLITS", "TaskSpec", "ContextColumn", "TimeSplit",
           "Examples", "RankingData", "kuairand_tasks", "KUAIRAND_CONTEXT", "KUAIRAND_OUTCOMES",
           "WATCH_TIME_COLUMN"]

TRAIN, VALID, TEST = 0, 1, 2
SPLITS = {"train": (TRAIN,), "valid": (VALID,), "test": (TEST,), "train+valid": (TRAIN, VALID)}
"""The periods of each split name (``train+valid``: a refit's training, module docstring)."""

KUAIRAND_CONTEXT = ("tab", "is_rand", "duration_ms")
"""KuaiRand log columns known when an impression is served (candidate features)."""
KUAIRAND_OUTCOMES = ("play_time_ms",)
"""KuaiRand log columns that are an impression's outcome (history features only)."""
WATCH_TIME_COLUMN = "play_time_ms"
"""The log column (milliseconds) whose ``log1p(seconds)`` is the watch-time target."""

_DAY_MS = 86_400_000
_HOUR_MS = 3_600_000


@dataclass(frozen=True)
class TaskSpec:
    """One binary task: ``name`` and the action ``bit`` (label = ``actions >> bit & 1``)."""

    name: str
    bit: int

    def labels(self, actions: np.ndarray) -> np.ndarray:
        return ((np.asarray(actions).astype(np.int64) >> self.bit) & 1).astype(np.float32)


def kuairand_tasks(log_kinds: Sequence[str]) -> List[TaskSpec]:
    """KuaiRand's tasks (module docstring) for logs of ``log_kinds`` (``official`` /
    ``sample``)."""
    sample = "sample" in log_kinds
    out = []
    for name, value in ACTION_BITS.items():
        bit = int(value).bit_length() - 1
        if sample and name == "hate":
            continue  # 1 - label in the sample: not a task of its own
        out.append(TaskSpec("label" if sample and name == "like" else ACTION_COLUMNS[name], bit))
    return out


@dataclass
class ContextColumn:
    """Codes ``[E]`` of one context feature of every event, ``cardinality`` codes (0: missing),
    ``outcome``: known only after the impression (history tokens only)."""

    name: str
    codes: np.ndarray
    cardinality: int
    outcome: bool = False


@dataclass(frozen=True)
class TimeSplit:
    """The last ``test_days`` calendar days are the test, the ``valid_days`` before them the
    validation, the rest the training; days start at midnight UTC + ``utc_offset_hours``."""

    test_days: int = 1
    valid_days: int = 1
    utc_offset_hours: float = 0.0

    def days(self, times_ms: np.ndarray) -> np.ndarray:
        """The calendar day (days since the epoch, local) of each time."""
        return (np.asarray(times_ms) + int(self.utc_offset_hours * _HOUR_MS)) // _DAY_MS

    def periods(self, times_ms: np.ndarray, where: str) -> Tuple[np.ndarray, Dict[str, List[str]]]:
        """``(period [E] int8, {"train" / "valid" / "test": [ISO dates]})``; ``where`` names the
        data in a :class:`DataError` when it spans too few days."""
        import datetime

        day = self.days(times_ms)
        distinct = np.unique(day)
        need = self.test_days + self.valid_days + 1
        if len(distinct) < need:
            raise DataError(where, 0, None, f"the events span {len(distinct)} calendar day(s); "
                                            f"the time split needs at least {need} "
                                            f"(ranking.test_days={self.test_days}, "
                                            f"ranking.valid_days={self.valid_days}, and a "
                                            "training day)")
        test_from = distinct[-self.test_days]
        valid_from = distinct[-self.test_days - self.valid_days]
        period = np.where(day >= test_from, TEST, np.where(day >= valid_from, VALID, TRAIN))

        def iso(d: int) -> str:
            return str(datetime.date(1970, 1, 1) + datetime.timedelta(days=int(d)))

        names = {"train": [iso(d) for d in distinct if d < valid_from],
                 "valid": [iso(d) for d in distinct if valid_from <= d < test_from],
                 "test": [iso(d) for d in distinct if d >= test_from]}
        return period.astype(np.int8), names


@dataclass
class Examples:
    """Examples of one split: ``user [N]`` (dense user index), candidates ``[start, end)`` and
    history ``[hist_start, start)`` as event indices."""

    user: np.ndarray
    hist_start: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def __len__(self) -> int:
        return len(self.user)

    @property
    def num_candidates(self) -> np.ndarray:
        return self.end - self.start

    @property
    def history_lengths(self) -> np.ndarray:
        return self.start - self.hist_start

    def take(self, rows: np.ndarray) -> "Examples":
        return Examples(self.user[rows], self.hist_start[rows], self.start[rows], self.end[rows])


class RankingData:
    """Every impression per user, split by time (module docstring).

    ``items`` int64 [E] (dense item ids, ``num_items`` of them), ``times`` int64 [E] (ms),
    ``actions`` uint8 [E], ``offsets`` int64 [U + 1] (user ``u``'s events, in time order),
    ``user_ids`` [U] (raw ids), ``period`` int8 [E], ``split_days`` (ISO dates per split),
    ``context`` (:class:`ContextColumn` s, the hour of day first), ``tasks``, ``user_side`` /
    ``item_side`` (:class:`~torchrec_ascend.datasets.features.SideFeatures`, rows = dense user /
    item ids, or None), ``watch_time`` float32 [E] (module docstring; None when the log has no
    :data:`WATCH_TIME_COLUMN`)."""

    def __init__(self, log: EventLog, tasks: Sequence[TaskSpec], split: TimeSplit,
                 context: Sequence[str] = (), outcomes: Sequence[str] = (),
                 user_side: Optional[SideFeatures] = None,
                 item_side: Optional[SideFeatures] = None, source: str = "data") -> None:
        if not tasks:
            raise ValueError("tasks: a ranking needs at least one task")
        self.items = np.asarray(log.items).astype(np.int64)
        self.times = np.asarray(log.times).astype(np.int64)
        self.actions = np.asarray(log.actions).astype(np.uint8)
        self.offsets = np.asarray(log.user_offsets).astype(np.int64)
        self.user_ids = np.asarray(log.user_ids)
        self.num_items = int(log.num_items)
        self.duplicates_dropped = int(log.meta.get("duplicates_dropped", 0))
        self.source = source
        self.split = split
        self.period, self.split_days = split.periods(self.times, source)
        hours = ((self.times + int(split.utc_offset_hours * _HOUR_MS)) // _HOUR_MS) % 24
        self.context: List[ContextColumn] = [ContextColumn("hour", hours + 1, 25)]
        for name in list(context) + list(outcomes):
            codes, card = encode_values(np.asarray(log.context[name]))
            self.context.append(ContextColumn(name, codes, card, outcome=name in outcomes))
        self.tasks = list(tasks)
        self.user_side, self.item_side = user_side, item_side
        self.watch_time: Optional[np.ndarray] = None
        if WATCH_TIME_COLUMN in log.context:
            ms = np.asarray(log.context[WATCH_TIME_COLUMN]).astype(np.float64)
            self.watch_time = np.where(ms >= 0, np.log1p(np.maximum(ms, 0.0) / 1000.0),
                                       np.nan).astype(np.float32)

    @property
    def num_users(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_events(self) -> int:
        return len(self.items)

    def labels(self, events: np.ndarray) -> np.ndarray:
        """``[len(events), tasks]`` float32 0/1 labels of the events."""
        acts = self.actions[events]
        return np.stack([t.labels(acts) for t in self.tasks], axis=1) if len(acts) else \
            np.zeros((0, len(self.tasks)), dtype=np.float32)

    def user_of_events(self) -> np.ndarray:
        return np.repeat(np.arange(self.num_users), np.diff(self.offsets))

    def examples(self, which: str, max_candidates: int, max_history: int) -> Examples:
        """The examples of split ``which`` (:data:`SPLITS`; module docstring), users in order."""
        owner = self.user_of_events()
        sel = self.events_of(which)
        if len(sel) == 0:
            z = np.zeros(0, dtype=np.int64)
            return Examples(z, z, z, z)
        # runs of one user's consecutive events of this split, cut every max_candidates
        new_run = np.ones(len(sel), dtype=bool)
        new_run[1:] = (owner[sel[1:]] != owner[sel[:-1]]) | (sel[1:] != sel[:-1] + 1)
        run_id = np.cumsum(new_run) - 1
        run_first = sel[new_run]
        pos_in_run = sel - run_first[run_id]
        first = np.flatnonzero(pos_in_run % max_candidates == 0)
        starts = sel[first]
        run_end = np.append(sel[np.flatnonzero(new_run)[1:] - 1] + 1, sel[-1] + 1)
        ends = np.minimum(starts + max_candidates, run_end[run_id[first]])
        user = owner[starts]
        hist_start = np.maximum(self.offsets[user], starts - max_history)
        return Examples(user.astype(np.int64), hist_start.astype(np.int64),
                        starts.astype(np.int64), ends.astype(np.int64))

    def item_statistics(self, smoothing: float) -> np.ndarray:
        """``[E, 1 + tasks]`` each impression's item statistics
        (:func:`~.item_stats.item_statistics`; the prior: the training positive rates)."""
        return self._statistics(self.items, smoothing)

    def user_statistics(self, smoothing: float) -> np.ndarray:
        """``[E, 1 + tasks]`` each impression's user statistics: the same counts and rates over
        the user's own impressions strictly before it."""
        return self._statistics(self.user_of_events(), smoothing)

    def _statistics(self, keys: np.ndarray, smoothing: float) -> np.ndarray:
        lab = self.labels(np.arange(self.num_events))
        train = self.period == TRAIN
        prior = lab[train].mean(axis=0) if train.any() else np.full(len(self.tasks), 0.5)
        return item_statistics(keys, self.times, lab, prior, smoothing)

    def events_of(self, which: str) -> np.ndarray:
        """The indices of the events of split ``which`` (:data:`SPLITS`), in order."""
        return np.flatnonzero(np.isin(self.period, SPLITS[which]))

    def task_counts(self, which: str) -> Dict[str, Tuple[int, int]]:
        """Per task, ``(positives, impressions)`` in split ``which``."""
        ev = self.events_of(which)
        lab = self.labels(ev)
        return {t.name: (int(lab[:, i].sum()), len(ev)) for i, t in enumerate(self.tasks)}
