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

from typing import Any, Callable, Literal, Optional

import torch
from torch import nn

from ...options import Key, OptionError, check_choice, choices
from .base import InstrumentedPipeline
from .faults import WATCHDOG_EXIT_CODE, PeerFailureError, StepWatchdog
from .semi_async import SemiAsyncPipeline
from .sparse_dist import SparseDistPipeline
from .stages import COMPUTE_STAGES, STAGES, StageTimer
from .sync import SyncPipeline
from .timeline import draw_timeline

__all__ = [
    "KINDS",
    "PipelineKind",
    "check_pipeline_options",
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

PipelineKind = Literal["sync", "sparse_dist", "semi_async"]
"""``train.pipeline``: the plain loop, TorchRec's TrainPipelineSparseDist, or the k-ahead
semi-asynchronous schedule."""
KINDS = choices(PipelineKind)


def _count(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise OptionError(key, f"{value!r} is not an integer >= 0")
    return value


def check_pipeline_options(kind: PipelineKind, staleness: int, sync_warmup_steps: int = 0,
                           track_versions: bool = False, key: Key = str) -> None:
    """The pipeline options' rules, in one place (the trainer's config and
    :func:`make_train_pipeline` both call it): ``kind`` one of :data:`KINDS`; ``staleness`` k
    >= 0, and k >= 1 only with ``semi_async`` (the others are synchronous);
    ``sync_warmup_steps`` >= 0, and > 0 only with k >= 1; ``track_versions`` only with
    ``semi_async``.  ``key`` names the options in the error (:data:`~torchrec_ascend.options.Key`)."""
    check_choice(key("pipeline"), kind, PipelineKind)
    _count(key("staleness"), staleness)
    _count(key("sync_warmup_steps"), sync_warmup_steps)
    if staleness and kind != "semi_async":
        raise OptionError(key("staleness"), f"{staleness} needs {key('pipeline')}='semi_async' "
                                            f"(pipeline {kind!r} is synchronous: 0 only)")
    if sync_warmup_steps and not staleness:
        raise OptionError(key("sync_warmup_steps"),
                          f"{sync_warmup_steps} needs {key('staleness')} >= 1 (at staleness 0 "
                          "every step is synchronous)")
    if track_versions and kind != "semi_async":
        raise OptionError(key("track_versions"), "only the 'semi_async' pipeline tracks versions")


def _argument(name: str) -> str:
    return "kind" if name == "pipeline" else name


def make_train_pipeline(kind: PipelineKind, model: nn.Module, optimizer: torch.optim.Optimizer,
                        device: torch.device, *, staleness: Optional[int] = None,
                        on_step: Optional[Callable[[dict], None]] = None,
                        step_timeout_s: Optional[float] = None, track_versions: bool = False,
                        sync_warmup_steps: int = 0,
                        **torchrec_kwargs: Any) -> InstrumentedPipeline:
    """The pipeline ``kind`` over ``model`` (arguments in the module docstring)."""
    if not isinstance(device, torch.device):
        raise ValueError(f"device={device!r}: must be a torch.device")
    model_staleness = getattr(model, "staleness", None)
    if staleness is None:
        staleness = model_staleness if model_staleness is not None else 0
    check_pipeline_options(kind, staleness, sync_warmup_steps, track_versions, key=_argument)
    if model_staleness is not None and staleness != model_staleness:
        raise ValueError(f"staleness={staleness}: must equal model.staleness={model_staleness} "
                         "(set it on DistributedModelParallel(..., staleness=k))")
    common = dict(on_step=on_step, step_timeout_s=step_timeout_s)
    if kind == "semi_async":
        return SemiAsyncPipeline(model, optimizer, device, staleness=staleness,
                                 track_versions=track_versions,
                                 sync_warmup_steps=sync_warmup_steps, **common, **torchrec_kwargs)
    if kind == "sync":
        if torchrec_kwargs:
            raise ValueError(f"{sorted(torchrec_kwargs)}: the 'sync' pipeline takes no "
                             "TorchRec pipeline arguments")
        return SyncPipeline(model, optimizer, device, **common)
    return SparseDistPipeline(model, optimizer, device, **common, **torchrec_kwargs)
