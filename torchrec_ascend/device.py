"""The one module that knows about devices.

Detection order (unless overridden): ``npu`` (``torch_npu`` importable *and* a device visible),
``cuda``, ``cpu``.  ``TORCHREC_ASCEND_DEVICE=npu|cuda|cpu`` overrides detection.

Streams and events go through ``torch.accelerator`` / ``torch.Stream`` / ``torch.Event`` where the
device has them, so that no other file in the package writes ``torch.cuda.*`` or ``torch.npu.*``.
On CPU, :func:`new_stream` returns ``None`` and :func:`stream_context` is a no-op context: code
written against this module runs unchanged on every device.

GEMM precision: :func:`fastest_gemm_dtype` (``float32`` or a half dtype) and
:func:`gemm_capability` (the measured GFLOP/s per dtype) -- measured once per process and cached.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Mapping, Optional, Sequence, Tuple, Union

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
    "ENV_GEMM_DTYPE",
    "GEMM_DTYPES",
    "GemmCapability",
    "parse_dtype",
    "dtype_name",
    "cpu_flags",
    "half_dtypes_with_hardware",
    "measure_gemm_gflops",
    "choose_gemm_dtype",
    "gemm_capability",
    "fastest_gemm_dtype",
    "gemm_dtype_is_fast",
    "GEMM_ROW_MULTIPLE",
    "gemm_row_multiple",
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


# --------------------------------------------------------------------------- GEMM precision
#
# Which dtype a device multiplies fastest is a measured property, not a rule: AVX2-only CPUs run
# bf16/fp16 GEMM ~100x slower than fp32, AVX512-BF16 CPUs run bf16 2-3x faster (oneDNN), AMX
# CPUs ~4x faster, NPUs and GPUs much faster still.  On CPU the flags say which half formats have
# hardware support at all (only those are timed: a slow half GEMM takes seconds), then a short
# GEMM measurement decides.  npu/cuda always have fast bf16.

ENV_GEMM_DTYPE = "TORCHREC_ASCEND_GEMM_DTYPE"
GEMM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_DTYPE_NAMES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
# a half dtype is chosen only if it beats fp32 by this factor (noise on a loaded machine is ~10%)
FASTER_MARGIN = 1.15
# CPU flags (``/proc/cpuinfo``) that give each half format native GEMM instructions
_CPU_HALF_FLAGS = {torch.bfloat16: ("amx_bf16", "avx512_bf16"),
                   torch.float16: ("amx_fp16", "avx512_fp16")}


@dataclass(frozen=True)
class GemmCapability:
    """What one device's GEMM measurement found.

    Attributes:
        device: device type (``cpu``, ``cuda``, ``npu``).
        gflops: measured GFLOP/s per dtype (only the dtypes that were timed).
        fastest: the dtype to compute in (see :func:`choose_gemm_dtype`).
        cpu_flags: the half-precision CPU flags found (empty off CPU).
        reason: one line saying why ``fastest`` was chosen.
    """

    device: str
    gflops: Dict[torch.dtype, float]
    fastest: torch.dtype
    cpu_flags: Tuple[str, ...] = ()
    reason: str = ""

    def as_dict(self) -> Dict[str, object]:
        """JSON-friendly form (dtype names as strings)."""
        return {"device": self.device, "fastest": dtype_name(self.fastest),
                "gflops": {dtype_name(k): round(v, 2) for k, v in self.gflops.items()},
                "cpu_flags": list(self.cpu_flags), "reason": self.reason}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).replace("torch.", "")


def parse_dtype(name: Union[str, torch.dtype], what: str = "dtype") -> torch.dtype:
    """``"bf16"`` / ``"bfloat16"`` / ``torch.bfloat16`` (and fp32, fp16) -> a GEMM dtype."""
    if isinstance(name, torch.dtype):
        if name not in GEMM_DTYPES:
            raise ValueError(f"{what}: {name} is not one of {[dtype_name(d) for d in GEMM_DTYPES]}")
        return name
    key = str(name).strip().lower()
    if key not in _DTYPE_NAMES:
        raise ValueError(f"{what}={name!r}: must be one of {', '.join(sorted(_DTYPE_NAMES))}")
    return _DTYPE_NAMES[key]


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset:
    """The CPU's feature flags (empty where ``/proc/cpuinfo`` is not readable)."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def half_dtypes_with_hardware(flags: frozenset) -> Tuple[torch.dtype, ...]:
    """The half formats whose GEMM has native instructions given CPU ``flags``."""
    return tuple(dt for dt, need in _CPU_HALF_FLAGS.items() if any(f in flags for f in need))


def measure_gemm_gflops(
    device: DeviceLike = None, dtypes: Sequence[torch.dtype] = (torch.float32,), n: int = 1024,
    min_run_time: float = 0.2, rounds: int = 2,
) -> Dict[torch.dtype, float]:
    """GFLOP/s of ``torch.mm`` ``n x n`` per dtype on ``device``, measured now (not cached).

    Timed with ``torch.utils.benchmark.Timer.blocked_autorange`` (warm-up, the current thread
    count, device synchronisation), the dtypes interleaved for ``rounds`` rounds; each dtype's
    best round is its rate (the peak this device reaches now).
    """
    from torch.utils import benchmark

    if n < 1:
        raise ValueError(f"n: must be >= 1, got {n}")
    if rounds < 1:
        raise ValueError(f"rounds: must be >= 1, got {rounds}")
    dev = torch.device(device) if device is not None else default_device()
    gen = torch.Generator().manual_seed(0)
    mats = {dt: (torch.randn(n, n, generator=gen).to(dev, dt), torch.randn(n, n, generator=gen).to(dev, dt))
            for dt in dtypes}
    best: Dict[torch.dtype, float] = {}
    for _ in range(rounds):
        for dt, (a, b) in mats.items():
            timer = benchmark.Timer("torch.mm(a, b)", globals={"torch": torch, "a": a, "b": b},
                                    num_threads=torch.get_num_threads())
            sec = timer.blocked_autorange(min_run_time=min_run_time).median
            best[dt] = max(best.get(dt, 0.0), 2.0 * n ** 3 / sec / 1e9)
    return best


