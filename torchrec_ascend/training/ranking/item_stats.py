"""Item statistics: what the log knew about an item when one of its impressions was served.

For an impression of item ``i`` at time ``t``, over the impressions of ``i`` by *every* user
strictly before ``t`` (``n`` of them, ``pos_k`` positive for task ``k``):

* ``log1p(n) / 10`` -- how often the item has been shown;
* per task, ``logit((pos_k + s p_k) / (n + s)) - logit(p_k)`` -- its smoothed rate (``s``:
  ``ranking.item_stats_smoothing`` pseudo-impressions at the training rate ``p_k``) as evidence over
  the prior: 0 for an item never shown before.

Strictly earlier: impressions at the same millisecond (another user's, or a duplicate-free
repeat) do not count, so no impression's own labels, nor those of one served with it, reach its
input.  The counts run over the whole log in time order -- a validation or test impression sees
the labels of the item's earlier impressions in its own days too, as a served system's counters
would (real-time statistics); a model never sees a later impression.  Both the HSTU ranker and
the DLRM baseline read them (the same features), as dense inputs.

Keyed by user instead of item, the same function gives the user statistics
(``ranking.user_stats``, :meth:`~.data.RankingData.user_statistics`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["item_statistics", "STATS_COUNT_SCALE"]

STATS_COUNT_SCALE = 10.0
"""``log1p(n)`` is divided by this (about 1 at 22,000 impressions)."""


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-9, 1 - 1e-9)
    return np.log(p / (1 - p))


def item_statistics(items: np.ndarray, times: np.ndarray, labels: np.ndarray,
                    prior: np.ndarray, smoothing: float) -> np.ndarray:
    """``[E, 1 + tasks]`` float32 statistics of every event (module docstring).

    Args:
        items: int [E] item of each event.  times: int [E] its time (any unit, compared only).
        labels: [E, tasks] 0/1.  prior: [tasks] the rate an unseen item has.  smoothing: > 0.
    """
    e = len(items)
    tasks = labels.shape[1]
    out = np.zeros((e, 1 + tasks), dtype=np.float32)
    if e == 0:
        return out
    order = np.lexsort((times, items))  # by item, then time
    it, tm = items[order], times[order]
    new_item = np.ones(e, dtype=bool)
    new_item[1:] = it[1:] != it[:-1]
    new_tie = new_item.copy()
    new_tie[1:] |= tm[1:] != tm[:-1]
    idx = np.arange(e)
    item_start = np.maximum.accumulate(np.where(new_item, idx, 0))
    tie_start = np.maximum.accumulate(np.where(new_tie, idx, 0))
    n = (tie_start - item_start).astype(np.float64)  # impressions strictly earlier
    lab = labels[order].astype(np.float64)
    csum = np.vstack([np.zeros((1, tasks)), np.cumsum(lab, axis=0)])  # csum[j] = sum of rows < j
    pos = csum[tie_start] - csum[item_start]
    prior = np.asarray(prior, dtype=np.float64)
    rate = (pos + smoothing * prior) / (n[:, None] + smoothing)
    stats = np.empty((e, 1 + tasks), dtype=np.float64)
    stats[:, 0] = np.log1p(n) / STATS_COUNT_SCALE
    stats[:, 1:] = _logit(rate) - _logit(prior)[None, :]
    out[order] = stats.astype(np.float32)
    return out
