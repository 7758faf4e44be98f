"""Ranking metrics of one binary task, exact over a whole split (never windowed): AUC, GAUC, NE,
log loss, positive rate.

* **AUC**: the Mann-Whitney statistic, ties counted half -- the probability that a random
  positive scores above a random negative.  It equals TorchRec's ``torchrec.metrics.auc``
  (``compute_auc``) on scores without ties (test: tests/metrics/test_ranking_metrics.py); with
  ties TorchRec's trapezoid depends on the order its sort leaves tied scores in, this one does
  not.
* **GAUC**: the AUC of each user (group) weighted by the user's impressions, over the users
  with both classes (the others are left out: their AUC is undefined).  TorchRec's
  ``torchrec.metrics.gauc`` averages the users' AUCs *unweighted*; on users with equally many
  impressions the two agree (tested).
* **NE** (normalized entropy): the mean cross-entropy of the predictions over that of the
  positive rate, as TorchRec's ``torchrec.metrics.ne`` (``compute_ne``, predictions clamped to
  ``[eta, 1 - eta]``); < 1 beats predicting the rate.
* **log loss**: mean cross-entropy in nats (scikit-learn's ``log_loss``).

A regression target (the optional watch time) gets :func:`regression_metrics`: RMSE, MAE and R^2
(one minus the squared error over that of the split's mean, scikit-learn's ``r2_score``) over
the rows whose target is known.

A task whose split holds one class only has no AUC, GAUC or NE: every value is ``None`` and
``reason`` says why.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

__all__ = ["auc", "gauc", "normalized_entropy", "log_loss", "ranking_metrics",
           "regression_metrics", "ETA"]

ETA = 1e-12
"""Predictions are clamped to ``[ETA, 1 - ETA]`` for the cross-entropies (TorchRec's eta)."""


def _average_ranks(order: np.ndarray, same_as_previous: np.ndarray) -> np.ndarray:
    """1-based ranks (in ``order``), ties (``same_as_previous`` along ``order``) averaged."""
    n = len(order)
    ranks = np.empty(n, dtype=np.float64)
    start = np.flatnonzero(~same_as_previous)  # first position of each tie group
    ends = np.append(start[1:], n)
    avg = (start + 1 + ends) / 2.0  # mean of the positions start+1 .. end
    group = np.cumsum(~same_as_previous) - 1
    ranks[order] = avg[group]
    return ranks


def auc(scores: np.ndarray, labels: np.ndarray) -> Optional[float]:
    """Mann-Whitney AUC (module docstring); None with one class only."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels) > 0.5
    pos, n = int(y.sum()), len(y)
    if pos == 0 or pos == n:
        return None
    order = np.argsort(s, kind="stable")
    same = np.zeros(n, dtype=bool)
    same[1:] = s[order[1:]] == s[order[:-1]]
    ranks = _average_ranks(order, same)
    return float((ranks[y].sum() - pos * (pos + 1) / 2.0) / (pos * (n - pos)))


def gauc(scores: np.ndarray, labels: np.ndarray, groups: np.ndarray
         ) -> Tuple[Optional[float], int]:
    """``(impression-weighted mean of the groups' AUCs, groups counted)`` over the groups with
    both classes (module docstring); ``(None, 0)`` when no group has both."""
    s = np.asarray(scores, dtype=np.float64)
    y = (np.asarray(labels) > 0.5).astype(np.float64)
    g = np.asarray(groups)
    if len(s) == 0:
        return None, 0
    order = np.lexsort((s, g))
    gs, ss = g[order], s[order]
    new_group = np.ones(len(s), dtype=bool)
    new_group[1:] = gs[1:] != gs[:-1]
    group_id = np.cumsum(new_group) - 1
    first = np.flatnonzero(new_group)
    same = np.zeros(len(s), dtype=bool)
    same[1:] = ~new_group[1:] & (ss[1:] == ss[:-1])
    rank_all = _average_ranks(np.arange(len(s)), same)  # ranks over the sorted array
    within = rank_all - first[group_id]  # 1-based rank inside the group
    ys = y[order]
    pos = np.bincount(group_id, weights=ys)
    size = np.bincount(group_id).astype(np.float64)
    neg = size - pos
    rank_pos = np.bincount(group_id, weights=within * ys)
    both = (pos > 0) & (neg > 0)
    if not both.any():
        return None, 0
    per_group = (rank_pos[both] - pos[both] * (pos[both] + 1) / 2.0) / (pos[both] * neg[both])
    return float(np.average(per_group, weights=size[both])), int(both.sum())


def _cross_entropy(scores: np.ndarray, labels: np.ndarray, base: float) -> np.ndarray:
    p = np.clip(np.asarray(scores, dtype=np.float64), ETA, 1.0 - ETA)
    y = np.asarray(labels, dtype=np.float64)
    return -(y * np.log(p) + (1.0 - y) * np.log(1.0 - p)) / np.log(base)


def log_loss(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mean cross-entropy in nats of probabilities ``scores``."""
    return float(_cross_entropy(scores, labels, np.e).mean())


def normalized_entropy(scores: np.ndarray, labels: np.ndarray) -> Optional[float]:
    """Cross-entropy of ``scores`` over that of the positive rate (module docstring); None with
    one class only."""
    y = np.asarray(labels, dtype=np.float64)
    rate = float(y.mean()) if len(y) else 0.0
    if rate <= 0.0 or rate >= 1.0:
        return None
    ce = _cross_entropy(scores, labels, np.e).sum()
    base = _cross_entropy(np.full(len(y), rate), labels, np.e).sum()
    return float(ce / base)


def ranking_metrics(scores: np.ndarray, labels: np.ndarray, groups: np.ndarray
                    ) -> Dict[str, Any]:
    """Every metric of one task on one split: ``auc``, ``gauc``, ``gauc_users``, ``ne``,
    ``logloss``, ``positive_rate``, ``count`` (and ``reason`` where a value is None).
    ``scores``: probabilities; ``groups``: the user of each impression."""
    y = np.asarray(labels, dtype=np.float64)
    n = len(y)
    pos = float(y.sum())
    out: Dict[str, Any] = {"count": n, "positive_rate": pos / n if n else None,
                           "logloss": log_loss(scores, labels) if n else None}
    if n == 0 or pos == 0 or pos == n:
        kind = "no impressions" if n == 0 else ("no positive" if pos == 0 else "no negative")
        out.update(auc=None, gauc=None, gauc_users=0, ne=None,
                   reason=f"{kind} in this split: AUC, GAUC and NE are undefined")
        return out
    g, users = gauc(scores, labels, groups)
    out.update(auc=auc(scores, labels), gauc=g, gauc_users=users,
               ne=normalized_entropy(scores, labels))
    if g is None:
        out["reason"] = "no user has both classes in this split: GAUC is undefined"
    return out


def regression_metrics(predictions: np.ndarray, targets: np.ndarray) -> Dict[str, Any]:
    """``rmse``, ``mae``, ``r2``, ``count`` (the rows with a finite target; the others are left
    out), ``missing``; with no such row (or no spread: R^2) a value is None and ``reason`` says
    why."""
    p = np.asarray(predictions, dtype=np.float64)
    t = np.asarray(targets, dtype=np.float64)
    known = np.isfinite(t)
    p, t = p[known], t[known]
    n = len(t)
    out: Dict[str, Any] = {"count": n, "missing": int((~known).sum())}
    if n == 0:
        out.update(rmse=None, mae=None, r2=None, reason="no known target in this split")
        return out
    err = p - t
    sse = float((err * err).sum())
    sst = float(((t - t.mean()) ** 2).sum())
    out.update(rmse=float(np.sqrt(sse / n)), mae=float(np.abs(err).mean()),
               r2=1.0 - sse / sst if sst > 0 else None)
    if sst == 0:
        out["reason"] = "every target is the same: R^2 is undefined"
    return out
