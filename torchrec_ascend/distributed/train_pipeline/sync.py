"""The synchronous pipeline: copy, forward, backward, optimizer, one batch at a time.

Nothing overlaps: the lookup and all-to-alls run inside the model's forward, the sparse update
inside ``loss.backward()`` (TorchRec's fused optimizer), the dense all-reduce inside it too (DDP)
or right after it (our DMP with ``staleness >= 1``).  This is the baseline of the benchmark.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn

from .base import InstrumentedPipeline
from .stages import StageTimer

__all__ = ["SyncPipeline"]


class SyncPipeline(InstrumentedPipeline):
    """``progress(iterator)`` trains one batch synchronously; the model returns
    ``(loss, output)`` as TorchRec pipelines expect, and ``output`` is returned."""

    kind = "sync"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
                 *, timer: Optional[StageTimer] = None,
                 on_step: Optional[Callable[[dict], None]] = None,
                 step_timeout_s: Optional[float] = None) -> None:
        super().__init__()
        self._model = model
        self._optimizer = optimizer
        self._device = device
        self._init_instrumentation(timer, on_step, step_timeout_s)

    def detach(self) -> nn.Module:
        """The model (nothing is ever in flight between two steps)."""
        return self._model

    def _step(self, iterator: Iterator[Any]) -> Any:
        i = self.steps_done
        with self.timer.stage("batch_copy", i):
            batch = next(iterator)  # StopIteration ends training
            batch = batch.to(self._device, non_blocking=True)
        training = self._model.training
        if training:
            self._optimizer.zero_grad()
        with self.timer.stage("dense_fwd", i):
            losses, output = self._model(batch)
        if training:
            with self.timer.stage("dense_bwd", i):
                torch.sum(losses, dim=0).backward()
            self._grad_sync(self._model, i)
            with self.timer.stage("optimizer", i):
                self._optimizer.step()
        return output
