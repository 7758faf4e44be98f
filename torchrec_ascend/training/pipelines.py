"""The trainer's model wrapper and train pipeline (``train.pipeline``, ``train.staleness``).

There is one pipeline table: :data:`torchrec_ascend.distributed.train_pipeline.KINDS`, built by
:func:`torchrec_ascend.distributed.make_train_pipeline`.  This module only adapts it to the
trainer:

* :func:`wrap_model`: torchrec_ascend's ``DistributedModelParallel(staleness=k)`` (or, with
  ``train.planner = "hierarchical_2d"``, TorchRec's ``DMPCollection`` of the 2-D plan).  The trainer
  scales each rank's loss by 1 / (queries of the global batch), so dense gradients are
  **summed** over ranks: DDP with :class:`~.distributed.SumDataParallelWrapper` at ``k = 0``
  (TorchRec's synchronous semantics exactly), ``DeferredGradWrapper(average=False)`` at
  ``k >= 1`` (the semi-async pipeline starts the all-reduce after the dense backward and waits
  for it before the optimizer step).
* :func:`make_pipeline`: ``sync`` | ``sparse_dist`` | ``semi_async`` with the step watchdog
  of ``train.step_timeout_s``.
* :func:`step_row`: a pipeline's per-step record as the flat row log.jsonl / TensorBoard get;
  :func:`draw_pipeline_png`: ``pipeline.png`` of a few steps.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

import torch

from ..distributed.train_pipeline import (KINDS, InstrumentedPipeline, PipelineKind,
                                          make_train_pipeline)

__all__ = ["KINDS", "wrap_model", "make_pipeline", "step_row", "draw_pipeline_png"]


def wrap_model(module: torch.nn.Module, device: torch.device, plan: Any, sharders: List[Any],
               staleness: int, planner: Any = None, replica_merge: str = "mean"
               ) -> torch.nn.Module:
    """``module`` sharded by ``plan`` under torchrec_ascend's DistributedModelParallel with the
    staleness bound ``staleness``; dense gradients summed over ranks (module docstring).  When
    ``planner`` is a :class:`~torchrec_ascend.distributed.planner.TwoDimShardingPlanner` (and
    ``staleness`` 0), its 2-D model instead: ``plan`` inside each host, replicas across hosts
    (:func:`~torchrec_ascend.distributed.planner.two_dim_model`, TorchRec's ``DMPCollection``),
    dense gradients summed over the whole world, the replicas merged by ``replica_merge``
    (:class:`~torchrec_ascend.distributed.planner.TwoDimModelParallel`'s ``merge``)."""
    from ..distributed import DistributedModelParallel
    from ..distributed.data_parallel import DeferredGradWrapper, SumDataParallelWrapper
    from ..distributed.planner import TwoDimShardingPlanner, two_dim_model

    if isinstance(planner, TwoDimShardingPlanner):
        if staleness:
            raise ValueError(f"staleness={staleness}: 2-D parallelism runs synchronously (0)")
        return two_dim_model(module, planner, device, sharders, plan=plan,
                             data_parallel_wrapper=SumDataParallelWrapper(), merge=replica_merge)
    wrapper = SumDataParallelWrapper() if staleness == 0 else DeferredGradWrapper(average=False)
    return DistributedModelParallel(module, device=device, plan=plan, sharders=sharders,
                                    data_parallel_wrapper=wrapper, staleness=staleness)


def make_pipeline(kind: PipelineKind, model: torch.nn.Module, optimizer: Any,
                  device: torch.device, staleness: int = 0,
                  step_timeout_s: Union[float, str, None] = None, track_versions: bool = False,
                  sync_warmup_steps: int = 0) -> InstrumentedPipeline:
    """The pipeline ``kind`` (a name of :data:`KINDS`) over ``model`` (see
    :func:`torchrec_ascend.distributed.make_train_pipeline` for the rules; ``track_versions``:
    ``semi_async`` records the parameter version every lookup read, for tests;
    ``sync_warmup_steps``: ``semi_async``'s synchronous first steps)."""
    from ..distributed.planner import TwoDimModelParallel

    extra: Dict[str, Any] = {}
    if kind == "sparse_dist" and isinstance(model, TwoDimModelParallel):
        # a 2-D model syncs its replicas in its own step_done (every train.sync_every steps);
        # TorchRec's TrainPipelineSparseDist would also sync a DMPCollection after every batch
        extra["dmp_collection_sync_interval_batches"] = None
    return make_train_pipeline(kind, model, optimizer, device, staleness=staleness,
                               step_timeout_s=step_timeout_s, track_versions=track_versions,
                               sync_warmup_steps=sync_warmup_steps, **extra)


def step_row(record: Dict[str, Any]) -> Dict[str, float]:
    """``{"step_ms", "busy_fraction", "stage_ms/<stage>": ms ...}`` of a pipeline step record."""
    row = {"step_ms": float(record["step_ms"]), "busy_fraction": float(record["busy_fraction"])}
    for stage, ms in sorted(record["stages_ms"].items()):
        row[f"stage_ms/{stage}"] = float(ms)
    return row


def draw_pipeline_png(pipeline: InstrumentedPipeline, path: str, num_steps: int = 4,
                      title: str = "") -> Optional[str]:
    """Draw ``num_steps`` consecutive steps of the pipeline's kept spans at ``path``: the
    middle of what is kept (away from the start-up and the final drain).  None when no step
    was recorded."""
    from ..distributed.train_pipeline import draw_timeline

    steps = sorted({s.step for s in pipeline.timer.spans if s.step >= 0})
    if not steps:
        return None
    first = max(0, len(steps) // 2 - num_steps // 2)
    return draw_timeline(pipeline.timer.spans, path, steps=steps[first:first + num_steps],
                         title=title)
