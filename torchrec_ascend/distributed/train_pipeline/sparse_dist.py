"""TorchRec's ``TrainPipelineSparseDist`` (through our device gates), with per-stage timing.

The batch ``i + 1`` input all-to-all overlaps batch ``i``'s forward/backward (TorchRec's own
schedule, unchanged); the hooks TorchRec exposes (``copy_batch_to_gpu``,
``start_sparse_data_dist``, ``wait_sparse_data_dist``, ``_backward``, ``_optimizer_step`` and
the model forward) are timed.  With our DMP at ``staleness >= 1`` (no DDP) the dense gradients
are averaged right after the backward, so the training stays synchronous.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn

from torchrec.distributed.train_pipeline.train_pipelines import TrainPipelineSparseDist

from .base import InstrumentedPipeline
from .stages import StageTimer

__all__ = ["SparseDistPipeline"]


class SparseDistPipeline(InstrumentedPipeline, TrainPipelineSparseDist):
    """TorchRec's sparse-dist pipeline with stage records (constructor: TorchRec's arguments
    plus ``timer``, ``on_step``, ``step_timeout_s``)."""

    kind = "sparse_dist"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
                 *, timer: Optional[StageTimer] = None,
                 on_step: Optional[Callable[[dict], None]] = None,
                 step_timeout_s: Optional[float] = None, **torchrec_kwargs: Any) -> None:
        self._init_instrumentation(timer, on_step, step_timeout_s)
        TrainPipelineSparseDist.__init__(self, model, optimizer, device,
                                         custom_model_fwd=self._timed_forward,
                                         **torchrec_kwargs)

    def _timed_forward(self, batch: Any) -> Any:
        with self.timer.stage("dense_fwd", self.steps_done):
            return self._model(batch)

    def _step(self, iterator: Iterator[Any]) -> Any:
        return TrainPipelineSparseDist.progress(self, iterator)

    def copy_batch_to_gpu(self, dataloader_iter: Iterator[Any]) -> Any:
        with self.timer.stage("batch_copy", self.steps_done):
            return TrainPipelineSparseDist.copy_batch_to_gpu(self, dataloader_iter)

    def start_sparse_data_dist(self, batch: Any, context: Any) -> None:
        with self.timer.stage("input_dist", self.steps_done):
            TrainPipelineSparseDist.start_sparse_data_dist(self, batch, context)

    def wait_sparse_data_dist(self, context: Any) -> None:
        with self.timer.stage("input_dist", self.steps_done):
            TrainPipelineSparseDist.wait_sparse_data_dist(self, context)

    def _backward(self, losses: torch.Tensor) -> None:
        with self.timer.stage("dense_bwd", self.steps_done):
            TrainPipelineSparseDist._backward(self, losses)
        self._grad_sync(self._model, self.steps_done)

    def _optimizer_step(self) -> None:
        with self.timer.stage("optimizer", self.steps_done):
            TrainPipelineSparseDist._optimizer_step(self)
