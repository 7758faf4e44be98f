"""Loader for the compiled ``csrc/`` extension (``torchrec_ascend._C``).

``kernel(name)`` returns the C++ function or ``None``; when the extension is missing (not built,
or built against another torch) a one-line warning is issued once and the registry falls back to
the next backend (the torch-composite reference) -- never a crash.
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType
from typing import Callable, Optional

__all__ = ["extension", "available", "kernel", "direct_ops", "load_state"]

_EXT: Optional[ModuleType] = None
_TRIED = False


def extension() -> Optional[ModuleType]:
    """The ``torchrec_ascend._C`` module, or ``None`` (with a one-time warning) if it won't load."""
    global _EXT, _TRIED
    if not _TRIED:
        _TRIED = True
        try:
            import torch  # noqa: F401  (the extension links against libtorch)

            _EXT = importlib.import_module("torchrec_ascend._C")
        except Exception as exc:  # ImportError, or undefined symbols from another torch
            warnings.warn(
                f"torchrec_ascend: C++ CPU kernels unavailable ({type(exc).__name__}: {exc}); "
                "using the reference backend. Build them with `make build`.",
                RuntimeWarning,
                stacklevel=2,
            )
            _EXT = None
    return _EXT


def load_state() -> tuple:
    """Changes whenever the extension is loaded (or swapped, in tests): the registry's caches
    key on it."""
    return (_TRIED, id(_EXT))


def available() -> bool:
    """Whether the compiled extension loaded."""
    return extension() is not None


def kernel(name: str) -> Optional[Callable]:
    """The extension's function ``name``, or ``None`` if the extension or function is missing."""
    ext = extension()
    return getattr(ext, name, None) if ext is not None else None


def direct_ops() -> frozenset:
    """Ops whose csrc kernel can be registered with the dispatcher directly (csrc/direct.h)."""
    ext = extension()
    fn = getattr(ext, "_direct_ops", None) if ext is not None else None
    return frozenset(fn()) if fn is not None else frozenset()
