"""Generative-retrieval models on TorchRec: HSTU (:class:`GenerativeRetrieval` with
``encoder="hstu"``) and the SASRec baseline (``encoder="sasrec"``), their typed config and the
pipelineable batch.

    from torchrec_ascend.models import GenerativeRetrieval, ModelConfig
    model = GenerativeRetrieval(num_items=10_000, cfg=ModelConfig(embedding_dim=50))

docs/training.md describes the model, the padding of table dimensions to multiples of 4 and
how the trainer (:mod:`torchrec_ascend.training`) shards and trains it.
"""

from __future__ import annotations

from .batch import SequenceBatch, query_positions
from .config import ENCODERS, NORMALIZATIONS, ModelConfig, padded_dim
from .generative_retrieval import (NUM_ACTIONS, TABLE, GenerativeRetrieval, SequenceHead,
                                   action_features, build_encoder, init_item_table, item_kjt)
from .sasrec import SASRecEncoder

__all__ = [
    "ENCODERS", "NORMALIZATIONS", "NUM_ACTIONS", "TABLE", "GenerativeRetrieval", "ModelConfig",
    "SASRecEncoder", "SequenceBatch", "SequenceHead", "action_features", "build_encoder",
    "init_item_table", "item_kjt", "padded_dim", "query_positions",
]
