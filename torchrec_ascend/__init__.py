"""torchrec_ascend: run TorchRec on Ascend NPUs (and CPU / CUDA), train HSTU fast.

``import torchrec_ascend`` registers the op suite (:mod:`torchrec_ascend.ops`, torch-only) and,
when torchrec is installed, imports :mod:`torchrec_ascend.distributed`, which opens TorchRec's
device gates for ``npu`` (listed in docs/integration.md).  Without torchrec (a torch-only
machine) only the ops load: ``import torchrec_ascend.ops`` needs torch alone.
"""

from __future__ import annotations

from . import device, ops

__version__ = "0.1.0"
__all__ = ["device", "ops", "__version__"]

try:
    import torchrec as _torchrec  # noqa: F401
except ModuleNotFoundError as _e:  # a torch-only machine: the ops alone
    if _e.name != "torchrec":
        raise  # torchrec is installed but one of its own dependencies is missing: say so
else:
    from . import distributed  # noqa: E402  (opens TorchRec's device gates)

    __all__.append("distributed")