def choose_gemm_dtype(gflops: Mapping[torch.dtype, float], margin: float = FASTER_MARGIN) -> torch.dtype:
    """The dtype to compute in given measured rates: the fastest half dtype if it beats fp32 by
    ``margin``, else fp32 (fp32 is the safe default, so a near-tie keeps it)."""
    if torch.float32 not in gflops:
        raise ValueError("gflops: needs a float32 rate to compare against")
    fp32 = gflops[torch.float32]
    halves = [(r, dt) for dt, r in gflops.items() if dt != torch.float32]
    if halves:
        rate, dt = max(halves, key=lambda x: x[0])
        if rate > margin * fp32:
            return dt
    return torch.float32


def _capability(kind: str, measure: Callable[..., Dict[torch.dtype, float]]) -> GemmCapability:
    if kind == "cpu":
        flags = cpu_flags()
        found = tuple(sorted(f for need in _CPU_HALF_FLAGS.values() for f in need if f in flags))
        candidates = half_dtypes_with_hardware(flags)
        gflops = measure("cpu", (torch.float32,) + candidates)
        fastest = choose_gemm_dtype(gflops)
        if not candidates:
            reason = "no bf16/fp16 GEMM instructions (no amx/avx512 bf16/fp16 flags): fp32"
        else:
            rates = ", ".join(f"{dtype_name(d)} {r:.0f}" for d, r in gflops.items())
            reason = f"measured GFLOP/s {rates}: {dtype_name(fastest)}"
        return GemmCapability("cpu", gflops, fastest, found, reason)
    gflops = measure(kind, (torch.float32, torch.bfloat16))
    return GemmCapability(kind, gflops, torch.bfloat16, (), f"{kind}: bf16 tensor/cube units")


_CAPABILITIES: Dict[str, GemmCapability] = {}


def gemm_capability(device: DeviceLike = None, refresh: bool = False) -> GemmCapability:
    """The device type's GEMM measurement and fastest dtype, measured once per process (cached;
    ``refresh=True`` measures again).  About 1-2 s on a CPU."""
    kind = _as_type(device)
    if kind not in KNOWN_DEVICE_TYPES:
        raise ValueError(f"device {kind!r}: must be one of {', '.join(KNOWN_DEVICE_TYPES)}")
    if refresh or kind not in _CAPABILITIES:
        target = kind if kind == "cpu" else str(default_device())
        _CAPABILITIES[kind] = _capability(
            kind, lambda _k, dts: measure_gemm_gflops(target, dts, n=512 if kind == "cpu" else 4096))
    return _CAPABILITIES[kind]


def fastest_gemm_dtype(device: DeviceLike = None) -> torch.dtype:
    """The dtype GEMMs run fastest in on ``device`` (bf16 on npu/cuda; on cpu measured).

    ``TORCHREC_ASCEND_GEMM_DTYPE=float32|bfloat16|float16`` overrides the measurement.
    """
    forced = os.environ.get(ENV_GEMM_DTYPE, "").strip()
    if forced:
        return parse_dtype(forced, ENV_GEMM_DTYPE)
    return gemm_capability(device).fastest


def gemm_dtype_is_fast(dtype: Union[str, torch.dtype], device: DeviceLike = None) -> bool:
    """Whether computing a GEMM in ``dtype`` pays on ``device``: fp32 always; on npu/cuda bf16 and
    fp16; on cpu a half dtype only where it was measured faster than fp32 (by the margin of
    :func:`choose_gemm_dtype`).  With ``TORCHREC_ASCEND_GEMM_DTYPE`` set, only that dtype (and
    fp32)."""
    dtype = parse_dtype(dtype)
    if dtype == torch.float32:
        return True
    forced = os.environ.get(ENV_GEMM_DTYPE, "").strip()
    if forced:
        return parse_dtype(forced, ENV_GEMM_DTYPE) == dtype
    kind = _as_type(device)
    if kind != "cpu":
        return True
    cap = gemm_capability(kind)
    if dtype not in cap.gflops:
        return False
    return choose_gemm_dtype({torch.float32: cap.gflops[torch.float32], dtype: cap.gflops[dtype]}) == dtype


# On the CPU, oneDNN builds (JIT-compiles) a bf16 / fp16 matmul primitive for every new problem
# shape and caches it by shape: 0.5-21 ms per build, ~11 builds and ~44 ms per paper-config step
# without padding (ONEDNN_VERBOSE=2; 2-core Xeon with AMX, one thread), while fp32 GEMMs take a
# path with no per-shape build.  A jagged batch's token count changes every step, so the callers
# whose GEMMs have a token dimension pad it to a multiple of this and the shapes repeat
# (modules/row_padding.py, sampling/quant.py).
GEMM_ROW_MULTIPLE = 64


def gemm_row_multiple(device: DeviceLike, dtype: torch.dtype) -> int:
    """The multiple a GEMM's varying dimension (tokens) is padded to on ``device`` in ``dtype``:
    :data:`GEMM_ROW_MULTIPLE` for bf16 / fp16 on the CPU, else 1 (no padding)."""
    if _as_type(device) == "cpu" and dtype in (torch.bfloat16, torch.float16):
        return GEMM_ROW_MULTIPLE
    return 1


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
