"""The one module that knows about devices.

Detection order (unless overridden): ``npu`` (``torch_npu`` importable *and* a device visible),
``cuda``, ``cpu``.  ``TORCHREC_ASCEND_DEVICE=npu|cuda|cpu`` overrides detection.

Streams and events go through ``torch.accelerator`` / ``torch.Stream`` / ``torch.Event`` where the
device has them, so that no other file in the package writes ``torch.cuda.*`` or ``torch.npu.*``.
On CPU, :func:`new_stream` returns ``None`` and :func:`stream_context` is a no-op context: code
written against this module runs unchanged on every device.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
from typing import Iterator, Optional, Union

import torch

__all__ = [
    "ENV_DEVICE",
    "KNOWN_DEVICE_TYPES",
    "torch_npu_available",
    "npu_available",
    "is_available",
    "device_type",
    "default_device",
    "device_module",
    "has_streams",
    "new_stream",
    "current_stream",
    "stream_context",
    "new_event",
    "synchronize",
    "record_stream",
    "device_of",
    "process_group_backend",
]

ENV_DEVICE = "TORCHREC_ASCEND_DEVICE"
KNOWN_DEVICE_TYPES = ("npu", "cuda", "cpu")

DeviceLike = Union[str, torch.device, None]


@functools.lru_cache(maxsize=None)
def torch_npu_available() -> bool:
    """True when ``torch_npu`` imports (it needs Huawei CANN; on these machines it does not)."""
    try:
        importlib.import_module("torch_npu")
    except Exception:  # ImportError, or CANN libraries missing (OSError/RuntimeError)
        return False
    return True


def npu_available() -> bool:
    """True when torch_npu imports and at least one NPU is visible."""
    if not torch_npu_available():
        return False
    npu = getattr(torch, "npu", None)
    return bool(npu is not None and npu.is_available() and npu.device_count() > 0)


def is_available(kind: str) -> bool:
    """Whether a device of type ``kind`` (npu, cuda, cpu) is usable in this process."""
    if kind == "npu":
        return npu_available()
    if kind == "cuda":
        return torch.cuda.is_available()
    if kind == "cpu":
        return True
    raise ValueError(f"kind={kind!r}: must be one of {', '.join(KNOWN_DEVICE_TYPES)}")


def _detect() -> str:
    if npu_available():
        return "npu"
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def device_type() -> str:
    """The device type this process trains on: the override, else the best one detected."""
    forced = os.environ.get(ENV_DEVICE, "").strip().lower()
    if forced:
        if forced not in KNOWN_DEVICE_TYPES:
            raise ValueError(
                f"{ENV_DEVICE}={forced!r}: must be one of {', '.join(KNOWN_DEVICE_TYPES)}"
            )
        return forced
    return _detect()


def default_device(local_rank: int = 0) -> torch.device:
    """``torch.device`` for this process: ``npu:<local_rank>``, ``cuda:<local_rank>`` or ``cpu``."""
    kind = device_type()
    if kind == "cpu":
        return torch.device("cpu")
    try:
        return torch.device(kind, local_rank)
    except RuntimeError as exc:
        raise ValueError(
            f"device {kind!r} selected (by {ENV_DEVICE} or detection) but torch knows no such "
            f"device type: import torch_npu (or enable the simulated npu) first ({exc})"
        ) from None


def _as_type(device: DeviceLike) -> str:
    if device is None:
        return device_type()
    return torch.device(device).type


def device_of(t: torch.Tensor) -> str:
    """Device type of a tensor, with PrivateUse1 reported under its registered name (``npu``)."""
    return t.device.type


def device_module(device: DeviceLike = None):
    """``torch.npu`` / ``torch.cuda`` / ``torch.cpu`` for the device (the only such lookup)."""
    kind = _as_type(device)
    mod = getattr(torch, kind, None)
    if mod is None:
        raise ValueError(f"device {kind!r}: torch has no module torch.{kind} (is its plugin imported?)")
    return mod


def has_streams(device: DeviceLike = None) -> bool:
    """Whether the device has real asynchronous streams (npu, cuda); cpu does not."""
    return _as_type(device) != "cpu"


def new_stream(device: DeviceLike = None, priority: int = 0) -> Optional[torch.Stream]:
    """A new side stream on the device, or ``None`` on cpu."""
    dev = torch.device(device) if device is not None else default_device()
    if not has_streams(dev):
        return None
    return torch.Stream(device=dev, priority=priority)


def current_stream(device: DeviceLike = None) -> Optional[torch.Stream]:
    """The current stream of the device, or ``None`` on cpu."""
    dev = torch.device(device) if device is not None else default_device()
    if not has_streams(dev):
        return None
    return device_module(dev).current_stream(dev)


@contextlib.contextmanager
def stream_context(stream: Optional[torch.Stream]) -> Iterator[None]:
    """Make ``stream`` current inside the block; a no-op for ``None`` (cpu)."""
    if stream is None:
        yield
        return
    with stream:
        yield


def new_event(device: DeviceLike = None, enable_timing: bool = False) -> Optional[torch.Event]:
    """A device event, or ``None`` on cpu (where work is synchronous)."""
    dev = torch.device(device) if device is not None else default_device()
    if not has_streams(dev):
        return None
    return torch.Event(device=dev, enable_timing=enable_timing)


def record_stream(t: torch.Tensor, stream: Optional[torch.Stream]) -> None:
    """``t.record_stream(stream)`` where it means something; a no-op on cpu or with no stream."""
    if stream is None or t.device.type == "cpu":
        return
    t.record_stream(stream)


def synchronize(device: DeviceLike = None) -> None:
    """Wait for all work on the device; a no-op on cpu."""
    dev = torch.device(device) if device is not None else default_device()
    if has_streams(dev):
        device_module(dev).synchronize(dev)


def process_group_backend(device: DeviceLike = None) -> str:
    """``init_process_group`` backend for the device: ``gloo`` on cpu; on npu / cuda gloo for
    cpu tensors beside HCCL / NCCL for device tensors (``cpu:gloo,npu:hccl``).  A device type
    name (``"npu"``) is accepted even where torch does not know the device."""
    kind = device if isinstance(device, str) and device in KNOWN_DEVICE_TYPES else _as_type(device)
    if kind == "cpu":
        return "gloo"
    accel = {"npu": "hccl", "cuda": "nccl"}.get(kind)
    if accel is None:
        raise ValueError(f"device {kind!r}: no process-group backend known (npu, cuda, cpu)")
    return f"cpu:gloo,{kind}:{accel}"
