"""The csrc backend's HSTU attention micro-kernels ("engines") on this CPU: which one each dtype
runs (chosen by the backend once per process by timing the candidates, ``csrc/hstu_choice.cpp``),
which ones run here, and forcing one; ``ops.describe()`` shows the choice on the ``cpu_kernel`` rows of the HSTU ops."""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from . import extension

__all__ = ["ENGINE_DTYPES", "cpu_engine", "cpu_engines", "set_cpu_engine", "engines_detail"]

ENGINE_DTYPES = ("float32", "bfloat16")


def _dtype_key(dtype) -> str:
    name = str(dtype).replace("torch.", "")
    if name not in ENGINE_DTYPES:
        raise ValueError(f"dtype: {dtype} has no CPU engine choice (one of {', '.join(ENGINE_DTYPES)})")
    return name


def cpu_engine(dtype=torch.bfloat16) -> Tuple[str, str]:
    """``(engine, why)``: the micro-kernel the csrc backend runs ``dtype`` attention with on this
    CPU, chosen by the backend itself on first use by timing the candidates (``csrc/hstu_choice.cpp``)
    -- float32: ``avx512_fp32``, ``avx2_fp32`` or ``blas``; bfloat16: ``amx_bf16``, ``avx512_bf16`` or ``fp32``
    (widened).  ``why`` gives the measured times.  ``("", "extension not built")`` without the
    extension."""
    fn = extension.kernel("hstu_engine")
    if fn is None:
        return "", "extension not built"
    name, why = fn(_dtype_key(dtype))
    return str(name), str(why)


def cpu_engines(dtype=torch.bfloat16) -> List[str]:
    """The engines of ``dtype`` that run on this CPU (empty without the extension)."""
    fn = extension.kernel("hstu_engines")
    return list(fn(_dtype_key(dtype))) if fn is not None else []


def set_cpu_engine(dtype, name: Optional[str]) -> None:
    """Force the csrc engine of ``dtype`` (tests, benchmarks); ``None`` forgets the choice (the
    next call measures again)."""
    fn = extension.kernel("hstu_set_engine")
    if fn is None:
        raise RuntimeError("set_cpu_engine: the csrc extension is not built")
    fn(_dtype_key(dtype), name or "")


def engines_detail(device: str, backend: str) -> str:
    """The ``ops.describe()`` note of an HSTU op's row: the engine of each dtype where the csrc
    backend serves the CPU (measuring the choice now if no call has yet), else nothing."""
    if device != "cpu" or backend != "cpu_kernel" or extension.kernel("hstu_engine") is None:
        return ""
    return "engines: " + ", ".join(f"{d} {cpu_engine(getattr(torch, d))[0]}" for d in ENGINE_DTYPES)
