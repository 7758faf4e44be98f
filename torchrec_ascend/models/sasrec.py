"""SASRec baseline (Kang & McAuley, ICDM 2018) on jagged inputs.

Learned absolute positions, pre-LayerNorm causal softmax self-attention + GELU feed-forward
blocks, a final LayerNorm and L2-normalised outputs: the same interface as
:class:`~torchrec_ascend.modules.hstu.HSTUEncoder` (``[T, D]`` values + ``offsets [B + 1]`` in,
unit-norm ``[T, D]`` out).  The jagged batch is padded with :func:`torchrec_ascend.ops.
jagged_to_padded_dense` and gathered back with :func:`torchrec_ascend.ops.dense_to_jagged`;
padding sits after each sequence's tokens, so the causal mask alone keeps it out of every valid
position's attention.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from .. import ops
from ..modules.l2norm import l2_normalize
from ..metrics.flops import sasrec_forward_flops

__all__ = ["SASRecEncoder"]


class SASRecEncoder(nn.Module):
    """``num_layers`` pre-LN transformer blocks with ``num_heads`` heads and FFN width
    ``ffn_dim`` over sequences of at most ``max_seq_len`` tokens."""

    def __init__(self, embedding_dim: int, num_layers: int, num_heads: int, ffn_dim: int,
                 max_seq_len: int, dropout: float = 0.0) -> None:
        super().__init__()
        if embedding_dim % num_heads:
            raise ValueError(f"num_heads: {num_heads} does not divide "
                             f"embedding_dim={embedding_dim}")
        self.embedding_dim, self.num_layers, self.ffn_dim = embedding_dim, num_layers, ffn_dim
        self.max_seq_len = max_seq_len
        self.pos = nn.Embedding(max_seq_len, embedding_dim)
        nn.init.normal_(self.pos.weight, std=0.02)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(embedding_dim, num_heads, ffn_dim, dropout,
                                       activation="gelu", batch_first=True, norm_first=True)
            for _ in range(num_layers))
        self.norm = nn.LayerNorm(embedding_dim)

    def forward(self, x: torch.Tensor, offsets: torch.Tensor,
                timestamps: Optional[torch.Tensor] = None, normalize: bool = True) -> torch.Tensor:
        """``x [T, D]`` + ``offsets [B + 1]`` -> unit-norm ``[T, D]`` (``timestamps`` unused;
        ``normalize=False``: the final LayerNorm's output as it is)."""
        n = int((offsets[1:] - offsets[:-1]).max()) if offsets.numel() > 1 else 0
        if n > self.max_seq_len:
            raise ValueError(f"offsets: a sequence has length {n} > max_seq_len={self.max_seq_len}")
        n = max(n, 1)
        pad = ops.jagged_to_padded_dense(x * math.sqrt(self.embedding_dim), offsets, n)
        h = self.drop(pad + self.pos.weight[:n][None])
        causal = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), 1)
        for layer in self.layers:
            h = layer(h, src_mask=causal)
        out, _ = ops.dense_to_jagged(self.norm(h), offsets, total_L=x.shape[0])
        return l2_normalize(out) if normalize else out

    def flops(self, offsets: torch.Tensor, backward: bool = False) -> float:
        """Matmul FLOPs of one forward (``backward=True``: forward + backward = 3x)."""
        f = sasrec_forward_flops(offsets[1:] - offsets[:-1], self.embedding_dim,
                                 self.num_layers, self.ffn_dim)
        return 3.0 * f if backward else f
