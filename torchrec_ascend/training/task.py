"""What the generic :class:`~.trainer.Trainer` needs from a kind of training (a *task*).

Two tasks implement it: next-item retrieval (:mod:`.retrieval`: sampled softmax, HR / NDCG /
MRR) and multi-task ranking (:mod:`.ranking`: per-task BCE, AUC / GAUC / NE).  The trainer owns
everything they share: TorchRec's ``DistributedModelParallel`` and the planner, the dense and
sparse optimisers, the train pipeline, the step loop with its checks, checkpoints, logs and the
progress bar.
"""

from __future__ import annotations

import abc
from typing import Any, Dict, Iterator, List, Literal, Optional, Protocol

import numpy as np
import torch
from torch import nn

from ..options import choices

__all__ = ["Task", "TaskKind", "TASK_KINDS", "BatchSource", "sparse_parameters"]

TaskKind = Literal["retrieval", "ranking"]
"""``task``: next-item retrieval (sampled softmax, HR / NDCG) or multi-task ranking (BCE, AUC)."""
TASK_KINDS = choices(TaskKind)


class BatchSource(Protocol):
    """This rank's training batches (TorchRec ``Pipelineable`` s), a pure function of the step."""

    steps_per_epoch: int
    last_balance_s: Optional[float]

    def stream(self, start: int, stop: int) -> Iterator[Any]:
        """The batches of steps ``[start, stop)`` (consecutive calls continue)."""

    def close(self) -> None:
        """Stop background threads."""


def sparse_parameters(model: nn.Module) -> List[nn.Parameter]:
    """The parameters of the model's TorchRec embedding modules (trained by the fused sparse
    optimizer)."""
    from torchrec import EmbeddingBagCollection, EmbeddingCollection

    out: List[nn.Parameter] = []
    for m in model.modules():
        if isinstance(m, (EmbeddingCollection, EmbeddingBagCollection)):
            out.extend(m.parameters())
    return out


class Task(abc.ABC):
    """One kind of training on prepared data (module docstring).

    A task's model has TorchRec embedding modules (sharded by the planner, trained by row-wise
    Adagrad fused into the backward) and a dense part (AdamW); its ``forward(batch)`` returns
    ``(loss, (loss.detach(), stats))`` with ``stats`` a float64 cpu tensor ``[queries, tokens,
    step FLOPs]`` (the MFU's numerator)."""

    name: str = ""

    @property
    @abc.abstractmethod
    def has_valid(self) -> bool:
        """Whether a validation split is held out (periodic evaluation needs one)."""

    @abc.abstractmethod
    def build_model(self, kind: str, compute_dtype: torch.dtype) -> nn.Module:
        """The model of encoder ``kind`` on the meta device (DMP materialises the shards)."""

    @abc.abstractmethod
    def sharders(self) -> List[Any]:
        """TorchRec sharders of the model's embedding modules."""

    @abc.abstractmethod
    def table_names(self, kind: str) -> List[str]:
        """The embedding tables of model ``kind`` (the planner's constraints name them)."""

    @abc.abstractmethod
    def init_tables(self, model: nn.Module, seed: int) -> None:
        """Initialise the (sharded) tables as a function of the global row and ``seed``."""

    @abc.abstractmethod
    def batches(self, kind: str, rank: int, world: int,
                balance_group: Optional[Any]) -> BatchSource:
        """This rank's training batches for encoder ``kind``."""

    @abc.abstractmethod
    def evaluate(self, model: nn.Module, which: str, share: Any,
                 device: torch.device) -> Dict[str, Any]:
        """Metrics of ``model`` (the unwrapped module) on ``which`` (``valid`` / ``test``) from
        this rank's ``share`` of it (:meth:`eval_share`; collective)."""

    @abc.abstractmethod
    def eval_share(self, which: str, rank: int, world: int, limit: Optional[int] = None) -> Any:
        """This rank's share of evaluating ``which`` (``limit``: a fixed random subset of that
        many users / examples, for periodic validation)."""

    def sparse_lr(self, kind: str, configured: float) -> float:
        """The row-wise Adagrad learning rate of model ``kind``'s tables (``configured``:
        ``train.sparse_lr``, the default)."""
        return configured

    def metric(self, metrics: Dict[str, Any], name: str) -> float:
        """The value of ``eval.metric`` ``name`` in an evaluation's result (higher is better;
        ``<a>.<b>`` reads a nested value)."""
        value: Any = metrics
        for part in name.split("."):
            value = value[part]
        return float(value) if value is not None else float("-inf")

    @abc.abstractmethod
    def data_summary(self) -> Dict[str, Any]:
        """``results.json``'s ``data``: the sizes of the prepared data."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One console line about the prepared data and the split."""

    def refit_task(self) -> Optional["Task"]:
        """The task whose training split adds the validation one, when the config asks for a
        refit (:mod:`.refit`); None: no refit."""
        return None

    @abc.abstractmethod
    def baselines(self, rank: int, world: int) -> Dict[str, Dict[str, Any]]:
        """``{name: {"valid": metrics or None, "test": metrics}}`` of the task's baselines on
        the same split (collective)."""
