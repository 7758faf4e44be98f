"""Full-corpus evaluation: every item scored for every evaluated user, history filtered (a
target the user consumed before too: it counts as a miss, :mod:`torchrec_ascend.metrics`),
metrics from :mod:`torchrec_ascend.metrics` (pessimistic ties, non-finite scores are errors).

Users are split over ranks (``users[rank::world]``); the item table is looked up once per
evaluation through the sharded ``EmbeddingCollection`` (a collective: every rank calls), then
each rank scores its users in chunks of ``eval.batch_size`` against the whole corpus.  The
query of a user is the model output at the token before the request token
(:meth:`~.split.Split.eval_inputs`: the request token carries the target's timestamp, as the
target's time reaches the last query in training).  Scores are cosine similarities (query and
items L2-normalised, as in the sampled-softmax loss).  The most-popular baseline scores every
item by its count in the training prefixes and goes through the same filtering and ranking.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ...metrics import RetrievalMetrics, check_finite_scores, filter_history, target_ranks
from ...models.generative_retrieval import item_kjt
from .split import Split

__all__ = ["Evaluator", "eval_users"]


def eval_users(num_users: int, rank: int, world: int, limit: Optional[int] = None,
               seed: int = 12345) -> np.ndarray:
    """This rank's share of the evaluated users (a fixed random subset of ``limit`` users when
    ``limit`` is given and smaller than ``num_users``)."""
    users = np.arange(num_users)
    if limit is not None and limit < num_users:
        users = np.sort(np.random.default_rng(seed).choice(num_users, limit, replace=False))
    return users[rank::world]


class Evaluator:
    """Evaluates models and the most-popular baseline on a :class:`~.split.Split`."""

    def __init__(self, split: Split, max_len: int, ks: Sequence[int] = (10, 50, 200),
                 batch_size: int = 256) -> None:
        self.split, self.max_len = split, int(max_len)
        self.ks, self.batch_size = tuple(ks), int(batch_size)

    @torch.no_grad()
    def item_table(self, model: torch.nn.Module, device: torch.device,
                   chunk: int = 1 << 16) -> torch.Tensor:
        """``[num_items, D]`` embeddings through the (sharded) EC of ``model`` (collective)."""
        parts = []
        n = self.split.num_items
        d = model.cfg.embedding_dim  # type: ignore[attr-defined]
        for s in range(0, n, chunk):
            ids = torch.arange(s, min(s + chunk, n))
            kjt = item_kjt(ids, torch.tensor([ids.numel()])).to(device)
            parts.append(model.ec(kjt)["item"].values()[:, :d])  # type: ignore[operator]
        return torch.cat(parts)

    def _chunks(self, users: np.ndarray):
        for b, i in enumerate(range(0, len(users), self.batch_size)):
            yield b, users[i:i + self.batch_size]

    def _rank(self, metrics: RetrievalMetrics, scores: torch.Tensor, u: np.ndarray, which: str,
              batch: int) -> None:
        check_finite_scores(scores, u.tolist(), batch)
        hist, hoff = self.split.history(u, which)
        tgt = torch.from_numpy(self.split.targets(u, which)).to(scores.device)
        filtered = filter_history(scores, torch.from_numpy(hist).to(scores.device),
                                  torch.from_numpy(hoff).to(scores.device))
        metrics.update(target_ranks(filtered, tgt))

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, which: str, users: np.ndarray,
                 device: torch.device) -> Dict[str, float]:
        """Metrics of ``model`` (a GenerativeRetrieval, sharded or not) on ``which``
        (``valid`` / ``test``) over every rank's ``users`` (collective)."""
        was = model.training
        model.eval()
        try:
            table = self.item_table(model, device)
            cand = F.normalize(table, dim=-1)
            m = RetrievalMetrics(self.ks)
            for b, u in self._chunks(users):
                items, times, actions, off, q = self.split.eval_inputs(u, which, self.max_len)
                seq = model.head.encode(  # type: ignore[operator]
                    table[torch.from_numpy(items).to(device)], torch.from_numpy(off).to(device),
                    torch.from_numpy(times).to(device), torch.from_numpy(actions).to(device))
                scores = seq[torch.from_numpy(q).to(device)] @ cand.t()
                self._rank(m, scores, u, which, b)
            m.all_reduce()
            return m.compute()
        finally:
            model.train(was)

    @torch.no_grad()
    def most_popular(self, which: str, users: np.ndarray) -> Dict[str, float]:
        """The most-popular baseline on ``which`` (collective)."""
        counts = torch.from_numpy(self.split.item_counts()).to(torch.float32)
        m = RetrievalMetrics(self.ks)
        for b, u in self._chunks(users):
            self._rank(m, counts.expand(len(u), -1), u, which, b)
        m.all_reduce()
        return m.compute()
