"""torchrec_ascend.ops: fbgemm's jagged & sparse ops, TBE lookups and fused HSTU attention, on
npu / cuda / cpu.

Imports with torch alone (no torchrec, no fbgemm needed).  Importing it registers every op with
the dispatcher (``torchrec_ascend::<op>``, and ``fbgemm::<op>`` on PrivateUse1 where no kernel
exists there).  :func:`describe` prints which backend runs each op on each device;
:func:`use_backend` forces one.

The public surface, by module (each function validates its arguments, then dispatches
``torch.ops.torchrec_ascend.<op>`` through the :mod:`.registry`):

* :mod:`.sparse`: cumsums, permutes, bucketize, bounds check, segment sum, KJT select, pooled
  embedding permutes (TorchRec's training path);
* :mod:`.jagged`: jagged <-> dense conversions (any number of jagged dimensions), elementwise
  jagged (x) dense, softmax, batched GEMMs, index select and slice;
* :mod:`.hstu`: :func:`hstu_mha` (fused jagged HSTU attention);
* :mod:`.embedding`: table-batched embedding lookups with fused optimizers;
* :mod:`.validation`: the argument checks behind every entry point (public for the layers above);
* :mod:`.extension`: the loader of the compiled csrc kernels (``torchrec_ascend._C``).
"""

from __future__ import annotations

from . import extension, registry, validation
from .registry import BACKENDS, DEVICES, describe, describe_rows, use_backend

# op modules: importing one registers its ops (order = order in describe())
from . import sparse  # noqa: E402
from . import jagged  # noqa: E402
from . import hstu  # noqa: E402
from . import embedding  # noqa: E402
from .embedding import (  # noqa: E402
    dense_embedding_lookup,
    split_embedding_forward,
    split_embedding_lookup,
)
from .hstu import Normalization, hstu_mha  # noqa: E402
from .jagged import (  # noqa: E402
    batched_dense_vec_jagged_2d_mul,
    dense_to_jagged,
    jagged_1d_to_dense,
    jagged_2d_to_dense,
    jagged_dense_bmm,
    jagged_dense_dense_elementwise_add_jagged_output,
    jagged_dense_elementwise_add,
    jagged_dense_elementwise_add_jagged_output,
    jagged_dense_elementwise_mul,
    jagged_index_select,
    jagged_jagged_bmm,
    jagged_slice,
    jagged_softmax,
    jagged_to_padded_dense,
    stacked_jagged_2d_to_dense,
)
from .sparse import (  # noqa: E402
    BoundsCheckMode,
    asynchronous_complete_cumsum,
    asynchronous_exclusive_cumsum,
    asynchronous_inclusive_cumsum,
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

__all__ = [
    # the registry
    "BACKENDS",
    "DEVICES",
    "describe",
    "describe_rows",
    "use_backend",
    "registry",
    "validation",
    "extension",
    # sparse
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
    # jagged
    "jagged_to_padded_dense",
    "dense_to_jagged",
    "jagged_1d_to_dense",
    "jagged_2d_to_dense",
    "stacked_jagged_2d_to_dense",
    "jagged_dense_elementwise_add",
    "jagged_dense_elementwise_add_jagged_output",
    "jagged_dense_elementwise_mul",
    "jagged_dense_dense_elementwise_add_jagged_output",
    "jagged_softmax",
    "jagged_jagged_bmm",
    "jagged_dense_bmm",
    "batched_dense_vec_jagged_2d_mul",
    "jagged_index_select",
    "jagged_slice",
    # HSTU attention
    "hstu_mha", "Normalization",
    # embedding lookups
    "split_embedding_forward",
    "split_embedding_lookup",
    "dense_embedding_lookup",
]
