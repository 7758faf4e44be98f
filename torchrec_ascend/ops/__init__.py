"""torchrec_ascend.ops: jagged & sparse ops and fused HSTU attention, on npu / cuda / cpu.

Imports with torch alone (no torchrec, no fbgemm needed).  Importing it registers every op with
the dispatcher (``torchrec_ascend::<op>``, and ``fbgemm::<op>`` on PrivateUse1 where no kernel
exists there).  :func:`describe` prints which backend runs each op on each device;
:func:`use_backend` forces one.
"""

from __future__ import annotations

from . import registry
from .registry import BACKENDS, DEVICES, describe, describe_rows, use_backend

# op modules: importing one registers its ops (order = order in describe())
from . import sparse  # noqa: E402
from . import jagged  # noqa: E402
from . import hstu  # noqa: E402  (fused HSTU attention: hstu_mha)
from .sparse import (  # noqa: E402
    asynchronous_complete_cumsum,
    asynchronous_exclusive_cumsum,
    asynchronous_inclusive_cumsum,
)
from .jagged import dense_to_jagged, jagged_to_padded_dense  # noqa: E402

__all__ = [
    "BACKENDS",
    "DEVICES",
    "describe",
    "describe_rows",
    "use_backend",
    "registry",
    "asynchronous_complete_cumsum",
    "asynchronous_exclusive_cumsum",
    "asynchronous_inclusive_cumsum",
    "jagged_to_padded_dense",
    "dense_to_jagged",
]
