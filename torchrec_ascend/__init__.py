"""torchrec_ascend: run TorchRec on Ascend NPUs (and CPU / CUDA), train HSTU fast.

``import torchrec_ascend`` registers the op suite (:mod:`torchrec_ascend.ops`, torch-only) and,
when torchrec is installed, imports :mod:`torchrec_ascend.distributed`, which opens TorchRec's
device gates for ``npu`` (listed in docs/integration.md).  Without torchrec (a torch-only
machine) only the ops load: ``import torchrec_ascend.ops`` needs torch alone.
"""

from __future__ import annotations

import importlib.util as _ilu

from . import device, ops

__version__ = "0.1.0"
__all__ = ["device", "ops", "__version__"]

if _ilu.find_spec("torchrec") is not None:
    from . import distributed  # noqa: E402  (opens TorchRec's device gates)

    __all__.append("distributed")
