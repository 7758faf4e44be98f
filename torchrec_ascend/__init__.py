"""torchrec_ascend: run TorchRec on Ascend NPUs (and CPU / CUDA), train HSTU fast.

``import torchrec_ascend`` registers the op suite (:mod:`torchrec_ascend.ops`, torch-only).
The TorchRec integration lives in :mod:`torchrec_ascend.distributed` and needs torchrec.
"""

from __future__ import annotations

from . import device, ops

__version__ = "0.1.0"
__all__ = ["device", "ops", "__version__"]
