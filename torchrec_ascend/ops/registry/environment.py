"""What is installed here: fbgemm_gpu / fbgemm-ascend, Triton per device, the csrc extension,
and which dispatch keys fbgemm itself has a kernel for, per op (recorded before we add ours).

Read-only probes; nothing here registers anything with the dispatcher.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import warnings
from typing import Dict, Optional, Tuple

import torch

__all__ = ["fbgemm_loaded", "fbgemm_state", "has_schema", "native_keys_of", "has_autograd_kernel",
           "triton_usable", "NATIVE_KEYS", "NATIVE_AUTOGRAD", "DEVICE_KEYS"]

DEVICE_KEYS = {"cpu": "CPU", "cuda": "CUDA", "npu": "PrivateUse1"}
"""Dispatch key of each device type."""

NATIVE_KEYS: Dict[str, frozenset] = {}
"""fbgemm's own kernels per op, recorded at registration (before we register anything):
a subset of ``{"CPU", "CUDA", "PrivateUse1"}`` (PrivateUse1: fbgemm-ascend on a real npu)."""

NATIVE_AUTOGRAD: Dict[str, bool] = {}
"""Per fbgemm op: fbgemm registers an autograd kernel for it (else its CPU kernel differentiates
by recording the autograd graph of the ops it is made of)."""

_FBGEMM_STATE: Optional[Tuple[bool, bool]] = None


def fbgemm_state() -> Tuple[bool, bool]:
    """(fbgemm_gpu imported, fbgemm_ascend imported); imported once, on the first call (fbgemm_gpu
    must load before we define any ``fbgemm::`` schema ourselves)."""
    global _FBGEMM_STATE
    if _FBGEMM_STATE is None:
        loaded = ascend = False
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                importlib.import_module("fbgemm_gpu")
            loaded = True
        except Exception:
            loaded = False
        try:
            importlib.import_module("fbgemm_ascend")
            ascend = True
        except Exception:
            ascend = False
        _FBGEMM_STATE = (loaded, ascend)
    return _FBGEMM_STATE


def fbgemm_loaded() -> bool:
    """Import fbgemm_gpu if installed; whether it loaded."""
    return fbgemm_state()[0]


def has_schema(qualname: str) -> bool:
    """The dispatcher knows an op ``namespace::name``."""
    try:
        torch._C._dispatch_find_schema_or_throw(qualname, "")
        return True
    except RuntimeError:
        return False


def native_keys_of(qualname: str) -> frozenset:
    """The device dispatch keys ``qualname`` has a kernel for right now."""
    if not has_schema(qualname):
        return frozenset()
    return frozenset(k for k in DEVICE_KEYS.values()
                     if torch._C._dispatch_has_kernel_for_dispatch_key(qualname, k))


def has_autograd_kernel(qualname: str) -> bool:
    """``qualname`` has an autograd kernel (Autograd alias, AutogradCPU or a composite one)."""
    if not has_schema(qualname):
        return False
    return any(line.startswith(("Autograd", "CompositeImplicitAutograd"))
               for line in torch._C._dispatch_dump(qualname).splitlines())


def triton_usable(device: str) -> bool:
    """Triton can run here for ``device``: cuda with triton, npu with triton-ascend, cpu only
    under ``TRITON_INTERPRET=1`` (test-only: never chosen by default on cpu)."""
    if importlib.util.find_spec("triton") is None:
        return False
    if device == "cpu":
        return os.environ.get("TRITON_INTERPRET", "") == "1"
    if device == "cuda":
        from ... import device as _device

        return _device.is_available("cuda")
    if device == "npu":
        # triton-ascend ships the top-level ``triton`` package with an "npu" backend
        try:
            backends = importlib.import_module("triton.backends")
            return "npu" in getattr(backends, "backends", {})
        except Exception:
            return False
    return False
