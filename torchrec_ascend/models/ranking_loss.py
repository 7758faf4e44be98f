"""The ranking models' loss (the HSTU ranker's and the DLRM baseline's): per-task weighted BCE
of the first ``tasks`` output columns, plus, when a regression target is given, its weighted
squared error on the remaining column(s) (the optional watch time), summed over rows and scaled
by the batch's ``loss_scale``.  A NaN target (unknown) adds nothing."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["ranking_loss", "regression_outputs", "split_outputs"]


def regression_outputs(target_weight: float) -> int:
    """The regression output columns of a model whose regression loss weight is
    ``target_weight``: 1 when it is > 0, else 0."""
    return 1 if target_weight > 0 else 0


def split_outputs(outputs: torch.Tensor, tasks: int) -> tuple:
    """``(logits [N, tasks], regression [N, R])`` of a model's output columns."""
    return outputs[:, :tasks], outputs[:, tasks:]


def ranking_loss(outputs: torch.Tensor, labels: torch.Tensor, targets: torch.Tensor,
                 task_weights: torch.Tensor, target_weight: float,
                 loss_scale: torch.Tensor) -> torch.Tensor:
    """``outputs [N, tasks + R]``, ``labels [N, tasks]`` 0/1, ``targets [N, R]`` (R = 0: no
    regression), ``task_weights [tasks]``, ``target_weight``: the regression's weight."""
    logits, pred = split_outputs(outputs.float(), labels.shape[1])
    per = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    loss = (per * task_weights).sum()
    if targets.shape[1]:
        known = torch.isfinite(targets)
        err = torch.where(known, pred - torch.nan_to_num(targets), torch.zeros_like(pred))
        loss = loss + target_weight * (err * err).sum()
    return loss * loss_scale
