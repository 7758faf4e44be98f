"""A simulated Ascend NPU for tests: device ``npu`` on a machine without one.

Used only when ``torch_npu`` does not import (with ``torch_npu`` present, :func:`enable` does
nothing and the tests target the real device).  :func:`enable` loads the small C++ extension
``torchrec_ascend._simnpu`` (``csrc/simnpu/``, built after the pattern of PyTorch's out-of-tree
"openreg" reference backend) and

* renames PyTorch's ``PrivateUse1`` backend to ``"npu"`` and generates the ``Tensor.npu()`` /
  ``Module.npu()`` methods;
* installs a host-memory allocator, a device guard with streams and events, and device hooks:
  ``torch.empty(..., device="npu:1")`` gives a real PrivateUse1 tensor whose bytes live in
  ordinary host memory;
* serves tensor creation, views, ``as_strided``, ``resize_``, ``set_`` and copies with real
  PrivateUse1 kernels, and every other **aten** op with PyTorch's boxed CPU fallback (the CPU
  kernel runs on CPU copies of the arguments; in-place and ``out=`` results are copied back);
* **refuses** every ``fbgemm::*`` and ``torchrec_ascend::*`` op that has no PrivateUse1 kernel,
  with ``NotImplementedError: no npu kernel for fbgemm::<op>``: those ops are served only by the
  PrivateUse1 registrations of :mod:`torchrec_ascend.ops`, never silently by fbgemm's CPU
  kernels.  fbgemm ops with a ``CompositeExplicitAutograd`` kernel (which would otherwise run
  for PrivateUse1 too) are masked the same way;
* registers ``torch.npu`` (:class:`_NpuModule`: ``Stream``, ``Event``, ``current_stream``,
  ``stream``, ``synchronize``, ``device_count``, ``set_device``, ...), and a c10d backend
  ``"simnpu"`` for device ``npu`` that hands gloo zero-copy CPU views of ``npu`` tensors.

Limits (it is test infrastructure, not an emulator):

* Work is synchronous.  Streams and events exist (ids, a current stream per thread, event
  timestamps) but every wait, query and synchronize completes at once, so stream-ordering bugs
  (a missing ``wait_stream`` / ``record_stream``) are *not* detected.
* Memory is unlimited host memory: no HBM capacity, no caching allocator, no memory stats.
* aten ops run CPU kernels: dtype support, numerics and performance are the CPU's (bf16/fp16
  matmuls are slow), not the NPU's.  Random numbers come from the CPU generator.
* One process sees ``TORCHREC_ASCEND_SIMNPU_DEVICES`` devices (default 8); they share memory.
* Pinned host memory is ordinary host memory whose blocks are remembered (``is_pinned()`` is
  true for them; DDP's reducer asks for it).
* ``torch.compile``, autocast and sparse tensors are not supported on it.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
import types
from datetime import timedelta
from typing import Iterator, List, Optional, Union

import torch

from .. import device as _device

__all__ = [
    "DEVICE_TYPE",
    "DIST_BACKEND",
    "available",
    "enable",
    "is_enabled",
    "dist_backend",
    "without_kernel",
    "masked_composite_fbgemm_ops",
]

DEVICE_TYPE = "npu"
DIST_BACKEND = "simnpu"

_LOCK = threading.RLock()
_ENABLED = False
_EXT = None
_MASKED_COMPOSITE: List[str] = []


def _extension():
    """The compiled ``torchrec_ascend._simnpu`` module (raises ImportError with the fix)."""
    global _EXT
    if _EXT is None:
        try:
            _EXT = importlib.import_module("torchrec_ascend._simnpu")
        except ImportError as e:
            raise ImportError(
                "torchrec_ascend._simnpu (csrc/simnpu/) is not built: run `make build` "
                f"(pip install --no-build-isolation -e .): {e}"
            ) from e
    return _EXT


def available() -> bool:
    """True when the simulated device can be enabled here (no torch_npu, extension built)."""
    if _device.torch_npu_available():
        return False
    try:
        _extension()
    except ImportError:
        return False
    return True


def is_enabled() -> bool:
    """True once :func:`enable` has installed the simulated device in this process."""
    return _ENABLED


# --------------------------------------------------------------------------- torch.npu shim


def _index(device: Union[int, str, torch.device, None]) -> int:
    if device is None:
        return _extension().current_device()
    if isinstance(device, int):
        return device
    d = torch.device(device)
    if d.type != DEVICE_TYPE:
        raise ValueError(f"device={device!r}: expected an {DEVICE_TYPE} device")
    return _extension().current_device() if d.index is None else d.index


def _npu(device: Union[int, str, torch.device, None]) -> torch.device:
    return torch.device(DEVICE_TYPE, _index(device))


class _Stream(torch.Stream):
    """The ``Stream`` class of the simulated ``npu`` module: a :class:`torch.Stream` of the simulated device."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        return super().__new__(cls, device=_npu(device), priority=priority)


