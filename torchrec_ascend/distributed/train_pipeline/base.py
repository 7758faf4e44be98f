"""What every pipeline of this package shares: step records, the watchdog, peer failures.

:class:`InstrumentedPipeline` is TorchRec's ``TrainPipeline`` interface (``progress``) as a
mixin placed before a TorchRec pipeline class (or used alone).  Its :meth:`progress` runs the subclass's :meth:`_step` under the watchdog, turns a
collective failing on a lost peer into :class:`PeerFailureError`, closes the step's record
(:class:`StageTimer`) and hands it to ``on_step`` and ``last_stats``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, List, Optional

import torch.distributed as dist
from torch import nn
from torchrec.distributed.train_pipeline.train_pipelines import TrainPipeline

from .faults import PeerFailureError, StepWatchdog, is_peer_failure
from .stages import StageTimer

__all__ = ["InstrumentedPipeline", "dense_grad_sync_of"]


def dense_grad_sync_of(model: nn.Module) -> Any:
    """The model's :class:`DenseGradSync` (our DMP with staleness >= 1), else None (DDP or a
    single process averages gradients itself)."""
    return getattr(model, "dense_grad_sync", None)


class InstrumentedPipeline(TrainPipeline):
    """TorchRec's ``TrainPipeline``: ``progress(iterator)`` with per-step records, watchdog and
    failure wrapping.  Every pipeline also has ``detach()`` (the model with no batch in flight,
    for evaluation; TorchRec's pipelines have their own) and :meth:`close`."""

    kind: str = ""

    def _init_instrumentation(self, timer: Optional[StageTimer],
                              on_step: Optional[Callable[[dict], None]],
                              step_timeout_s: Optional[float]) -> None:
        self.timer = timer if timer is not None else StageTimer()
        self.on_step = on_step
        self.watchdog = StepWatchdog(step_timeout_s)
        self.last_stats: Optional[dict] = None
        self.stats: List[dict] = []
        self.steps_done = 0

    def close(self) -> None:
        """Stop the pipeline's background work (a batch thread); nothing by default."""

    def _step(self, iterator: Iterator[Any]) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        """Train one batch; returns the model output of that batch (StopIteration at the end)."""
        step = self.steps_done
        rank = dist.get_rank() if dist.is_initialized() else 0
        self.timer.begin_step()
        with self.watchdog.watch(f"{self.kind} pipeline step {step}"):
            try:
                out = self._step(dataloader_iter)
            except StopIteration:
                raise
            except Exception as exc:
                if is_peer_failure(exc):
                    raise PeerFailureError.of(
                        exc, f"rank {rank}: {self.kind} pipeline step {step}") from exc
                raise
        record = self.timer.end_step(step)
        record["pipeline"] = self.kind
        self.last_stats = record
        self.stats.append(record)
        if self.on_step is not None:
            self.on_step(record)
        self.steps_done += 1
        return out

    def _grad_sync(self, model: nn.Module, step: int) -> None:
        """Average dense gradients now (the synchronous pipelines' use of DenseGradSync)."""
        sync = dense_grad_sync_of(model)
        if sync is None:
            return
        sync.start()
        with self.timer.stage("grad_comm_wait", step):
            sync.wait()
