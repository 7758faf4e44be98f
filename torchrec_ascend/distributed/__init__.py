"""TorchRec integration: device gates opened for ``npu``, and TorchRec's names beside ours.

Importing this package (``import torchrec_ascend`` does it when torchrec is installed) opens
TorchRec's device gates once (:mod:`.gates`, listed in docs/integration.md), so unchanged
TorchRec code plans, shards and pipelines on ``npu``.  ``DistributedModelParallel`` is ours
(:mod:`.semi_async`: TorchRec's plus ``staleness``, identical at 0); ``make_train_pipeline``
builds the sync / sparse_dist / semi_async pipelines (:mod:`.train_pipeline`); the other
classes re-exported here are TorchRec's own, with the gates open.
"""

from __future__ import annotations

from . import fbgemm_tbe_npu  # noqa: F401  (npu kernels of fbgemm's TBE plumbing)
from .gates import GATES, gate_status, open_gates

open_gates()

from .model_parallel import DistributedModelParallel  # noqa: E402
from .train_pipeline import make_train_pipeline  # noqa: E402
from torchrec.distributed.embedding import EmbeddingCollectionSharder  # noqa: E402
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: E402
from torchrec.distributed.train_pipeline.train_pipelines import (  # noqa: E402
    TrainPipelineBase,
    TrainPipelineFusedSparseDist,
    TrainPipelineSemiSync,
    TrainPipelineSparseDist,
)

__all__ = [
    "GATES",
    "gate_status",
    "open_gates",
    "DistributedModelParallel",
    "make_train_pipeline",
    "EmbeddingBagCollectionSharder",
    "EmbeddingCollectionSharder",
    "TrainPipelineBase",
    "TrainPipelineSparseDist",
    "TrainPipelineSemiSync",
    "TrainPipelineFusedSparseDist",
]
