"""Next-item retrieval as a :class:`~..task.Task`: HSTU / SASRec over per-user positive
sequences, sampled softmax, full-corpus HR / NDCG / MRR on a leave-two-out (or leave-one-out)
split, the most-popular baseline."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np
import torch
from torch import nn

from ...models import TABLE, GenerativeRetrieval
from ...models.generative_retrieval import init_item_table
from ...sampling import make_sampler
from ..balancing import RankShare
from ..task import Task
from .batches import BatchBuilder, NegativeStream, Windows, cost_model_for
from .evaluator import Evaluator, eval_users
from .split import Split

__all__ = ["RetrievalTask"]


class RetrievalTask(Task):
    """Retrieval on ``split`` with the config ``cfg`` (an :class:`~..config.ExperimentConfig`)."""

    name = "retrieval"

    def __init__(self, cfg: Any, split: Split) -> None:
        self.cfg, self.split = cfg, split
        self.evaluator = Evaluator(split, cfg.model.max_seq_len, cfg.eval.ks, cfg.eval.batch_size)

    @property
    def has_valid(self) -> bool:
        return self.split.has_valid

    def build_model(self, kind: str, compute_dtype: torch.dtype) -> nn.Module:
        return GenerativeRetrieval(self.split.num_items, self.cfg.model, kind,
                                   self.cfg.train.temperature, device=torch.device("meta"),
                                   compute_dtype=compute_dtype)

    def sharders(self) -> List[Any]:
        from torchrec.distributed.embedding import EmbeddingCollectionSharder

        return [EmbeddingCollectionSharder()]

    def table_names(self, kind: str) -> List[str]:
        return [TABLE]

    def init_tables(self, model: nn.Module, seed: int) -> None:
        init_item_table(model, self.split.num_items, self.cfg.model.table_dim, seed)

    def batches(self, kind: str, rank: int, world: int,
                balance_group: Optional[Any]) -> BatchBuilder:
        t = self.cfg.train
        counts = torch.from_numpy(self.split.item_counts()).to(torch.float32)
        sampler = make_sampler(t.sampler, self.split.num_items,
                               counts=counts if t.sampler != "uniform" else None)
        cost = cost_model_for(kind, self.cfg.model) if t.balance != "none" else None
        return BatchBuilder(
            Windows(self.split, self.cfg.model.max_seq_len, t.batch_size * world, t.seed),
            NegativeStream(sampler, t.num_negatives, t.negatives, t.seed, prefetch=t.prefetch),
            RankShare(t.balance, cost, rank, world, t.batch_size, balance_group),
            ahead=t.balance_ahead)

    def evaluate(self, model: nn.Module, which: str, share: np.ndarray,
                 device: torch.device) -> Dict[str, Any]:
        return self.evaluator.evaluate(model, which, share, device)

    def eval_share(self, which: str, rank: int, world: int,
                   limit: Optional[int] = None) -> np.ndarray:
        return eval_users(self.split.num_users, rank, world, limit)

    def data_summary(self) -> Dict[str, Any]:
        s = self.split
        return {"users": s.num_users, "items": s.num_items, "train_events": int(len(s.items)),
                "duplicates_dropped": s.duplicates_dropped,
                "targets_in_history": s.targets_in_history()}

    def describe(self) -> str:
        s = self.split
        lens = s.prefix_lengths
        holdout = ("leave-two-out: validation = second-to-last, test = last item"
                   if s.has_valid else
                   "leave-one-out: test = last item, the second-to-last is trained on, "
                   "no validation")
        dup = (f"; {s.duplicates_dropped:,} exact duplicate rows (user, item, time) dropped"
               if s.duplicates_dropped else "")
        return (f"data: {s.num_users:,} users, {s.num_items:,} items, {len(s.items):,} training "
                f"events (prefix length mean {lens.mean():.1f}, max {lens.max()}); {holdout}{dup}")

    def baselines(self, rank: int, world: int) -> Dict[str, Dict[str, Any]]:
        users = self.eval_share("test", rank, world)
        ev = self.evaluator
        return {"most_popular": {
            "valid": ev.most_popular("valid", users) if self.split.has_valid else None,
            "test": ev.most_popular("test", users)}}
