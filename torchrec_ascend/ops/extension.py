"""Loader for the compiled ``csrc/`` extension (``torchrec_ascend._C``), loaded once on import.

``kernel(name)`` returns the C++ function or ``None``; when the extension is missing (not built,
or built against another torch) a one-line warning is issued on import and the registry falls
back to the next backend (the torch-composite reference) -- never a crash.
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType
from typing import Callable, Optional

import torch  # noqa: F401  (the extension links against libtorch)

__all__ = ["extension", "available", "kernel"]


def _load() -> Optional[ModuleType]:
    try:
        return importlib.import_module("torchrec_ascend._C")
    except Exception as exc:  # ImportError, or undefined symbols from another torch
        warnings.warn(
            f"torchrec_ascend: C++ CPU kernels unavailable ({type(exc).__name__}: {exc}); "
            "using the reference backend. Build them with `make build`.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


_MODULE = _load()


def extension() -> Optional[ModuleType]:
    """The ``torchrec_ascend._C`` module, or ``None`` if it did not load."""
    return _MODULE


def available() -> bool:
    """Whether the compiled extension loaded."""
    return _MODULE is not None


def kernel(name: str) -> Optional[Callable]:
    """The extension's function ``name``, or ``None`` if the extension or function is missing."""
    return getattr(_MODULE, name, None)
