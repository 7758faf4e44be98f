"""The semi-asynchronous pipeline: lookups run ``staleness`` batches ahead of the sparse update.

Built on TorchRec's ``TrainPipelineSemiSync`` machinery (its model rewrite, its
``EmbeddingPipelinedForward`` that detaches the looked-up embeddings, ``start_embedding_lookup``
and ``embedding_backward``); the schedule is ours and takes any ``staleness = k >= 0``.

Each queued batch advances through: copied (prefetch thread) -> input-dist splits started ->
input-dist tensors requested -> looked up (local lookup done, output all-to-all launched).  The
queue holds the batch being trained (position 0) and the batches after it; position ``p``
is advanced to "looked up" for ``p <= k``, "tensors requested" for ``p == k + 1`` and "splits
started" for ``p == k + 2``.  Step ``i``:

1. dense forward of batch ``i`` (its embeddings were looked up ``k`` steps ago);
2. dense backward (gradients on the dense parameters and on the detached embeddings);
3. launch the dense gradient all-reduce (async, own process group; our DMP with staleness >= 1);
4. embedding backward: output-dist backward all-to-all + TBE fused update -> version ``i + 1``;
5. sparse work for later batches while the all-reduce runs: lookup of batch ``i + k + 1``
   (reads version ``i + 1``: exactly ``k`` updates old), input dist of ``i + k + 2``,
   ``i + k + 3``;
6. wait for the all-reduce, dense optimizer step, zero_grad.

With ``k = 0`` the lookup of batch ``i + 1`` follows batch ``i``'s update: synchronous
semantics.  ``sync_warmup_steps = W`` (TorchRec's ``start_batch``, the bounded-delay remedy for
the large early updates): the lookups run ahead only once ``W`` sparse updates have landed, so
batch ``j`` reads version ``j - min(max(j - W, 0), k)`` (batches ``0 .. W`` synchronous, then
staleness rising by one per batch to ``k``); counted from this pipeline's first update
(:attr:`sync_warmup_steps` may be lowered before training, e.g. on a resume).  Batches are read and copied to the device on a thread (:class:`BatchPrefetcher`,
``prefetch_depth`` batches ahead; ``prefetch_depth=0`` reads them inline, without a thread).
With ``track_versions=True`` a :class:`ParameterVersions` instance (``self.versions``) records
the version every lookup read, from the weights themselves.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn

from torchrec.distributed.train_pipeline.train_pipelines import TrainPipelineSemiSync

from ..model_parallel import check_staleness
from ..parameter_versions import ParameterVersions
from .base import InstrumentedPipeline, dense_grad_sync_of
from .prefetch import BatchPrefetcher
from .stages import StageTimer

__all__ = ["SemiAsyncPipeline"]

_COPIED, _SPLITS, _TENSORS, _LOOKED_UP = range(4)


class SemiAsyncPipeline(InstrumentedPipeline, TrainPipelineSemiSync):
    """``staleness``-bounded pipeline (schedule in the module docstring)."""

    kind = "semi_async"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
                 *, staleness: int = 1, timer: Optional[StageTimer] = None,
                 on_step: Optional[Callable[[dict], None]] = None,
                 step_timeout_s: Optional[float] = None, track_versions: bool = False,
                 prefetch_depth: int = 2, sync_warmup_steps: int = 0,
                 **torchrec_kwargs: Any) -> None:
        self.staleness = check_staleness(staleness)
        if isinstance(sync_warmup_steps, bool) or not isinstance(sync_warmup_steps, int) \
                or sync_warmup_steps < 0:
            raise ValueError(f"sync_warmup_steps={sync_warmup_steps!r}: must be an integer >= 0")
        self.sync_warmup_steps = sync_warmup_steps
        self.updates_done = 0  # sparse updates landed through this pipeline
        if prefetch_depth < 0:
            raise ValueError(f"prefetch_depth={prefetch_depth}: must be >= 0 (0: no thread)")
        self._init_instrumentation(timer, on_step, step_timeout_s)
        TrainPipelineSemiSync.__init__(self, model, optimizer, device, start_batch=0,
                                       stash_gradients=False, **torchrec_kwargs)
        self._track_versions = track_versions
        self.versions: Optional[ParameterVersions] = None
        self._prefetch_depth = prefetch_depth
        self._prefetcher: Optional[BatchPrefetcher] = None
        self._stage_of: dict = {}

    # --- batches: read and copied on the prefetch thread -------------------------------------
    def _next_batch(self, dataloader_iter: Iterator[Any]) -> Optional[Any]:
        if self._prefetch_depth == 0:  # inline, timed as the copy of the compute thread
            with self.timer.stage("batch_copy", self.steps_done):
                return TrainPipelineSemiSync._next_batch(self, dataloader_iter)
        if self._prefetcher is None or self._prefetcher.iterator is not dataloader_iter:
            if self._prefetcher is not None:
                self._prefetcher.close()
            self._prefetcher = BatchPrefetcher(dataloader_iter, self._device, self.timer,
                                               self._prefetch_depth)
        return self._prefetcher.next(self.steps_done)

    def _enqueue(self, dataloader_iter: Iterator[Any]) -> bool:
        if not self.enqueue_batch(dataloader_iter):
            return False
        self._stage_of[id(self.contexts[-1])] = _COPIED
        return True

    # --- advancing queued batches --------------------------------------------------------------
    def lookahead(self) -> int:
        """How many updates ahead of the training batch the lookups run now: ``staleness``
        once ``sync_warmup_steps`` updates have landed, 0 before."""
        return self.staleness if self.updates_done >= self.sync_warmup_steps else 0

    def _target(self, position: int) -> int:
        k = self.lookahead()
        if position <= k:
            return _LOOKED_UP
        if position == k + 1:
            return _TENSORS
        if position == k + 2:
            return _SPLITS
        return _COPIED

    def _advance_one(self, position: int) -> None:
        batch, ctx = self.batches[position], self.contexts[position]
        key, step = id(ctx), self.steps_done
        target = self._target(position)
        if self._stage_of[key] < _SPLITS <= target:
            with self.timer.stage("input_dist", step):
                if not self._pipelined_modules:
                    self._init_pipelined_modules(batch, ctx, self._pipelined_forward_type)
                    self._validate_optimizer()
                else:
                    TrainPipelineSemiSync.start_sparse_data_dist(self, batch, ctx)
            self._stage_of[key] = _SPLITS
        if self._stage_of[key] < _TENSORS <= target:
            with self.timer.stage("input_dist", step):
                self.wait_sparse_data_dist(ctx)
            self._stage_of[key] = _TENSORS
        if self._stage_of[key] < _LOOKED_UP <= target:
            if self._track_versions:
                if self.versions is None:
                    self.versions = ParameterVersions(self._pipelined_modules)
                    self.versions.record_update()
                self.versions.record_lookup(ctx.index)
            with self.timer.stage("lookup", step):
                self.start_embedding_lookup(batch, ctx)
            self._stage_of[key] = _LOOKED_UP

    def _advance(self, dataloader_iter: Iterator[Any]) -> None:
        """Enqueue up to ``k + 3`` batches and advance each to its position's stage."""
        while len(self.batches) < self.staleness + 3 and self._enqueue(dataloader_iter):
            pass
        for position in range(len(self.batches)):
            self._advance_one(position)

    # --- one step ------------------------------------------------------------------------------
    def _step(self, dataloader_iter: Iterator[Any]) -> Any:
        if not self._model_attached:
            self.attach(self._model)
        if not self.batches:
            self._advance(dataloader_iter)
        if not self.batches:
            raise StopIteration
        i = self.steps_done
        batch, context = self.batches[0], self.contexts[0]
        self._set_module_context(context)
        with self.timer.stage("dense_fwd", i):
            losses, output = self._mlp_forward(batch, context)
        self.dequeue_batch()
        self._stage_of.pop(id(context), None)
        del batch
        if not self._model.training:
            self._advance(dataloader_iter)
            return output
        with self.timer.stage("dense_bwd", i):
            torch.sum(losses, dim=0).backward()
        sync = dense_grad_sync_of(self._model)
        if sync is not None:
            sync.start()
        with self.timer.stage("sparse_bwd", i):
            self.embedding_backward(context)
            self.sync_embeddings(self._model, self._dmp_collection_sync_interval_batches,
                                 context)
        del context
        self.updates_done += 1
        if self.versions is not None:
            self.versions.record_update()
        self._advance(dataloader_iter)  # overlaps the dense all-reduce
        if sync is not None:
            with self.timer.stage("grad_comm_wait", i):
                sync.wait()
        with self.timer.stage("optimizer", i):
            self._optimizer.step()
            self._optimizer.zero_grad()
        return output

    def close(self) -> None:
        """Stop the prefetch thread."""
        if self._prefetcher is not None:
            self._prefetcher.close()
