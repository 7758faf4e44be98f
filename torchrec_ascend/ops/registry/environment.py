"""What is installed and forced here, read in one place: :func:`read_environment` (fbgemm_gpu /
fbgemm-ascend, Triton per device, the csrc extension and its direct kernels,
``$TORCHREC_ASCEND_BACKEND``), and the read-only dispatcher probes of fbgemm's own kernels.

Nothing here registers anything with the dispatcher or keeps state: the registry reads the
environment once (:class:`~.state.RegistryState`, and again on ``reload_environment()``).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import types
import warnings
from typing import Optional

import torch

from .. import extension as _extension

__all__ = ["ENV_BACKEND", "DEVICE_KEYS", "Environment", "read_environment", "has_schema",
           "native_keys_of", "has_autograd_kernel"]

ENV_BACKEND = "TORCHREC_ASCEND_BACKEND"

DEVICE_KEYS = types.MappingProxyType({"cpu": "CPU", "cuda": "CUDA", "npu": "PrivateUse1"})
"""Dispatch key of each device type."""


@dataclasses.dataclass(frozen=True)
class Environment:
    """What the registry's choice reads, fixed until the next ``reload_environment()``.

    Attributes:
        forcing: the value of ``$TORCHREC_ASCEND_BACKEND`` (``""``: unset).
        fbgemm: fbgemm_gpu imported.
        fbgemm_ascend: fbgemm_ascend imported.
        triton_devices: the device types Triton runs for: cuda with triton, npu with
            triton-ascend, cpu only under ``TRITON_INTERPRET=1`` (test-only).
        extension: the compiled ``torchrec_ascend._C`` module, or None.
        direct_ops: the ops the extension has a direct dispatcher kernel for (csrc/direct.h).
    """

    forcing: str = ""
    fbgemm: bool = False
    fbgemm_ascend: bool = False
    triton_devices: frozenset = frozenset()
    extension: Optional[types.ModuleType] = None
    direct_ops: frozenset = frozenset()


def _imports(module: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module(module)
        return True
    except Exception:
        return False


def _triton_devices() -> frozenset:
    if importlib.util.find_spec("triton") is None:
        return frozenset()
    out = set()
    if os.environ.get("TRITON_INTERPRET", "") == "1":
        out.add("cpu")
    from ... import device as _device

    if _device.is_available("cuda"):
        out.add("cuda")
    try:  # triton-ascend ships the top-level ``triton`` package with an "npu" backend
        if "npu" in getattr(importlib.import_module("triton.backends"), "backends", {}):
            out.add("npu")
    except Exception:
        pass
    return frozenset(out)


def read_environment(**overrides) -> Environment:
    """The :class:`Environment` of this process now (fbgemm_gpu is imported here, before the
    registry defines any ``fbgemm::`` schema itself); ``overrides`` replace fields (tests)."""
    ext = _extension.extension()
    direct = getattr(ext, "direct_ops", None)
    env = Environment(
        forcing=os.environ.get(ENV_BACKEND, ""),
        fbgemm=_imports("fbgemm_gpu"),
        fbgemm_ascend=_imports("fbgemm_ascend"),
        triton_devices=_triton_devices(),
        extension=ext,
        direct_ops=frozenset(direct()) if direct is not None else frozenset(),
    )
    if "extension" in overrides and "direct_ops" not in overrides:
        overrides["direct_ops"] = env.direct_ops if overrides["extension"] is ext else frozenset()
    return dataclasses.replace(env, **overrides)


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
