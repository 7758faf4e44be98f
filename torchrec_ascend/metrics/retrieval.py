"""Full-corpus retrieval metrics with history filtering: HR@K, NDCG@K, MRR.

For each query the model scores every item; the items of the user's history are removed from the
candidates (set to ``-inf``) **before the target is known**, the target included when the user
consumed it before (Meta's reference protocol: keeping a re-consumed target while masking every
other history item would tell the ranking which history item is the answer).  Such a target is a
miss: it ranks below every remaining candidate.  Otherwise the target's 0-based rank is
**pessimistic**:

``rank = #{other candidates scoring higher or equal}``

so a target tied with other candidates is ranked below all of them.  No item index is favoured
(breaking ties by index would reward whatever the id mapping puts first), and count-based
baselines such as most-popular, whose scores tie a lot, are never flattered.  Then
``HR@K = [rank < K]``, ``NDCG@K = [rank < K] / log2(rank + 2)`` (one relevant item, so IDCG = 1)
and ``MRR = 1 / (rank + 1)`` (no cut-off).

Scores must be finite: a NaN or infinite score is a broken model, never a metric
(:func:`check_finite_scores` names the batch and the user; :func:`target_ranks` refuses NaN
anywhere and a non-finite target score).
"""

from __future__ import annotations

import math
from typing import Dict, Iterable, Optional, Sequence, Tuple

import torch

from ..ops.validation import check_offsets, check_tensor

DEFAULT_KS: Tuple[int, ...] = (10, 50, 200)


def filter_history(scores: torch.Tensor, history: torch.Tensor,
                   history_offsets: torch.Tensor) -> torch.Tensor:
    """Copy of ``scores`` [B, N] with each row's history items set to ``-inf`` (a target among
    them too: module docstring)."""
    check_tensor("scores", scores, dim=2)
    check_tensor("history", history, dim=1, dtypes=(torch.int32, torch.int64))
    check_offsets("history_offsets", history_offsets, history.numel(), validate=True)
    b, n = scores.shape
    if history_offsets.numel() != b + 1:
        raise ValueError(f"history_offsets: expected {b + 1} entries (B + 1), got {history_offsets.numel()}")
    if history.numel() and (int(history.min()) < 0 or int(history.max()) >= n):
        raise ValueError(f"history: item ids must be in [0, {n})")
    out = scores.clone()
    rows = torch.repeat_interleave(torch.arange(b, device=scores.device),
                                   history_offsets[1:] - history_offsets[:-1])
    out[rows, history.long()] = float("-inf")
    return out


class NonFiniteScoreError(ValueError):
    """A model produced a NaN or infinite score: ``batch`` (0-based evaluation batch), ``row``
    (its row in the batch) and ``user`` (the caller's id for that row, when given)."""

    def __init__(self, batch: Optional[int], row: int, user: Optional[int], value: float) -> None:
        where = f"evaluation batch {batch}, " if batch is not None else ""
        who = f"user {user}" if user is not None else f"row {row}"
        super().__init__(f"scores: non-finite score {value} in {where}{who} (row {row}); "
                         "a NaN/inf score is a broken model, not a metric")
        self.batch, self.row, self.user, self.value = batch, row, user, value


def check_finite_scores(scores: torch.Tensor, users: Optional[Sequence[int]] = None,
                        batch: Optional[int] = None) -> None:
    """Raise :class:`NonFiniteScoreError` naming the first row (and its user) with a NaN or
    infinite score; call it on the model's raw scores, before :func:`filter_history`."""
    finite = torch.isfinite(scores)
    if bool(finite.all()):
        return
    bad = (~finite).flatten().nonzero()[0].item()
    row, col = divmod(int(bad), scores.shape[-1])
    user = int(users[row]) if users is not None else None
    raise NonFiniteScoreError(batch, row, user, float(scores[row, col]))


def target_ranks(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """0-based pessimistic rank of ``targets`` [B] in each row of ``scores`` [B, N]: the number of
    other candidates scoring higher or equal (``-inf`` entries are filtered candidates; a
    filtered target ranks after every other candidate)."""
    check_tensor("scores", scores, dim=2)
    check_tensor("targets", targets, dim=1, dtypes=(torch.int32, torch.int64))
    b, n = scores.shape
    if targets.numel() != b:
        raise ValueError(f"targets: expected {b} entries, got {targets.numel()}")
    if b and (int(targets.min()) < 0 or int(targets.max()) >= n):
        raise ValueError(f"targets: item ids must be in [0, {n})")
    if bool(torch.isnan(scores).any()):
        row = int(torch.isnan(scores).any(1).nonzero()[0])
        raise NonFiniteScoreError(None, row, None, float("nan"))
    t = targets.long().view(-1, 1)
    s_t = scores.gather(1, t)
    bad = torch.isnan(s_t) | (s_t == float("inf"))
    if bool(bad.any()):
        row = int(bad.flatten().nonzero()[0])
        raise NonFiniteScoreError(None, row, None, float(s_t[row]))
    # the target itself is the one equal entry not counted; a filtered (-inf) target ties with
    # every filtered candidate, so every other candidate counts
    return (scores >= s_t).sum(1) - 1


class RetrievalMetrics:
    """Accumulates HR@K / NDCG@K / MRR over batches of target ranks (and across ranks)."""

    def __init__(self, ks: Sequence[int] = DEFAULT_KS) -> None:
        if not ks or any(k < 1 for k in ks):
            raise ValueError(f"ks: must be positive cut-offs, got {list(ks)}")
        self.ks = tuple(ks)
        self.reset()

    def reset(self) -> None:
        self._sums = torch.zeros(2 * len(self.ks) + 2, dtype=torch.float64)

    def update(self, ranks: torch.Tensor) -> None:
        r = ranks.detach().to("cpu", torch.float64)
        parts = []
        for k in self.ks:
            parts.append((r < k).double().sum())
        for k in self.ks:
            parts.append(torch.where(r < k, 1.0 / torch.log2(r + 2.0), torch.zeros_like(r)).sum())
        parts.append((1.0 / (r + 1.0)).sum())
        parts.append(torch.tensor(float(r.numel()), dtype=torch.float64))
        self._sums += torch.stack(parts)

    def all_reduce(self, group: Optional[object] = None) -> None:
        """Sum the accumulators over a process group (call on every rank)."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(self._sums, group=group)

    @property
    def count(self) -> int:
        return int(self._sums[-1])

    def compute(self) -> Dict[str, float]:
        n = max(float(self._sums[-1]), 1.0)
        out: Dict[str, float] = {}
        for i, k in enumerate(self.ks):
            out[f"hr@{k}"] = float(self._sums[i]) / n
        for i, k in enumerate(self.ks):
            out[f"ndcg@{k}"] = float(self._sums[len(self.ks) + i]) / n
        out["mrr"] = float(self._sums[-2]) / n
        return out


def metrics_from_ranks(ranks: Iterable[int], ks: Sequence[int] = DEFAULT_KS) -> Dict[str, float]:
    """The same metrics from a plain list of ranks (pure Python; the tests' oracle shape)."""
    rs = list(ranks)
    n = max(len(rs), 1)
    out = {f"hr@{k}": sum(1 for r in rs if r < k) / n for k in ks}
    out.update({f"ndcg@{k}": sum(1 / math.log2(r + 2) for r in rs if r < k) / n for k in ks})
    out["mrr"] = sum(1 / (r + 1) for r in rs) / n
    return out
