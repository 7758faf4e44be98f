"""DataLoader-side balancing, without communication: every rank plans the same global batch from
lengths every rank knows, and keeps its own share.

* :class:`CollatorBalancer` -- ``select(global_lengths, rank, world)``: the indices (into the
  global batch, ascending) this rank takes; ``microbatches(lengths, k)``: a rank's batch split
  into ``k`` micro-batches of about equal cost.
* :class:`BalancedBatchSampler` -- a ``torch.utils.data`` batch sampler: shuffles the dataset
  (seed + epoch, the same on every rank), cuts global batches of ``global_batch_size`` and yields
  this rank's dataset indices of each (``DataLoader(ds, batch_sampler=...)``).
"""

from __future__ import annotations

from typing import Iterator, List, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from .assign import RankPlanner, plan_assignment

__all__ = ["CollatorBalancer", "BalancedBatchSampler"]


def _check_rank(rank: int, world: int) -> None:
    if isinstance(world, bool) or int(world) != world or int(world) < 1:
        raise ValueError(f"world: must be an integer >= 1, got {world!r}")
    if isinstance(rank, bool) or int(rank) != rank or not 0 <= int(rank) < int(world):
        raise ValueError(f"rank: must be an integer in [0, world={world}), got {rank!r}")


class CollatorBalancer(RankPlanner):
    """Plan a global batch over ranks from its lengths, with no communication (constructor
    arguments: :class:`~.assign.RankPlanner`)."""

    def plan(self, global_lengths: torch.Tensor, world: int,
             num_targets: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Rank of every sequence of the global batch (``int64 [N]``, CPU)."""
        costs = self.cost_model.cost(global_lengths, num_targets)
        return self.plan_costs(costs, global_lengths.detach().cpu(), world)

    def select(self, global_lengths: torch.Tensor, rank: int, world: int,
               num_targets: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Indices into the global batch (``int64``, ascending, CPU) that ``rank`` takes."""
        _check_rank(rank, world)
        return torch.nonzero(self.plan(global_lengths, world, num_targets) == int(rank)).flatten()

    def microbatches(self, lengths: torch.Tensor, num_micro: int,
                     max_per_micro: Optional[int] = None,
                     num_targets: Optional[torch.Tensor] = None) -> List[torch.Tensor]:
        """A rank's batch split into ``num_micro`` micro-batches of about equal cost: the indices
        (ascending, CPU) of each; some are empty when ``len(lengths) < num_micro``."""
        bins = plan_assignment(self.cost_model.cost(lengths, num_targets), num_micro, max_per_micro)
        return [torch.nonzero(bins == m).flatten() for m in range(int(num_micro))]


class BalancedBatchSampler(torch.utils.data.Sampler):
    """Batch sampler yielding this rank's share (a list of dataset indices) of every global batch.

    ``lengths [len(dataset)]`` are the sequence lengths of the dataset; each epoch shuffles with
    ``seed + epoch`` (call :meth:`set_epoch`, as with ``DistributedSampler``) unless
    ``shuffle=False``, cuts global batches of ``global_batch_size`` (the last, shorter one is
    dropped with ``drop_last``) and keeps what ``balancer.select`` gives ``rank``.  ``rank`` and
    ``world`` default to the default process group's (0 and 1 without one)."""

    def __init__(self, lengths: Sequence[int], global_batch_size: int, balancer: CollatorBalancer,
                 rank: Optional[int] = None, world: Optional[int] = None, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = True) -> None:
        lens = torch.as_tensor(np.asarray(lengths), dtype=torch.int64) if not isinstance(
            lengths, torch.Tensor) else lengths.detach().cpu().to(torch.int64)
        if lens.dim() != 1:
            raise ValueError(f"lengths: expected one length per dataset item (1-D), got {tuple(lens.shape)}")
        if int(global_batch_size) < 1:
            raise ValueError(f"global_batch_size: must be >= 1, got {global_batch_size}")
        inited = dist.is_available() and dist.is_initialized()
        world = int(world if world is not None else (dist.get_world_size() if inited else 1))
        rank = int(rank if rank is not None else (dist.get_rank() if inited else 0))
        _check_rank(rank, world)
        self.lengths, self.global_batch_size = lens, int(global_batch_size)
        self.balancer, self.rank, self.world = balancer, rank, world
        self.shuffle, self.seed, self.drop_last, self.epoch = bool(shuffle), int(seed), bool(drop_last), 0

    def set_epoch(self, epoch: int) -> None:
        """Shuffle differently (and identically on every rank) in epoch ``epoch``."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        n, b = self.lengths.numel(), self.global_batch_size
        return n // b if self.drop_last else -(-n // b)

    def __iter__(self) -> Iterator[List[int]]:
        n = self.lengths.numel()
        if self.shuffle:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        else:
            order = torch.arange(n)
        for i in range(len(self)):
            chunk = order[i * self.global_batch_size:(i + 1) * self.global_batch_size]
            keep = self.balancer.select(self.lengths[chunk], self.rank, self.world)
            yield chunk[keep].tolist()
