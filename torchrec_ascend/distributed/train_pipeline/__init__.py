"""Train pipelines, device-agnostic (npu / cuda / cpu), with per-stage timing.

The one entry point the trainer calls::

    make_train_pipeline(kind: str, model: nn.Module, optimizer: torch.optim.Optimizer,
                        device: torch.device, *, staleness: int | None = None,
                        on_step: Callable[[dict], None] | None = None,
                        step_timeout_s: float | None = None,
                        track_versions: bool = False, sync_warmup_steps: int = 0,
                        **torchrec_kwargs) -> pipeline

* ``kind``: ``"sync"`` (:class:`SyncPipeline`: copy, forward, backward, optimizer, nothing
  overlapped), ``"sparse_dist"`` (:class:`SparseDistPipeline`: TorchRec's
  TrainPipelineSparseDist through our gates; batch ``i + 1`` input dist overlaps batch ``i``),
  ``"semi_async"`` (:class:`SemiAsyncPipeline`: batch copy on a thread, input dist and lookups
  ``staleness`` batches ahead, dense all-reduce overlapping the next sparse work).
* ``model``: a TorchRec ``DistributedModelParallel`` (ours or TorchRec's) whose forward takes a
  batch and returns ``(loss, output)``; ``optimizer``: the dense optimizer (sparse tables use
  TorchRec's fused in-backward optimizer).
* ``staleness``: ``None`` takes ``model.staleness`` (0 for TorchRec's DMP).  ``sync`` and
  ``sparse_dist`` are synchronous and accept only 0.  Given together with our DMP it must equal
  ``model.staleness``.
* ``on_step(record)``: called after every step with the step's record (a plain dict:
  ``step``, ``step_ms``, ``stages_ms`` {stage: ms}, ``busy_fraction``, ``pipeline``; see
  :mod:`.stages`); the same dict is ``pipeline.last_stats`` and appended to ``pipeline.stats``.
  ``pipeline.timer.spans`` feeds :func:`draw_timeline` (``pipeline.png``).
* ``step_timeout_s``: a step that runs longer ends the process with a clear error (a dead or
  hung peer; :mod:`.faults`); a collective failing on a dead peer raises
  :class:`PeerFailureError`.
* ``track_versions`` (``semi_async`` only): ``pipeline.versions`` records, from the weights,
  which parameter version every lookup read (:class:`ParameterVersions`).
* ``sync_warmup_steps`` (``semi_async`` only): the lookups run ahead only after this many
  synchronous steps (TorchRec's ``start_batch``; :class:`SemiAsyncPipeline`).
* ``torchrec_kwargs``: passed to the pipeline class and on to TorchRec's pipeline constructor
  (``sparse_dist``, ``semi_async``), e.g. ``execute_all_batches``, ``apply_jit``;
  ``semi_async`` also takes ``prefetch_depth`` (batches the copy thread reads ahead, default 2;
  0 reads them inline on the compute thread).

``pipeline.progress(iterator)`` trains one batch and returns the model's output for it;
``StopIteration`` when the iterator is exhausted and every queued batch is trained.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import nn

from ..semi_async import check_staleness
from .base import InstrumentedPipeline
from .faults import WATCHDOG_EXIT_CODE, PeerFailureError, StepWatchdog
from .semi_async import SemiAsyncPipeline
from .sparse_dist import SparseDistPipeline
from .stages import COMPUTE_STAGES, STAGES, StageTimer
from .sync import SyncPipeline
from .timeline import draw_timeline

__all__ = [
    "KINDS",
    "COMPUTE_STAGES",
    "STAGES",
    "InstrumentedPipeline",
    "PeerFailureError",
    "SemiAsyncPipeline",
    "SparseDistPipeline",
    "StageTimer",
    "StepWatchdog",
    "SyncPipeline",
    "WATCHDOG_EXIT_CODE",
    "draw_timeline",
    "make_train_pipeline",
]

KINDS = ("sync", "sparse_dist", "semi_async")


def make_train_pipeline(kind: str, model: nn.Module, optimizer: torch.optim.Optimizer,
                        device: torch.device, *, staleness: Optional[int] = None,
                        on_step: Optional[Callable[[dict], None]] = None,
                        step_timeout_s: Optional[float] = None, track_versions: bool = False,
                        sync_warmup_steps: int = 0,
                        **torchrec_kwargs: Any) -> InstrumentedPipeline:
    """The pipeline ``kind`` over ``model`` (arguments in the module docstring)."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: must be one of {', '.join(KINDS)}")
    if not isinstance(device, torch.device):
        raise ValueError(f"device={device!r}: must be a torch.device")
    model_staleness = getattr(model, "staleness", None)
    if staleness is None:
        staleness = model_staleness if model_staleness is not None else 0
    staleness = check_staleness(staleness)
    if model_staleness is not None and staleness != model_staleness:
        raise ValueError(f"staleness={staleness}: must equal model.staleness={model_staleness} "
                         "(set it on DistributedModelParallel(..., staleness=k))")
    common = dict(on_step=on_step, step_timeout_s=step_timeout_s)
    if kind == "semi_async":
        return SemiAsyncPipeline(model, optimizer, device, staleness=staleness,
                                 track_versions=track_versions,
                                 sync_warmup_steps=sync_warmup_steps, **common, **torchrec_kwargs)
    if staleness:
        raise ValueError(f"staleness={staleness}: pipeline {kind!r} is synchronous, it needs "
                         "staleness 0 (use kind='semi_async' for k >= 1)")
    if track_versions:
        raise ValueError("track_versions: only the 'semi_async' pipeline tracks versions")
    if sync_warmup_steps:
        raise ValueError(f"sync_warmup_steps={sync_warmup_steps!r}: only the 'semi_async' "
                         f"pipeline has a warm-up ({kind!r} is synchronous throughout)")
    if kind == "sync":
        if torchrec_kwargs:
            raise ValueError(f"{sorted(torchrec_kwargs)}: the 'sync' pipeline takes no "
                             "TorchRec pipeline arguments")
        return SyncPipeline(model, optimizer, device, **common)
    return SparseDistPipeline(model, optimizer, device, **common, **torchrec_kwargs)
