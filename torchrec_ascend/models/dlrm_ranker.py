"""The no-sequence baseline of the ranker: TorchRec's own DLRM (``torchrec.models.dlrm.DLRM``)
on the same features, one row per candidate impression.

    model = DLRMRanker(spec, embedding_dim=64, task_weights=[1.0] * 8)
    loss, (loss_value, stats) = model(batch)          # batch: DLRMBatch

Sparse features (one id each, pooled by an ``EmbeddingBagCollection``): the user, the item, the
user's and the item's side features, and the impression's context known when it was served (no
outcome: a candidate has none).  Dense features: each context code scaled to ``[0, 1]``, the
item statistics when the spec has them (as the HSTU ranker sees them), and a constant 1.  DLRM's
over-arch ends in one logit per task (plus the regression output with a ``target_weight``); the
loss is the ranker's (:mod:`.ranking_loss`).  Everything a
user sees of the sequence model's benefit is this model's gap to it (docs/ranking.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.models.dlrm import DLRM

from .batch import FieldsBatch
from .generative_ranker import RankerSpec, feature_key
from .ranking_loss import ranking_loss, regression_outputs

__all__ = ["DLRMBatch", "DLRMRanker", "dlrm_features"]


def dlrm_features(spec: RankerSpec) -> List[str]:
    """The sparse features (and tables) of the DLRM baseline, in KJT order."""
    return (["user"] + [feature_key("user", f) for f in spec.user_features] + ["item"]
            + [feature_key("item", f) for f in spec.item_features]
            + [feature_key("ctx", c) for c in spec.served_context()])


@dataclass
class DLRMBatch(FieldsBatch):
    """One rank's candidate rows: ``kjt`` (every feature of :func:`dlrm_features`, one id per
    row), ``dense [N, Dd]``, ``labels [N, tasks]``, ``users [N]`` (dense user index),
    ``loss_scale`` (1 / the rows of the global batch), ``targets [N, R]`` (regression targets;
    R = 0 without)."""

    kjt: KeyedJaggedTensor
    dense: torch.Tensor
    labels: torch.Tensor
    users: torch.Tensor
    loss_scale: torch.Tensor
    targets: torch.Tensor

    @property
    def num_candidates(self) -> int:
        return int(self.labels.shape[0])


class DLRMRanker(nn.Module):
    """TorchRec's DLRM with one output per task (module docstring).  ``dense_dims``: the dense
    arch's hidden widths (its last layer is ``embedding_dim``, as DLRM requires);
    ``over_dims``: the over arch's hidden widths (then one logit per task)."""

    def __init__(self, spec: RankerSpec, embedding_dim: int, task_weights: Sequence[float],
                 dense_dims: Sequence[int] = (64,), over_dims: Sequence[int] = (256, 128),
                 device: torch.device = torch.device("meta"), target_weight: float = 0.0) -> None:
        super().__init__()
        outputs = len(task_weights) + regression_outputs(target_weight)
        tables = spec.tables()
        self.features = dlrm_features(spec)
        self.dense_in = 1 + len(spec.served_context()) + spec.item_stats
        ebc = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name=f, embedding_dim=embedding_dim,
                                       num_embeddings=max(int(tables[f][0]), 1),
                                       feature_names=[f]) for f in self.features],
            device=device)
        self.dlrm = DLRM(embedding_bag_collection=ebc, dense_in_features=self.dense_in,
                         dense_arch_layer_sizes=list(dense_dims) + [embedding_dim],
                         over_arch_layer_sizes=list(over_dims) + [outputs])
        n = len(self.features)
        self.loss = _TaskLoss(task_weights, dense=[self.dense_in] + list(dense_dims) + [embedding_dim],
                              over=[embedding_dim + (n + 1) * n // 2] + list(over_dims)
                              + [outputs], vectors=n + 1, dim=embedding_dim,
                              target_weight=target_weight)

    def predict(self, batch: DLRMBatch) -> torch.Tensor:
        """``[rows, tasks (+ 1)]`` logits (and the regression)."""
        return self.dlrm(batch.dense, batch.kjt).float()

    def forward(self, batch: DLRMBatch) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        """``(loss, (loss.detach(), stats))``: TorchRec's pipelines trace this (the sharded tables
        are inside ``dlrm``), the loss is a leaf module."""
        return self.loss(self.dlrm(batch.dense, batch.kjt), batch)


class _TaskLoss(nn.Module):
    """The ranking loss (:mod:`.ranking_loss`) and the step's stats (a leaf of the pipeline's
    trace)."""

    def __init__(self, task_weights: Sequence[float], dense: Sequence[int], over: Sequence[int],
                 vectors: int, dim: int, target_weight: float = 0.0) -> None:
        super().__init__()
        self.target_weight = float(target_weight)
        self.register_buffer("task_weights", torch.tensor(list(task_weights), dtype=torch.float32),
                             persistent=False)
        self.dense, self.over, self.vectors, self.dim = list(dense), list(over), vectors, dim

    def forward(self, logits: torch.Tensor, batch: DLRMBatch
                ) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        loss = ranking_loss(logits, batch.labels, batch.targets, self.task_weights,
                            self.target_weight, batch.loss_scale)
        rows = batch.num_candidates
        stats = torch.tensor([float(rows), float(rows * self.vectors), self.step_flops(rows)],
                             dtype=torch.float64)
        return loss, (loss.detach(), stats)

    def step_flops(self, rows: int) -> float:
        """Forward + backward matmul FLOPs (the MLPs and the pairwise dot products)."""
        mlp = sum(2 * rows * a * b for dims in (self.dense, self.over)
                  for a, b in zip(dims[:-1], dims[1:]))
        return 3.0 * float(mlp + 2 * rows * self.vectors * self.vectors * self.dim)
