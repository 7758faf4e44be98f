"""The train-pipeline choice (``train.pipeline``): a name -> factory table.

``make_pipeline(name, model, optimizer, device)`` builds one of TorchRec's train pipelines around
a ``DistributedModelParallel`` model; :func:`register_pipeline` adds a name (the semi-async
pipeline of torchrec_ascend.distributed registers itself there).

* ``sparse_dist`` (default): ``TrainPipelineSparseDist`` -- batch i+1's input distribution
  overlaps batch i's forward / backward; the result equals synchronous training.
* ``base``: ``TrainPipelineBase`` -- device copy of the next batch overlapped, nothing else.
"""

from __future__ import annotations

from typing import Any, Callable, Dict

import torch

__all__ = ["PIPELINES", "make_pipeline", "register_pipeline"]

PipelineFactory = Callable[[torch.nn.Module, Any, torch.device], Any]


def _sparse_dist(model: torch.nn.Module, optimizer: Any, device: torch.device) -> Any:
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    return TrainPipelineSparseDist(model, optimizer, device, execute_all_batches=True)


def _base(model: torch.nn.Module, optimizer: Any, device: torch.device) -> Any:
    from torchrec.distributed.train_pipeline import TrainPipelineBase

    return TrainPipelineBase(model, optimizer, device)


PIPELINES: Dict[str, PipelineFactory] = {"sparse_dist": _sparse_dist, "base": _base}


def register_pipeline(name: str, factory: PipelineFactory) -> None:
    """Make ``train.pipeline = name`` build ``factory(model, optimizer, device)``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a non-empty string, got {name!r}")
    PIPELINES[name] = factory


def make_pipeline(name: str, model: torch.nn.Module, optimizer: Any, device: torch.device) -> Any:
    """The pipeline called ``name`` (a key of :data:`PIPELINES`)."""
    if name not in PIPELINES:
        raise ValueError(f"train.pipeline: {name!r} is not one of {sorted(PIPELINES)}")
    return PIPELINES[name](model, optimizer, device)
