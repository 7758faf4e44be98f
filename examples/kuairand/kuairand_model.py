"""The generative-retrieval model of the KuaiRand example.

``GRModel`` = a TorchRec ``EmbeddingCollection`` (one item table, two features: ``item`` = the
users' sequences, ``neg`` = the batch's shared negative pool) + an optional action-bitmask
embedding + a sequence encoder (:class:`~torchrec_ascend.modules.hstu.HSTUEncoder`, or the
SASRec-style :class:`SASRecEncoder` baseline) + :class:`~torchrec_ascend.sampling.SampledSoftmaxLoss`.

Both encoders take jagged ``[T, D]`` inputs with ``offsets [B + 1]`` and return L2-normalised
``[T, D]``; the output at position ``i`` of a sequence is trained to retrieve item ``i + 1``.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torchrec import EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor

from torchrec_ascend.metrics.flops import sampled_softmax_flops, sasrec_forward_flops
from torchrec_ascend.modules.hstu import HSTUEncoder
from torchrec_ascend.sampling import NegativeSample, SampledSoftmaxLoss

NUM_ACTION_BITS = 8


def jagged_to_padded(x: torch.Tensor, offsets: torch.Tensor, max_len: int
                     ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[T, D]`` -> ``[B, max_len, D]`` (zeros), valid mask ``[B, max_len]``, and the flat
    index of every jagged row in the padded layout."""
    b = offsets.numel() - 1
    lengths = offsets[1:] - offsets[:-1]
    rows = torch.repeat_interleave(torch.arange(b, device=x.device), lengths)
    cols = torch.arange(x.shape[0], device=x.device) - offsets[:-1].repeat_interleave(lengths)
    flat = rows * max_len + cols
    out = x.new_zeros(b * max_len, x.shape[1]).index_copy(0, flat, x).view(b, max_len, -1)
    mask = torch.zeros(b * max_len, dtype=torch.bool, device=x.device)
    mask[flat] = True
    return out, mask.view(b, max_len), flat


class SASRecEncoder(nn.Module):
    """SASRec-style baseline (Kang & McAuley 2018): learned positions, pre-LN causal softmax
    self-attention + FFN blocks; same jagged interface as the HSTU encoder."""

    def __init__(self, embedding_dim: int, num_layers: int, num_heads: int, ffn_dim: int,
                 max_seq_len: int, dropout: float = 0.0) -> None:
        super().__init__()
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
                timestamps: Optional[torch.Tensor] = None) -> torch.Tensor:
        n = int((offsets[1:] - offsets[:-1]).max()) if offsets.numel() > 1 else 0
        if n > self.max_seq_len:
            raise ValueError(f"offsets: a sequence has length {n} > max_seq_len={self.max_seq_len}")
        pad, mask, flat = jagged_to_padded(x * math.sqrt(self.embedding_dim), offsets, max(n, 1))
        h = self.drop(pad + self.pos.weight[: pad.shape[1]][None])
        causal = torch.triu(torch.ones(pad.shape[1], pad.shape[1], dtype=torch.bool,
                                       device=x.device), 1)
        for layer in self.layers:
            h = layer(h, src_mask=causal)
        h = self.norm(h).reshape(-1, self.embedding_dim)[flat]
        return F.normalize(h, dim=-1)

    def flops(self, offsets: torch.Tensor, backward: bool = False) -> float:
        f = sasrec_forward_flops(offsets[1:] - offsets[:-1], self.embedding_dim,
                                 self.num_layers, self.ffn_dim)
        return 3.0 * f if backward else f


def build_encoder(kind: str, m: Dict[str, object]) -> nn.Module:
    """``hstu`` or ``sasrec`` encoder from the config's ``model`` section."""
    d, L = int(m["embedding_dim"]), int(m["max_seq_len"])
    if kind == "hstu":
        return HSTUEncoder(d, int(m["num_layers"]), int(m["num_heads"]), int(m["attention_dim"]),
                           int(m["linear_dim"]), L, dropout=float(m.get("dropout", 0.0)),
                           normalization=str(m.get("normalization", "max_len")),
                           use_time_bias=bool(m.get("use_time_bias", True)))
    if kind == "sasrec":
        return SASRecEncoder(d, int(m["num_layers"]), int(m.get("sasrec_heads", m["num_heads"])),
                             int(m.get("sasrec_ffn_dim", 4 * d)), L,
                             dropout=float(m.get("dropout", 0.0)))
    raise ValueError(f"model: unknown encoder {kind!r}; expected 'hstu' or 'sasrec'")


class GRModel(nn.Module):
    """Sharded item embeddings + sequence encoder + sampled softmax (see module docstring)."""

    def __init__(self, num_items: int, kind: str, m: Dict[str, object], temperature: float,
                 device: torch.device = torch.device("meta")) -> None:
        super().__init__()
        d = int(m["embedding_dim"])
        self.num_items, self.embedding_dim, self.kind = num_items, d, kind
        self.ec = EmbeddingCollection(
            tables=[EmbeddingConfig(name="item_table", embedding_dim=d, num_embeddings=num_items,
                                    feature_names=["item", "neg"])],
            device=device)
        self.use_actions = bool(m.get("use_actions", True))
        self.action_proj = nn.Linear(NUM_ACTION_BITS, d, bias=False) if self.use_actions else None
        self.encoder = build_encoder(kind, m)
        self.loss_fn = SampledSoftmaxLoss(temperature=temperature)

    def encode(self, item_emb: torch.Tensor, offsets: torch.Tensor, timestamps: torch.Tensor,
               action_bits: torch.Tensor) -> torch.Tensor:
        """Input embeddings (+ actions) -> unit-norm sequence embeddings ``[T, D]``."""
        x = item_emb
        if self.action_proj is not None:
            x = x + self.action_proj(action_bits)
        if self.kind == "hstu":
            return self.encoder(x, offsets, timestamps)
        return self.encoder(x, offsets)

    def forward(self, kjt: KeyedJaggedTensor, offsets: torch.Tensor, timestamps: torch.Tensor,
                action_bits: torch.Tensor, query_idx: torch.Tensor, neg_log_q: torch.Tensor,
                pos_log_q: torch.Tensor) -> torch.Tensor:
        """Training loss of one batch.

        ``kjt``: ``item`` = the sequences (T ids), ``neg`` = the shared negative pool (R ids,
        all in the first row); ``query_idx``: the positions that have a next item.
        """
        out = self.ec(kjt)
        emb = out["item"].values()
        neg_emb = out["neg"].values()
        seq = self.encode(emb, offsets, timestamps, action_bits)
        items = kjt["item"].values()
        pos_idx = query_idx + 1
        sample = NegativeSample(kjt["neg"].values(), neg_log_q, pos_log_q)
        return self.loss_fn(seq[query_idx], items[pos_idx], emb[pos_idx], sample, neg_emb)

    def step_flops(self, offsets: torch.Tensor, num_queries: int, num_negatives: int) -> float:
        """Forward + backward model FLOPs of one training step (see metrics/flops.py)."""
        return (self.encoder.flops(offsets, backward=True)
                + 3.0 * sampled_softmax_flops(num_queries, self.embedding_dim, num_negatives))
