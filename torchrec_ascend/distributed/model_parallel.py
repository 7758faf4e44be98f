"""``DistributedModelParallel`` with a staleness bound: TorchRec's DMP plus ``staleness: int``,
and :class:`ReplicaHooks`, what a trainer calls on every model wrapper.

``DistributedModelParallel(module, env=None, device=None, plan=None, sharders=None,
init_data_parallel=True, init_parameters=True, data_parallel_wrapper=None,
model_tracker_configs=None, staleness=0)`` takes TorchRec's arguments unchanged.

* ``staleness=0``: TorchRec's DMP exactly (same class body, DDP on the dense part): synchronous
  training under any pipeline.
* ``staleness=k >= 1``: the dense part is not wrapped in DDP; :class:`DeferredGradWrapper`
  broadcasts it from rank 0 and ``self.dense_grad_sync`` (:class:`DenseGradSync`) averages its
  gradients when the pipeline asks, so the all-reduce overlaps the next batch's sparse work.  The
  model is meant to be driven by ``make_train_pipeline("semi_async", ...)``
  (:mod:`torchrec_ascend.distributed.train_pipeline`), which runs the lookup (and its
  all-to-alls) of batch ``i + k`` before the sparse updates of batches ``i .. i+k-1`` land:
  no lookup reads parameters more than ``k`` updates old (docs/semi_async.md).  A training
  forward that follows a backward whose dense gradients were never averaged raises
  :class:`UnsyncedGradientsError` instead of silently training ranks apart.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Optional

import torch
from torch import nn

from torchrec.distributed.model_parallel import (
    DataParallelWrapper,
    DistributedModelParallel as _TorchRecDMP,
)
from torchrec.distributed.types import ModuleSharder, ShardingEnv, ShardingPlan

from .data_parallel import DeferredGradWrapper, DenseGradSync, UnsyncedGradientsError

__all__ = ["DistributedModelParallel", "ReplicaHooks", "UnsyncedGradientsError",
           "check_staleness"]


class ReplicaHooks:
    """What a trainer calls on every model wrapper, with the defaults of a model held once
    (1-D parallelism); :class:`~.planner.TwoDimModelParallel` (replicas across hosts) overrides
    them."""

    def step_done(self) -> bool:
        """Count a finished optimizer step; returns whether the replicas were merged now."""
        return False

    def sync_replicas(self) -> bool:
        """Merge the replicas now if they differ (collective); returns whether it did."""
        return False

    @contextlib.contextmanager
    def merged_weights(self) -> Iterator[None]:
        """Inside: the weights a merge would make (for an evaluation); the model's own after."""
        yield

    def restart_count(self, steps: int) -> None:
        """Resume the step count at ``steps`` (after loading a checkpoint)."""


def check_staleness(staleness: Any, name: str = "staleness") -> int:
    """``staleness`` as an int >= 0, or a ValueError naming the argument."""
    if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
        raise ValueError(f"{name}={staleness!r}: must be an int >= 0 (0 = synchronous)")
    return staleness


class DistributedModelParallel(_TorchRecDMP, ReplicaHooks):
    """TorchRec's ``DistributedModelParallel`` plus ``staleness`` (see the module docstring)."""

    def __init__(
        self,
        module: nn.Module,
        env: Optional[ShardingEnv] = None,
        device: Optional[torch.device] = None,
        plan: Optional[ShardingPlan] = None,
        sharders: Optional[List[ModuleSharder[nn.Module]]] = None,
        init_data_parallel: bool = True,
        init_parameters: bool = True,
        data_parallel_wrapper: Optional[DataParallelWrapper] = None,
        model_tracker_configs: Optional[Any] = None,
        staleness: int = 0,
    ) -> None:
        staleness = check_staleness(staleness)
        if staleness and not (data_parallel_wrapper is None
                              or isinstance(data_parallel_wrapper, DeferredGradWrapper)):
            raise ValueError(
                f"data_parallel_wrapper: must be None or a DeferredGradWrapper with staleness="
                f"{staleness} (the dense gradients are reduced by the pipeline, see "
                "docs/semi_async.md)")
        if staleness and data_parallel_wrapper is None:
            data_parallel_wrapper = DeferredGradWrapper()
        super().__init__(module, env=env, device=device, plan=plan, sharders=sharders,
                         init_data_parallel=init_data_parallel, init_parameters=init_parameters,
                         data_parallel_wrapper=data_parallel_wrapper,
                         model_tracker_configs=model_tracker_configs)
        self.staleness: int = staleness
        if not hasattr(self, "dense_grad_sync"):
            self.dense_grad_sync: Optional[DenseGradSync] = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        sync = self.dense_grad_sync
        if sync is not None and sync.pending and self.training and torch.is_grad_enabled():
            raise UnsyncedGradientsError(
                f"staleness={self.staleness}: the dense gradients of the last backward were "
                "never averaged over ranks; drive this model with make_train_pipeline("
                "'semi_async', ...) or call model.dense_grad_sync.start() and .wait() before "
                "the optimizer step")
        return super().forward(*args, **kwargs)