class _Event(torch.Event):
    """The ``Event`` class of the simulated ``npu`` module: a :class:`torch.Event` of the simulated device."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        return super().__new__(cls, device=_npu(None), enable_timing=enable_timing)


class _DeviceContext:
    """The ``device(i)`` context of the simulated ``npu`` module: make device ``i`` current inside the block."""

    def __init__(self, device) -> None:
        self.idx = _index(device)
        self.prev = -1

    def __enter__(self):
        self.prev = _extension().current_device()
        _extension().set_device(self.idx)

    def __exit__(self, *exc) -> None:
        _extension().set_device(self.prev)


def _make_npu_module() -> types.ModuleType:
    """The ``torch.npu`` module of the simulated device (CPU-like: synchronous, host memory)."""
    ext = _extension()
    m = types.ModuleType("torch.npu", "Simulated NPU device module (torchrec_ascend.testing)")
    m.Stream = _Stream
    m.Event = _Event
    m.device = _DeviceContext
    m.is_available = lambda: True
    m.is_initialized = lambda: True
    m.init = lambda: None
    m._is_in_bad_fork = lambda: False
    m._lazy_init = lambda: None
    m.device_count = lambda: ext.device_count()
    m.current_device = lambda: ext.current_device()
    m.set_device = lambda device: ext.set_device(_index(device))

    def current_stream(device=None) -> torch.Stream:
        return torch.accelerator.current_stream(_npu(device))

    def default_stream(device=None) -> torch.Stream:
        d = _npu(device)
        return torch.Stream(stream_id=0, device_index=d.index, device_type=d.type)

    def set_stream(stream: torch.Stream) -> None:
        torch.accelerator.set_stream(stream)

    @contextlib.contextmanager
    def stream(s: Optional[torch.Stream]) -> Iterator[None]:
        if s is None:
            yield
            return
        with s:
            yield

    m.current_stream = current_stream
    m.default_stream = default_stream
    m.set_stream = set_stream
    m.stream = stream
    m.synchronize = lambda device=None: torch.accelerator.synchronize(_npu(device))
    # random numbers of the simulated device come from the CPU generator (seeded by torch)
    m.manual_seed = lambda seed: None
    m.manual_seed_all = lambda seed: None
    m.seed = lambda: None
    m.seed_all = lambda: None
    m.get_rng_state = lambda device=None: torch.get_rng_state()
    m.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
    m.memory_allocated = lambda device=None: 0
    m.max_memory_allocated = lambda device=None: 0
    m.empty_cache = lambda: None
    return m


# --------------------------------------------------------------------------- c10d


def _create_backend(opts, pg_options):
    """c10d creator of the ``simnpu`` backend: gloo behind zero-copy host views."""
    from torch.distributed import ProcessGroupGloo

    timeout = opts.timeout if opts.timeout is not None else timedelta(minutes=5)
    inner = ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, timeout)
    return _extension().HostStagingBackend(inner)


def dist_backend() -> str:
    """``init_process_group`` backend string for ``npu`` tests: the simulated device's staging
    backend beside gloo, or HCCL on a real NPU."""
    if _device.torch_npu_available():
        return "cpu:gloo,npu:hccl"
    enable()
    return f"cpu:gloo,{DEVICE_TYPE}:{DIST_BACKEND}"


# --------------------------------------------------------------------------- enabling


def _composite_fbgemm_ops() -> List[str]:
    """fbgemm ops that would run on PrivateUse1 through a CompositeExplicitAutograd kernel."""
    out = []
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("fbgemm::"):
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1"):
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeExplicitAutograd"):
            out.append(name)
    return sorted(out)


def masked_composite_fbgemm_ops() -> List[str]:
    """The fbgemm ops :func:`enable` masked because of a CompositeExplicitAutograd kernel."""
    return list(_MASKED_COMPOSITE)


def enable() -> bool:
    """Install the simulated ``npu`` device in this process (idempotent).

    Returns False, and does nothing, when ``torch_npu`` imports (a real NPU stack is present);
    True when the simulated device is active.  Call it before creating any ``npu`` tensor.
    """
    global _ENABLED
    if _device.torch_npu_available():
        return False
    with _LOCK:
        if _ENABLED:
            return True
        ext = _extension()
        current = torch._C._get_privateuse1_backend_name()
        if current != DEVICE_TYPE:
            if current != "privateuseone":
                raise RuntimeError(
                    f"PrivateUse1 is already named {current!r}; the simulated npu needs it"
                )
            torch.utils.rename_privateuse1_backend(DEVICE_TYPE)
        ext.register_runtime()
        if getattr(getattr(torch, DEVICE_TYPE, None), "OFFLINE_PLACEHOLDER", False):
            # the planner's "no device here" module (planner.topology.ensure_device_name)
            delattr(torch, DEVICE_TYPE)
            sys.modules.pop(f"torch.{DEVICE_TYPE}", None)
            torch.get_device_module.cache_clear()  # it memoises the module per device name
        if not hasattr(torch, DEVICE_TYPE):
            torch._register_device_module(DEVICE_TYPE, _make_npu_module())
        if not hasattr(torch.Tensor, "is_npu"):
            torch.utils.generate_methods_for_privateuse1_backend(
                for_tensor=True, for_module=True, for_storage=True
            )
        # our PrivateUse1 kernels of fbgemm::* / torchrec_ascend::* must exist before masking
        importlib.import_module("torchrec_ascend.ops")
        for name in _composite_fbgemm_ops():
            ext.mask(name)
            _MASKED_COMPOSITE.append(name)
        import torch.distributed as dist

        if dist.is_available() and DIST_BACKEND.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(
                DIST_BACKEND, _create_backend, extended_api=True, devices=[DEVICE_TYPE]
            )
        _ENABLED = True
        return True


@contextlib.contextmanager
def without_kernel(qualname: str) -> Iterator[None]:
    """Inside the block, ``qualname`` (e.g. ``"fbgemm::permute_2D_sparse_data"``) has no npu
    kernel: its PrivateUse1 dispatch reaches the fallback, exactly as if torchrec_ascend had not
    registered it.  Proves that a forgotten op fails loudly on the simulated device."""
    if not _ENABLED:
        raise RuntimeError("without_kernel needs the simulated npu: call enable() first")
    if "::" not in qualname:
        raise ValueError(f"qualname={qualname!r}: must be 'namespace::op'")
    ext = _extension()
    if qualname in _MASKED_COMPOSITE:  # already without an npu kernel
        yield
        return
    ext.mask(qualname)
    try:
        yield
    finally:
        ext.unmask(qualname)
