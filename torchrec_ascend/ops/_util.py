"""Small helpers shared by the op modules."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Callable, Optional


def triton_impl(module: str, name: str) -> Optional[Callable]:
    """A lazily imported Triton implementation ``torchrec_ascend.ops.triton.<module>.<name>``,
    or ``None`` where triton is not installed (the import happens on first call)."""
    if importlib.util.find_spec("triton") is None:
        return None

    def call(*args):
        mod = importlib.import_module(f"torchrec_ascend.ops.triton.{module}")
        return getattr(mod, name)(*args)

    call.__name__ = f"triton_{name}"
    call.__qualname__ = call.__name__
    return call
