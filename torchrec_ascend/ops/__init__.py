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
from . import embedding  # noqa: E402  (TBE lookup + fused optimizers)
from . import embedding_npu  # noqa: E402  (npu kernels of fbgemm's TBE plumbing)
from .embedding import dense_embedding_lookup, split_embedding_forward, split_embedding_lookup  # noqa: E402
from .sparse import (  # noqa: E402
    asynchronous_complete_cumsum,
    asynchronous_exclusive_cumsum,
    asynchronous_inclusive_cumsum,
    BoundsCheckMode,
    block_bucketize_sparse_features,
    bounds_check_indices,
    expand_into_jagged_permute,
    invert_permute,
    keyed_jagged_index_select_dim1,
    offsets_range,
    permute_1D_sparse_data,
    permute_2D_sparse_data,
    permute_pooled_embs,
    permute_pooled_embs_auto_grad,
    permute_pooled_embs_auto_grad_split,
    segment_sum_csr,
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
    "BoundsCheckMode",
    "block_bucketize_sparse_features",
    "bounds_check_indices",
    "expand_into_jagged_permute",
    "invert_permute",
    "keyed_jagged_index_select_dim1",
    "offsets_range",
    "permute_1D_sparse_data",
    "permute_2D_sparse_data",
    "permute_pooled_embs",
    "permute_pooled_embs_auto_grad",
    "permute_pooled_embs_auto_grad_split",
    "segment_sum_csr",
    "jagged_to_padded_dense",
    "dense_to_jagged",
    "split_embedding_forward",
    "split_embedding_lookup",
    "dense_embedding_lookup",
]
