"""The trainer's process group.

* :func:`init_distributed`: the job's process group -- an existing one, torchrun's environment
  (``RANK`` / ``WORLD_SIZE``), or a size-1 group for a plain ``python`` run -- with the backend
  of the training device (:func:`torchrec_ascend.device.process_group_backend`: gloo on cpu,
  gloo + HCCL on npu, gloo + NCCL on cuda).
* :func:`raise_on_every_rank`: run a step that may fail on some ranks; if any rank failed,
  every rank raises the first failure (no rank is left waiting in a collective).
"""

from __future__ import annotations

import os
import pickle
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar

import torch
import torch.distributed as dist

from .. import device as _device

__all__ = ["DistEnv", "init_distributed", "raise_on_every_rank"]

T = TypeVar("T")


@dataclass
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    created: bool  # this call created the process group (destroy it at the end)


def init_distributed(device_type: Optional[str] = None) -> DistEnv:
    """Join (or create) the default process group and pick this rank's device."""
    kind = device_type or _device.device_type()
    created = False
    if not dist.is_initialized():
        backend = _device.process_group_backend(kind)
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend)
        else:
            fd, store = tempfile.mkstemp(prefix="torchrec-ascend-pg-")
            os.close(fd)
            os.remove(store)
            dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1)
        created = True
    rank, world = dist.get_rank(), dist.get_world_size()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    local_rank = int(os.environ.get("LOCAL_RANK", rank % local_world))
    if kind == "cpu":
        device = torch.device("cpu")
    else:
        device = torch.device(kind, local_rank)
        _device.device_module(kind).set_device(device)
    return DistEnv(rank, world, local_rank, local_world, device, created)


def raise_on_every_rank(fn: Callable[[], T]) -> T:
    """``fn()``; if it raised on any rank, every rank raises: the failing rank its own error,
    the others the lowest failing rank's (errors travel pickled; DataError is picklable)."""
    error: Optional[BaseException] = None
    out: Any = None
    try:
        out = fn()
    except Exception as e:  # shared below
        error = e
    if not dist.is_initialized() or dist.get_world_size() == 1:
        if error is not None:
            raise error
        return out
    mine: Optional[BaseException] = None
    if error is not None:
        try:
            pickle.dumps(error)
            mine = error
        except Exception:
            mine = RuntimeError(f"{type(error).__name__}: {error}")
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    if error is not None:
        raise error
    for item in gathered:
        if item is not None:
            raise item
    return out
