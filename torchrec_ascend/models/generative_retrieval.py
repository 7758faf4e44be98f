"""The generative-retrieval model: item ``EmbeddingCollection`` + optional action features + a
sequence encoder (HSTU from :mod:`torchrec_ascend.modules`, or the SASRec baseline) + sampled
softmax over a shared negative pool or per-query negatives (``SequenceBatch.neg_index``).

    model = GenerativeRetrieval(num_items, ModelConfig(embedding_dim=50), encoder="hstu")
    loss, (loss_value, stats) = model(batch)        # batch: SequenceBatch with kjt

Structure (what TorchRec's train pipelines need): ``model.ec`` is the only sparse module (one
table ``item_table``, features ``item`` = the sequences and ``neg`` = the negative pool, or the
distinct ids of the per-query negatives, so one sharded lookup serves both); ``model.head`` (:class:`SequenceHead`) holds every dense parameter
and contains no sparse module, so the pipeline's tracer treats it as a leaf and the model's
``forward`` is ``head(ec(batch.kjt), batch)``.

The table has :attr:`ModelConfig.table_dim` columns (4-aligned for fbgemm); the head uses the
first ``embedding_dim``.  Output ``i`` of a sequence is trained to retrieve item ``i + 1``.
"""

from __future__ import annotations

import contextlib
from typing import Dict, Optional, Tuple

import torch
from torch import nn
from torchrec import EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor

from ..datasets.schema import ACTION_BITS
from ..distributed.sharded_state import local_pieces
from ..metrics.flops import sampled_softmax_flops
from ..modules.hstu import HSTUEncoder
from ..modules.row_gather import take_rows
from ..sampling import NegativeSample, SampledSoftmaxLoss
from .batch import SequenceBatch, query_positions
from .config import ENCODERS, ModelConfig, embedding_columns
from .sasrec import SASRecEncoder

__all__ = ["GenerativeRetrieval", "SequenceHead", "build_encoder", "NUM_ACTIONS", "TABLE",
           "COMPUTE_DTYPES", "action_features", "item_kjt", "init_item_table", "init_table",
           "table_weights"]

NUM_ACTIONS = len(ACTION_BITS)   # one byte of action bits per event
TABLE = "item_table"


def action_features(actions: torch.Tensor) -> torch.Tensor:
    """uint8 action bits ``[T]`` -> float ``[T, 8]`` of 0/1."""
    shifts = torch.arange(NUM_ACTIONS, device=actions.device)
    return ((actions.to(torch.int64)[:, None] >> shifts) & 1).to(torch.float32)


def item_kjt(items: torch.Tensor, lengths: torch.Tensor,
             negatives: Optional[torch.Tensor] = None) -> KeyedJaggedTensor:
    """The model's KJT: ``item`` = the sequences, ``neg`` = ``negatives`` in row 0 (or none)."""
    neg = negatives if negatives is not None else items.new_zeros(0)
    neg_len = torch.zeros_like(lengths)
    if lengths.numel():
        neg_len[0] = neg.numel()
    return KeyedJaggedTensor.from_lengths_sync(
        keys=["item", "neg"], values=torch.cat([items, neg.to(items.dtype)]),
        lengths=torch.cat([lengths, neg_len]))


