"""Typed configuration of the generative-retrieval models (HSTU and the SASRec baseline).

``ModelConfig`` is plain data: the trainer's config loader (:mod:`torchrec_ascend.training.config`)
fills it from JSON / YAML and validates every field before any work starts.

Embedding dimensions: fbgemm's table-batched embedding kernels store rows 4-aligned, so a table
whose dimension is not a multiple of 4 cannot be sharded.  The item table is therefore created
with :attr:`ModelConfig.table_dim` columns (``embedding_dim`` rounded up to a multiple of 4) and
the model reads only the first ``embedding_dim`` of them; the padding columns receive no gradient
and never change (docs/training.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import torch

from ..ops.hstu import NORMALIZATIONS, Normalization
from ..options import Key, OptionError, choices, option

__all__ = ["ModelConfig", "Encoder", "ENCODERS", "NORMALIZATIONS", "padded_dim", "embedding_columns"]

Encoder = Literal["hstu", "sasrec"]
"""The sequence encoders: HSTU, or the SASRec baseline."""
ENCODERS = choices(Encoder)


def padded_dim(dim: int, multiple: int = 4) -> int:
    """``dim`` rounded up to a multiple of ``multiple`` (fbgemm TBE rows are 4-aligned)."""
    return -(-int(dim) // multiple) * multiple


def embedding_columns(values: torch.Tensor, dim: int) -> torch.Tensor:
    """The first ``dim`` columns of looked-up rows ``[N, padded_dim(dim)]``: ``values`` itself
    where the table has no padding columns (a full-width slice is a view whose backward is a
    zero fill of ``[N, dim]`` plus a copy)."""
    return values if values.shape[-1] == dim else values[..., :dim]


@dataclass
class ModelConfig:
    """Sizes and switches of the sequence model.

    embedding_dim: D of items and of the encoder (any positive int; the table is padded to
    :attr:`table_dim`).  num_layers / num_heads / attention_dim / linear_dim: the HSTU stack
    (attention_dim = per-head q/k width, linear_dim = per-head u/v width).  max_seq_len: the
    longest input sequence (the most recent items of a user).  dropout: in [0, 1).
    normalization: HSTU's attention normaliser, ``max_len`` (the paper's) or ``seq_len``.
    use_time_bias: HSTU's learned time-bucket bias.  use_actions: add a projection of the 8
    action bits of each event to its item embedding.  attn_alpha: HSTU's q.k scale (None:
    1/sqrt(attention_dim)).  num_time_buckets: size of the time-bias table.  sasrec_heads /
    sasrec_ffn_dim: the SASRec baseline's heads (None: num_heads) and feed-forward width (None:
    4 D).
    """

    embedding_dim: int = option(64, min=1)
    num_layers: int = option(2, min=1)
    num_heads: int = option(2, min=1)
    attention_dim: int = option(32, min=1)
    linear_dim: int = option(32, min=1)
    max_seq_len: int = option(100, min=2)
    dropout: float = option(0.2, min=0.0, below=1.0)
    normalization: Normalization = "max_len"
    use_time_bias: bool = True
    use_actions: bool = True
    attn_alpha: Optional[float] = option(None, gt=0.0, finite=True)
    num_time_buckets: int = option(128, min=1)
    sasrec_heads: Optional[int] = option(None, min=1)
    sasrec_ffn_dim: Optional[int] = option(None, min=1)

    def check(self, encoders: tuple = ("hstu",), key: Key = str) -> None:
        """The rules across fields for the ``encoders`` to be built (:class:`OptionError`)."""
        if "sasrec" in encoders and self.embedding_dim % self.sasrec_num_heads:
            raise OptionError(key("sasrec_heads"), f"{self.sasrec_num_heads} heads do not divide "
                                                   f"{key('embedding_dim')}={self.embedding_dim}")

    @property
    def table_dim(self) -> int:
        """Columns of the item table: ``embedding_dim`` rounded up to a multiple of 4."""
        return padded_dim(self.embedding_dim)

    @property
    def sasrec_num_heads(self) -> int:
        return self.sasrec_heads if self.sasrec_heads is not None else self.num_heads

    @property
    def sasrec_ffn(self) -> int:
        return self.sasrec_ffn_dim if self.sasrec_ffn_dim is not None else 4 * self.embedding_dim
