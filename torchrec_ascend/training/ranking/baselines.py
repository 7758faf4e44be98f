"""The no-history baseline of the ranking task: per-user and per-item rates of each task from
the training days (with ``ranking.refit``, the test's from the training and validation days,
as the models' refits).

For an impression of user ``u`` and item ``i``, with ``p`` the training positive rate of the
task and ``k`` the smoothing weight (``ranking.ctr_smoothing`` pseudo-impressions at rate ``p``):
``p_u = (pos_u + k p) / (n_u + k)``, ``p_i`` likewise, and the prediction is
``sigmoid(logit(p_u) + logit(p_i) - logit(p))`` (the two rates combined as independent evidence
over the prior).  A user or item absent from the days the rates come from gets ``p``.  It sees
no sequence, no side feature and no context: what the rates alone buy.
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np

from .data import RankingData
from .evaluator import metrics_of

__all__ = ["ctr_baseline", "ctr_scores"]


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-9, 1 - 1e-9)
    return np.log(p / (1 - p))


def ctr_scores(data: RankingData, which: str, smoothing: float, fit_on: str = "train"
               ) -> np.ndarray:
    """``[impressions of which, tasks]`` probabilities (module docstring), the rates counted
    over split ``fit_on`` (``train`` or ``train+valid``)."""
    owner = data.user_of_events()
    train = data.events_of(fit_on)
    ev = data.events_of(which)
    lab = data.labels(train)
    out = np.empty((len(ev), len(data.tasks)), dtype=np.float64)
    for t in range(len(data.tasks)):
        p = float(lab[:, t].mean()) if len(train) else 0.5
        rates = []
        for keys, n in ((owner, data.num_users), (data.items, data.num_items)):
            pos = np.bincount(keys[train], weights=lab[:, t], minlength=n)
            cnt = np.bincount(keys[train], minlength=n)
            rates.append((pos + smoothing * p) / (cnt + smoothing * 1.0))
        z = _logit(rates[0][owner[ev]]) + _logit(rates[1][data.items[ev]]) - _logit(np.array(p))
        out[:, t] = 1.0 / (1.0 + np.exp(-z))
    return out


def ctr_baseline(data: RankingData, which: str, smoothing: float, fit_on: str = "train"
                 ) -> Dict[str, Any]:
    """The baseline's metrics on ``which`` (``valid`` / ``test``: every impression of it), the
    rates counted over ``fit_on``."""
    ev = data.events_of(which)
    return metrics_of(ctr_scores(data, which, smoothing, fit_on), data.labels(ev),
                      data.user_of_events()[ev], [t.name for t in data.tasks])
