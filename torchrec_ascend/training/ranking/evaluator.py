"""Ranking evaluation: every candidate of a split scored, the metrics of each task exact over the
whole split (:mod:`torchrec_ascend.metrics.ranking`), gathered from every rank.

Each rank scores its share of the split's examples in ``batch_size`` batches; every rank makes
the same number of lookups (the sharded tables need every rank in each one: a rank without
examples left scores a stand-in and drops it).  The scores, labels and users are gathered on
every rank, which compute the same metrics.

Returns ``{"<task>": {"auc", "gauc", "gauc_users", "ne", "logloss", "positive_rate", "count"
(, "reason")}, ..., "mean_auc", "mean_gauc"}``: the means over the tasks with at least
:data:`MEAN_MIN_POSITIVES` positives in the split (a rarer task's AUC moves by several points
from one positive to the next; it is reported, not averaged); with a regression target (the
watch time, ``ranking.watch_time_weight``) also ``"watch_time": {"rmse", "mae", "r2", "count",
"missing"}`` (:func:`~torchrec_ascend.metrics.ranking.regression_metrics`, in the target's
unit: ``log1p`` seconds).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from ...metrics.ranking import ranking_metrics, regression_metrics
from ...models.ranking_loss import split_outputs
from .batches import ExampleBuilder
from .data import Examples

__all__ = ["RankingEvaluator", "metrics_of", "split_share", "MEAN_MIN_POSITIVES",
           "REGRESSION_METRIC"]

MEAN_MIN_POSITIVES = 100
REGRESSION_METRIC = "watch_time"
"""The results' key of the regression target's metrics."""


def split_share(indices: np.ndarray, rank: int, world: int, batch_size: int
                ) -> List[np.ndarray]:
    """This rank's batches of the example ``indices``: global batches of ``batch_size x
    world``, each rank its contiguous part; the same number of batches on every rank (possibly
    empty)."""
    n, per = len(indices), batch_size * world
    out = []
    for g in range(max(1, math.ceil(n / per))):
        lo = min(g * per + rank * batch_size, n)
        out.append(indices[lo:min(lo + batch_size, n, g * per + per)])
    return out


def metrics_of(scores: np.ndarray, labels: np.ndarray, users: np.ndarray,
               tasks: Sequence[str], predictions: Optional[np.ndarray] = None,
               targets: Optional[np.ndarray] = None) -> Dict[str, Any]:
    """The evaluator's result (module docstring) from probabilities ``scores [N, tasks]`` (and
    the regression's ``predictions`` / ``targets [N, 1]``, when there is one)."""
    out: Dict[str, Any] = {name: ranking_metrics(scores[:, i], labels[:, i], users)
                           for i, name in enumerate(tasks)}
    frequent = [n for i, n in enumerate(tasks) if labels[:, i].sum() >= MEAN_MIN_POSITIVES]
    for key in ("auc", "gauc"):
        vals = [out[n][key] for n in (frequent or tasks) if out[n][key] is not None]
        out[f"mean_{key}"] = float(np.mean(vals)) if vals else None
    if targets is not None and targets.shape[1]:
        out[REGRESSION_METRIC] = regression_metrics(predictions[:, 0], targets[:, 0])
    return out


class RankingEvaluator:
    """Scores ``examples[which]`` with a model (``predict(batch)`` -> logits) built by
    ``builder``; ``equal_batches``: every rank's batch has ``batch_size`` examples (stand-ins
    fill a short one; TorchRec's pooled sharded tables need equal batches)."""

    def __init__(self, builder: ExampleBuilder, examples: Dict[str, Examples],
                 tasks: Sequence[str], batch_size: int, equal_batches: bool = False) -> None:
        self.builder, self.examples = builder, examples
        self.tasks, self.batch_size = list(tasks), int(batch_size)
        self.equal_batches = equal_batches

    def share(self, which: str, rank: int, world: int, limit: Optional[int] = None,
              seed: int = 12345) -> List[np.ndarray]:
        """This rank's batches of split ``which`` (``limit``: a fixed random subset of that many
        examples)."""
        n = len(self.examples[which])
        idx = np.arange(n)
        if limit is not None and limit < n:
            idx = np.sort(np.random.default_rng(seed).choice(n, limit, replace=False))
        return split_share(idx, rank, world, self.batch_size)

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, which: str, batches: List[np.ndarray],
                 device: torch.device) -> Dict[str, Any]:
        """Metrics of ``model`` on ``which`` from this rank's ``batches`` (collective)."""
        was = model.training
        model.eval()
        ex = self.examples[which]
        parts: List[tuple] = []
        try:
            for rows in batches:
                real = len(rows)
                size = self.batch_size if self.equal_batches else max(real, 1)
                take = np.concatenate([rows, np.zeros(size - real, dtype=np.int64)])
                batch = self.builder.build(ex.take(take), 1.0)
                logits = model.predict(batch.to(device))  # type: ignore[operator]
                if real:
                    users = getattr(batch, "candidate_users", None)
                    users = users if users is not None else batch.users
                    keep = int(ex.num_candidates[rows].sum())  # the real rows come first
                    logit, pred = split_outputs(logits[:keep].double(), len(self.tasks))
                    parts.append((torch.sigmoid(logit).cpu().numpy(),
                                  batch.labels[:keep].numpy(), users[:keep].numpy(),
                                  pred.cpu().numpy(), batch.targets[:keep].double().numpy()))
        finally:
            model.train(was)
        scores, labels, users, preds, targets = _gather(parts, len(self.tasks),
                                                         self.builder.regression_columns)
        return metrics_of(scores, labels, users, self.tasks, preds, targets)


def _gather(parts: List[tuple], tasks: int, regression: int):
    widths = (tasks, tasks, None, regression, regression)
    local = tuple(np.concatenate([p[i] for p in parts]) if parts else
                  (np.zeros((0, w)) if w is not None else np.zeros(0, dtype=np.int64))
                  for i, w in enumerate(widths))
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return local
    everyone: List[Optional[tuple]] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, local)
    return tuple(np.concatenate([e[i] for e in everyone]) for i in range(5))  # type: ignore[index]