@torch.no_grad()
def init_table(weight: object, num_rows: int, dim: int, seed: int, block_rows: int = 4096) -> None:
    """Initialise one (sharded or not) table as a function of the global row: rows
    ``[k B, (k + 1) B)`` are drawn uniform in ``+-sqrt(1 / num_rows)`` (TorchRec's default
    range) from a generator seeded by ``(seed, k)``, so every sharding and world size starts
    from the same table (each rank draws only the blocks its shards overlap).  ``num_rows`` x
    ``dim``: the table's global shape."""
    bound = (1.0 / int(num_rows)) ** 0.5
    pieces = local_pieces(weight)
    if pieces is None:
        raise ValueError(f"model: a DTensor table whose local tensor is a "
                         f"{type(weight.to_local()).__name__}, not TorchRec's LocalShardsWrapper")
    for (r0, c0), t in pieces:
        rows = t.shape[0]
        for k in range(r0 // block_rows, (r0 + rows + block_rows - 1) // block_rows):
            g = torch.Generator().manual_seed(int(seed) * 1_000_003 + k)
            lo, hi = k * block_rows, min((k + 1) * block_rows, int(num_rows))
            blk = torch.empty(hi - lo, dim).uniform_(-bound, bound, generator=g)
            a, b = max(lo, r0), min(hi, r0 + rows)
            t[a - r0:b - r0].copy_(blk[a - lo:b - lo, c0:c0 + t.shape[1]].to(t.dtype))


def table_weights(model: nn.Module) -> Dict[str, object]:
    """``{table: weight}`` of every TorchRec embedding table in ``model``'s state dict (sharded
    or not)."""
    out = {}
    for key, value in model.state_dict().items():
        parts = key.split(".")
        if len(parts) >= 3 and parts[-1] == "weight" and parts[-3] in ("embeddings",
                                                                      "embedding_bags"):
            out[parts[-2]] = value
    return out


def init_item_table(model: nn.Module, num_items: int, dim: int, seed: int,
                    block_rows: int = 4096) -> None:
    """:func:`init_table` of the retrieval model's item table."""
    weights = table_weights(model)
    if TABLE not in weights:
        raise ValueError(f"model: no {TABLE} weight in its state dict")
    init_table(weights[TABLE], num_items, dim, seed, block_rows)


def build_encoder(kind: str, cfg: ModelConfig) -> nn.Module:
    """``hstu`` (:class:`~torchrec_ascend.modules.hstu.HSTUEncoder`) or ``sasrec``."""
    if kind == "hstu":
        return HSTUEncoder(cfg.embedding_dim, cfg.num_layers, cfg.num_heads, cfg.attention_dim,
                           cfg.linear_dim, cfg.max_seq_len, dropout=cfg.dropout,
                           attn_alpha=cfg.attn_alpha, normalization=cfg.normalization,
                           use_time_bias=cfg.use_time_bias,
                           num_time_buckets=cfg.num_time_buckets)
    if kind == "sasrec":
        return SASRecEncoder(cfg.embedding_dim, cfg.num_layers, cfg.sasrec_num_heads,
                             cfg.sasrec_ffn, cfg.max_seq_len, dropout=cfg.dropout)
    raise ValueError(f"encoder: {kind!r} is not one of {list(ENCODERS)}")


COMPUTE_DTYPES = (torch.float32, torch.bfloat16)


class SequenceHead(nn.Module):
    """Everything after the embedding lookup: actions projection, encoder, sampled softmax.

    ``compute_dtype``: ``torch.float32``, or ``torch.bfloat16`` for mixed precision: the encoder
    runs under ``torch.autocast(dtype=bfloat16)`` (its matmuls and the HSTU attention kernel in
    bf16; parameters, LayerNorms, the output L2 norm stay fp32) and the sampled softmax computes
    its shared-pool logit GEMM from bf16 rows with fp32 output (``half_precision="bf16"``),
    logsumexp and loss in fp32.  Parameters (master weights) and gradients are fp32 either way.
    """

    def __init__(self, cfg: ModelConfig, encoder: str = "hstu", temperature: float = 0.05,
                 compute_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype: {compute_dtype} is not one of "
                             f"{[str(d) for d in COMPUTE_DTYPES]}")
        self.cfg, self.kind = cfg, encoder
        self.embedding_dim = cfg.embedding_dim
        self.compute_dtype = compute_dtype
        self.action_proj = (nn.Linear(NUM_ACTIONS, cfg.embedding_dim, bias=False)
                            if cfg.use_actions else None)
        self.encoder = build_encoder(encoder, cfg)
        half = "bf16" if compute_dtype == torch.bfloat16 else None
        self.loss_fn = SampledSoftmaxLoss(temperature=temperature, reduction="sum",
                                          half_precision=half, half_compute="half")

    def encode(self, item_emb: torch.Tensor, offsets: torch.Tensor, timestamps: torch.Tensor,
               actions: torch.Tensor, unit_norm: bool = True) -> torch.Tensor:
        """Item embeddings ``[T, D]`` (+ actions) -> unit-norm sequence embeddings ``[T, D]``
        (in ``item_emb``'s dtype; computed in ``compute_dtype`` under autocast); ``unit_norm=False``:
        the encoder's output before its L2 normalisation."""
        x = embedding_columns(item_emb, self.embedding_dim)
        if self.action_proj is not None:
            # in fp32 even under mixed precision: an [T, 8] @ [8, D] product costs nothing there,
            # while in bf16 on the CPU every new T would build a oneDNN primitive (device.py)
            # x + features @ W^T in one pass (addmm), not the product's [T, D] and then the sum
            x = torch.addmm(x, action_features(actions).to(x.dtype), self.action_proj.weight.t())
        mixed = self.compute_dtype != torch.float32
        # no autocast object at all in fp32: its constructor rejects devices without AMP
        # support (the simulated npu) even when disabled
        amp = (torch.autocast(x.device.type, dtype=self.compute_dtype) if mixed
               else contextlib.nullcontext())
        with amp:
            out = self.encoder(x, offsets, timestamps, normalize=unit_norm)
        return out.to(item_emb.dtype) if mixed else out

    def forward(self, lookups: Dict[str, object], batch: SequenceBatch
                ) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        """``(loss, (loss.detach(), stats))``: ``loss`` = sum of the queries' losses times
        ``batch.loss_scale``; ``stats`` = float64 cpu ``[queries, tokens, step FLOPs]`` (forward
        + backward matmul FLOPs of this batch, for MFU)."""
        if batch.pos_log_q is None or batch.neg_log_q is None or batch.loss_scale is None:
            raise ValueError("batch: a training batch needs pos_log_q, neg_log_q and loss_scale")
        emb = embedding_columns(lookups["item"].values(), self.embedding_dim)  # type: ignore[attr-defined]
        neg_emb = embedding_columns(lookups["neg"].values(), self.embedding_dim)  # type: ignore[attr-defined]
        items = batch.kjt["item"].values()  # type: ignore[index]
        neg_ids = batch.kjt["neg"].values()  # type: ignore[index]
        # the loss L2-normalises its query rows itself: the encoder's normalisation of every row
        # would be a second one (l2(l2(x)) = l2(x); one [T, D] pass each way saved)
        seq = self.encode(emb, batch.offsets, batch.timestamps, batch.actions,
                          unit_norm=not self.loss_fn.l2_normalize)
        q = query_positions(batch.offsets, items.numel())
        idx = batch.neg_index
        if idx is None:  # one shared pool
            num_negatives = int(neg_ids.numel())
        else:  # per-query negatives: distinct ids looked up once, indexed per query
            neg_ids, num_negatives = neg_ids[idx], int(idx.shape[1])
        sample = NegativeSample(neg_ids, batch.neg_log_q, batch.pos_log_q[q])
        # q is strictly increasing: take_rows' backward writes each row once (modules/row_gather.py)
        loss = self.loss_fn(take_rows(seq, q), items[q + 1], take_rows(emb, q + 1), sample, neg_emb,
                            neg_index=idx) * batch.loss_scale
        stats = torch.tensor([float(q.numel()), float(items.numel()),
                              self.step_flops(batch.offsets, num_negatives)],
                             dtype=torch.float64)
        return loss, (loss.detach(), stats)

    def step_flops(self, offsets: torch.Tensor, num_negatives: int) -> float:
        """Forward + backward matmul FLOPs of one training step on this rank's batch."""
        lengths = offsets[1:] - offsets[:-1]
        queries = int((lengths - 1).clamp(min=0).sum())
        return (float(self.encoder.flops(offsets, backward=True))
                + 3.0 * sampled_softmax_flops(queries, self.embedding_dim, num_negatives))


class GenerativeRetrieval(nn.Module):
    """Sharded item embeddings + :class:`SequenceHead` (see the module docstring).

    Args:
        num_items: rows of the item table (the corpus).
        cfg: sizes (:class:`~torchrec_ascend.models.config.ModelConfig`).
        encoder: ``"hstu"`` or ``"sasrec"``.
        temperature: of the sampled softmax.
        device: where the table is created (``meta``: DistributedModelParallel materialises
            the shards on the training device).
        compute_dtype: ``torch.float32`` or ``torch.bfloat16`` (mixed precision of the dense
            head, :class:`SequenceHead`); the table stays fp32.
    """

    def __init__(self, num_items: int, cfg: ModelConfig, encoder: str = "hstu",
                 temperature: float = 0.05, device: torch.device = torch.device("meta"),
                 compute_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if num_items < 1:
            raise ValueError(f"num_items: must be >= 1, got {num_items}")
        self.num_items, self.cfg, self.kind = int(num_items), cfg, encoder
        self.ec = EmbeddingCollection(
            tables=[EmbeddingConfig(name=TABLE, embedding_dim=cfg.table_dim,
                                    num_embeddings=num_items, feature_names=["item", "neg"])],
            device=device)
        self.head = SequenceHead(cfg, encoder, temperature, compute_dtype)

    def forward(self, batch: SequenceBatch):
        """Training loss of one batch: ``(loss, (loss.detach(), stats))``
        (:class:`SequenceHead`)."""
        return self.head(self.ec(batch.kjt), batch)
