"""``SequenceBatch``: one rank's jagged batch of user sequences, as TorchRec's train pipelines
move it (a ``Pipelineable``: ``to(device, non_blocking)``, ``record_stream``, ``pin_memory``).

Tokens are back to back (``offsets [B + 1]``); the token at position ``i`` of a sequence is
trained to retrieve the item at ``i + 1`` (every token but each sequence's last is a query).

Fields: ``items [T]`` int64, ``offsets [B + 1]`` int64, ``timestamps [T]`` int64 seconds,
``actions [T]`` uint8 action bits (bit ``i`` = action ``i`` of the data set), ``users [B]``
int64 (row of each sequence in the split; error messages name them).  Training adds ``kjt`` (a
``KeyedJaggedTensor``: ``item`` = the sequences, ``neg`` = the step's shared negative pool, all
in the first row), ``pos_log_q [T]`` (logQ of the token's next item; 0 for last tokens),
``neg_log_q [R]`` and ``loss_scale`` (a 0-dim tensor, 1 / queries of the *global* batch, so the
gradients summed over ranks equal the single-process gradient).  With per-position negatives
(``train.negatives = "per_position"``) ``neg`` holds the distinct ids of the batch's ``[Q, K]``
per-query negatives (each looked up once), ``neg_index [Q, K]`` int64 points every query's
negatives into them, and ``neg_log_q`` is ``[Q, K]`` (Q = the batch's queries, in token
order); ``neg_index`` is None for a shared pool.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

import torch
from torchrec.streamable import Pipelineable

__all__ = ["FieldsBatch", "SequenceBatch", "query_positions"]


def query_positions(offsets: torch.Tensor, total: int) -> torch.Tensor:
    """Indices of the tokens that have a next item (all but each non-empty sequence's last)."""
    lengths = offsets[1:] - offsets[:-1]
    is_last = torch.zeros(total, dtype=torch.bool, device=offsets.device)
    is_last[(offsets[1:] - 1)[lengths > 0]] = True
    return torch.nonzero(~is_last).flatten()


class FieldsBatch(Pipelineable):
    """A dataclass of tensors (and ``KeyedJaggedTensor`` s; None fields skipped) as TorchRec's
    pipelines move it: ``to``, ``record_stream``, ``pin_memory`` field by field."""

    def to(self, device: torch.device, non_blocking: bool = False):  # type: ignore[override]
        moved = {}
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            moved[f.name] = v.to(device, non_blocking=non_blocking) if v is not None else None
        return type(self)(**moved)

    def record_stream(self, stream: torch.Stream) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if v is not None:
                v.record_stream(stream)

    def pin_memory(self):  # type: ignore[override]
        """Pinned host copies (page-locked memory needs an accelerator; without one: self)."""
        if not torch.accelerator.is_available():
            return self
        pinned = {}
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            pinned[f.name] = v.pin_memory() if v is not None else None
        return type(self)(**pinned)


@dataclass
class SequenceBatch(FieldsBatch):
    """See the module docstring."""

    items: torch.Tensor
    offsets: torch.Tensor
    timestamps: torch.Tensor
    actions: torch.Tensor
    users: torch.Tensor
    kjt: Optional[object] = None
    pos_log_q: Optional[torch.Tensor] = None
    neg_log_q: Optional[torch.Tensor] = None
    loss_scale: Optional[torch.Tensor] = None
    neg_index: Optional[torch.Tensor] = None

    @property
    def num_tokens(self) -> int:
        return int(self.items.numel())

    @property
    def batch_size(self) -> int:
        return int(self.offsets.numel()) - 1
