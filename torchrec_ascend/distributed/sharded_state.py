"""The local pieces of a sharded model's state: what this rank holds of each table."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch

__all__ = ["local_pieces"]

Piece = Tuple[List[int], torch.Tensor]


def local_pieces(value: Any) -> Optional[List[Piece]]:
    """``[(global offsets, local tensor)]`` of a state-dict entry on this rank: a
    ``ShardedTensor``'s local shards; a ``DTensor`` whose local tensor is TorchRec's
    ``LocalShardsWrapper`` (2-D parallelism) by its offsets (empty pieces left out); a plain
    tensor whole.  None for a ``DTensor`` without offsets (the caller's plan says where it
    goes).  The tensors are the model's own (writing them writes the table)."""
    if hasattr(value, "local_shards"):
        return [(list(s.metadata.shard_offsets), s.tensor) for s in value.local_shards()]
    if hasattr(value, "to_local"):
        local = value.to_local()
        if not hasattr(local, "local_offsets"):
            return None
        return [(list(o), t) for o, t in zip(local.local_offsets(), local.local_shards())
                if t.numel()]
    return [([0] * value.dim(), value)]
