"""HSTU (Hierarchical Sequential Transduction Unit) on jagged inputs, padding-free.

Inputs are jagged: ``values [T, D]`` plus ``offsets [B + 1]`` (sequence ``b`` is rows
``offsets[b]:offsets[b + 1]``), or a TorchRec ``JaggedTensor`` (duck-typed: anything with
``values()`` and ``offsets()``; torchrec is never imported here).  Attention runs through the fused
op :func:`torchrec_ascend.ops.hstu.hstu_mha` (Triton / C++ CPU kernel / padded reference, picked by
the op registry), so no ``[B, N, N]`` tensor is built on the fast paths.

Public API (stable; the KuaiRand example uses it)::

    HSTUEncoder(num_items_embedding_dim: int, num_layers: int, num_heads: int, attention_dim: int,
                linear_dim: int, max_seq_len: int, dropout: float = 0.0,
                attn_alpha: float | None = None, normalization: str = "max_len",
                use_time_bias: bool = True, num_time_buckets: int = 128,
                contextual_seq_len: int = 0, l2_normalize: bool = True)
        .forward(item_embeddings [T, D] | JaggedTensor, offsets [B + 1] | None = None,
                 timestamps [T] | None = None, num_targets [B] | None = None,
                 normalize: bool | None = None) -> [T, D]
        .flops(offsets, backward=False) -> int;  .flops_per_token(seq_len) -> float
    InputPreprocessor(embedding_dim, max_seq_len, dropout=0.0)   x * sqrt(D) + pos_emb[p], dropout
    RelativeBias(max_seq_len, num_time_buckets=128, use_time_bias=True)   per-layer bias tables
    HSTUBlock(embedding_dim, num_heads, attention_dim, linear_dim, max_seq_len, ...)   one layer
    HSTUStack(num_layers, embedding_dim, num_heads, attention_dim, linear_dim, max_seq_len, ...)

One block (generative-recommenders' ``SequentialTransductionUnitJagged``; ``LN`` has no affine
parameters, eps 1e-6)::

    u, v, q, k = split(silu(LN(x) @ W_uvqk))                       # one bias-free projection
    a_i = sum_j valid(i, j) * silu(alpha * q_i . k_j + rab(i, j)) / N * v_j   # per head
    x'  = Linear(dropout(u * LN(a))) + x
    (LN(x) with its cast to the compute dtype, silu + split, dropout(u * LN(a)) and the residual
    with the output bias fused on CPU: modules/hstu_fused.py)

``rab(i, j) = pos_w[max_seq_len - 1 + j - i] + ts_w[bucket(ts[i + 1] - ts[j])]`` with
``bucket(dt) = clamp(floor(ln(max(|dt|, 1)) / 0.301), 0, num_time_buckets)`` (learned per layer);
``N`` is ``max_seq_len`` (``normalization="max_len"``, the paper's choice) or the sequence's own
length (``"seq_len"``); ``alpha`` defaults to ``1 / sqrt(attention_dim)``.  ``valid`` is causal
including self; with ``num_targets`` the last ``num_targets[b]`` tokens (candidates) see the
history and themselves only; the first ``contextual_seq_len`` tokens are visible to all.  The
encoder L2-normalises its output embeddings (retrieval scores cosines) unless
``l2_normalize=False`` (a ranker's heads read them as they are); ``forward(..., normalize=False)``
skips it for one call (a loss that normalises its query rows itself: the training step).
Details and choices: docs/hstu.md.

FLOPs (for MFU; matmul FLOPs only, 2 per multiply-add; elementwise, LayerNorm and bias ignored),
per layer for a sequence of length ``n``::

    projection  2 * n * D * H * (2 * dv + 2 * dqk)
    attention   2 * n * (n + 1) / 2 * H * (dqk + dv)      (causal pairs incl. self)
    output      2 * n * H * dv * D

:meth:`HSTUEncoder.flops` sums this over sequences and layers; ``backward=True`` counts forward +
backward as 3x forward.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple, Union

import torch
from torch import nn

from ..ops import hstu as hstu_ops
from . import hstu_fused
from .l2norm import l2_normalize
from .projection import compute_dtype, project
from .row_padding import pad_jagged, real_rows, row_multiple

__all__ = [
    "HSTUEncoder",
    "HSTUStack",
    "HSTUBlock",
    "InputPreprocessor",
    "RelativeBias",
    "hstu_flops",
]

_EPS = 1e-6


def _unpack(values: object, offsets: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(values, offsets)`` from tensors or a JaggedTensor-like object."""
    if not isinstance(values, torch.Tensor):
        if not (hasattr(values, "values") and hasattr(values, "offsets")):
            raise ValueError(
                f"item_embeddings: expected a Tensor [T, D] or a JaggedTensor, got {type(values).__name__}")
        if offsets is not None:
            raise ValueError("offsets: must be None when a JaggedTensor is given (it has its own)")
        return values.values(), values.offsets()  # type: ignore[attr-defined]
    if offsets is None:
        raise ValueError("offsets: required with a values tensor ([B + 1] int32/int64)")
    return values, offsets


def _positions(offsets: torch.Tensor, total: int) -> torch.Tensor:
    """Position of every row inside its own sequence (``[T]`` int64), no host sync."""
    rows = torch.arange(total, device=offsets.device, dtype=torch.int64)
    off = offsets.to(torch.int64)
    seq = torch.searchsorted(off[1:], rows, right=True)
    return rows - off[seq]


def hstu_flops(offsets: torch.Tensor, num_layers: int, embedding_dim: int, num_heads: int,
               attention_dim: int, linear_dim: int, backward: bool = False) -> int:
    """Matmul FLOPs of an HSTU stack over a jagged batch (formula in the module docstring)."""
    lengths = (offsets[1:] - offsets[:-1]).to(torch.float64)
    tokens = float(lengths.sum())
    pairs = float((lengths * (lengths + 1) / 2).sum())
    H, D, dqk, dv = num_heads, embedding_dim, attention_dim, linear_dim
    per_layer = (2 * tokens * D * H * (2 * dv + 2 * dqk) + 2 * pairs * H * (dqk + dv)
                 + 2 * tokens * H * dv * D)
    return int(per_layer * num_layers * (3 if backward else 1))


class RelativeBias(nn.Module):
    """One layer's learned relative attention bias: position table ``pos_w [2N - 1]`` and (with
    ``use_time_bias``) time-bucket table ``ts_w [num_time_buckets + 1]``, both N(0, 0.02).

    The tables are handed to the fused kernel (:meth:`attention_kwargs`), which computes
    ``pos_w[N - 1 + j - i] + ts_w[bucket(ts[i + 1] - ts[j])]`` per score and never materialises a
    ``[B, N, N]`` bias."""

    def __init__(self, max_seq_len: int, num_time_buckets: int = 128,
                 use_time_bias: bool = True) -> None:
        super().__init__()
        if max_seq_len < 1:
            raise ValueError(f"max_seq_len: must be >= 1, got {max_seq_len}")
        if use_time_bias and num_time_buckets < 1:
            raise ValueError(f"num_time_buckets: must be >= 1, got {num_time_buckets}")
        self.max_seq_len = int(max_seq_len)
        self.num_time_buckets = int(num_time_buckets)
        self.pos_w = nn.Parameter(torch.empty(2 * max_seq_len - 1).normal_(0.0, 0.02))
        self.ts_w: Optional[nn.Parameter] = (
            nn.Parameter(torch.empty(num_time_buckets + 1).normal_(0.0, 0.02)) if use_time_bias else None)

    @property
    def use_time_bias(self) -> bool:
        return self.ts_w is not None

    def attention_kwargs(self, timestamps: Optional[torch.Tensor],
                         dtype: Optional[torch.dtype] = None) -> Dict[str, Optional[torch.Tensor]]:
        """Keyword arguments of :func:`~torchrec_ascend.ops.hstu.hstu_mha` for this bias; the
        tables in ``dtype`` (the attention inputs' dtype, e.g. bf16 under autocast; the cast is
        differentiable, so the fp32 tables get fp32 gradients)."""
        if self.ts_w is not None and timestamps is None:
            raise ValueError("timestamps: required when the time bias is enabled (use_time_bias=True)")
        pos_w, ts_w = self.pos_w, self.ts_w
        if dtype is not None:
            pos_w = pos_w.to(dtype)
            ts_w = ts_w.to(dtype) if ts_w is not None else None
        return {"pos_w": pos_w, "ts_w": ts_w,
                "timestamps": timestamps if self.ts_w is not None else None}


class InputPreprocessor(nn.Module):
    """``dropout(x * sqrt(D) + pos_emb[p])`` with ``p`` the row's position in its sequence
    (learned absolute positions, ``max_seq_len`` of them, N(0, 1/sqrt(D)) init)."""

    def __init__(self, embedding_dim: int, max_seq_len: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.embedding_dim = int(embedding_dim)
        self.max_seq_len = int(max_seq_len)
        self.pos_emb = nn.Embedding(max_seq_len, embedding_dim)
        nn.init.normal_(self.pos_emb.weight, 0.0, 1.0 / math.sqrt(embedding_dim))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """``x [T, D]``, ``offsets [B + 1]`` -> ``[T, D]``."""
        pos = _positions(offsets, x.shape[0])
        # lookup, scaled sum and dropout in one kernel pass each way (modules/hstu_fused.py)
        return hstu_fused.input_rows(x, self.pos_emb.weight, pos, math.sqrt(self.embedding_dim),
                                     self.dropout.p, self.training)


class HSTUBlock(nn.Module):
    """One HSTU layer on a jagged batch (equations in the module docstring)."""

    def __init__(
        self,
        embedding_dim: int,
        num_heads: int,
        attention_dim: int,
        linear_dim: int,
        max_seq_len: int,
        dropout: float = 0.0,
        attn_alpha: Optional[float] = None,
        normalization: str = "max_len",
        relative_bias: Optional[RelativeBias] = None,
        contextual_seq_len: int = 0,
    ) -> None:
        super().__init__()
        if normalization not in hstu_ops.NORMALIZATIONS:
            raise ValueError(f"normalization: must be one of {hstu_ops.NORMALIZATIONS}, got {normalization!r}")
        for name, val in (("embedding_dim", embedding_dim), ("num_heads", num_heads),
                          ("attention_dim", attention_dim), ("linear_dim", linear_dim),
                          ("max_seq_len", max_seq_len)):
            if int(val) < 1:
                raise ValueError(f"{name}: must be >= 1, got {val}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout: must be in [0, 1), got {dropout}")
        if contextual_seq_len < 0:
            raise ValueError(f"contextual_seq_len: must be >= 0, got {contextual_seq_len}")
        self.embedding_dim, self.num_heads = int(embedding_dim), int(num_heads)
        self.attention_dim, self.linear_dim = int(attention_dim), int(linear_dim)
        self.max_seq_len = int(max_seq_len)
        self.alpha = float(attn_alpha) if attn_alpha is not None else 1.0 / math.sqrt(attention_dim)
        self.normalization = normalization
        self.contextual_seq_len = int(contextual_seq_len)
        self.relative_bias = relative_bias
        self.uvqk = nn.Parameter(torch.empty(
            embedding_dim, num_heads * (2 * linear_dim + 2 * attention_dim)).normal_(0.0, 0.02))
        self.output = nn.Linear(num_heads * linear_dim, embedding_dim)
        nn.init.xavier_uniform_(self.output.weight)
        nn.init.zeros_(self.output.bias)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        offsets: torch.Tensor,
        timestamps: Optional[torch.Tensor] = None,
        num_targets: Optional[torch.Tensor] = None,
        validate: bool = True,
    ) -> torch.Tensor:
        """``x [T, D]`` -> ``[T, D]``; ``timestamps [T]`` feed the time bias, ``num_targets [B]``
        marks candidate tokens (see module docstring)."""
        if x.dim() != 2 or x.shape[1] != self.embedding_dim:
            raise ValueError(f"x: expected [T, {self.embedding_dim}], got {tuple(x.shape)}")
        T, H = x.shape[0], self.num_heads
        dv, dqk = self.linear_dim, self.attention_dim
        # fused on CPU (modules/hstu_fused.py), the same torch ops elsewhere: the pre-norm written
        # in the dtype the projection multiplies in (bf16 under autocast; statistics in fp32; x
        # for the residual through the same node: one backward pass adds both gradients),
        # silu + split into contiguous u, v, q, k, and dropout(u * LN(attn))
        normed, skip = hstu_fused.pre_norm(x, compute_dtype(x))
        h = project(normed, self.uvqk)  # modules/projection.py
        u, v, q, k = hstu_fused.silu_split(h, [H * dv, H * dv, H * dqk, H * dqk])
        bias = (self.relative_bias.attention_kwargs(timestamps, h.dtype)
                if self.relative_bias is not None else {})
        attn = hstu_ops.hstu_mha(
            q.view(T, H, dqk), k.view(T, H, dqk), v.view(T, H, dv), offsets,
            max_seq_len=self.max_seq_len, alpha=self.alpha, normalization=self.normalization,
            num_targets=num_targets, contextual_seq_len=self.contextual_seq_len,
            validate=validate, **bias,
        ).reshape(T, H * dv)
        # the output projection through project() too (its weight gradient on a contiguous g^T,
        # written in the layout of nn.Linear's [out, in] weight),
        # its bias and the residual added in fp32 in one pass
        o = project(hstu_fused.norm_gate(attn, u, self.dropout.p, self.training), self.output.weight.t())
        return hstu_fused.residual_add(skip, o, self.output.bias)


class HSTUStack(nn.Module):
    """``num_layers`` HSTU blocks, each with its own :class:`RelativeBias`."""

    def __init__(
        self,
        num_layers: int,
        embedding_dim: int,
        num_heads: int,
        attention_dim: int,
        linear_dim: int,
        max_seq_len: int,
        dropout: float = 0.0,
        attn_alpha: Optional[float] = None,
        normalization: str = "max_len",
        use_time_bias: bool = True,
        num_time_buckets: int = 128,
        contextual_seq_len: int = 0,
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers: must be >= 1, got {num_layers}")
        self.layers = nn.ModuleList([
            HSTUBlock(embedding_dim, num_heads, attention_dim, linear_dim, max_seq_len, dropout,
                      attn_alpha, normalization,
                      RelativeBias(max_seq_len, num_time_buckets, use_time_bias), contextual_seq_len)
            for _ in range(num_layers)
        ])

    def forward(self, x: torch.Tensor, offsets: torch.Tensor, timestamps: Optional[torch.Tensor] = None,
                num_targets: Optional[torch.Tensor] = None, validate: bool = True) -> torch.Tensor:
        """``x [T, D]`` -> ``[T, D]``; inputs are validated once (by the first layer).  On the
        CPU in half precision the batch runs with padding rows (modules/row_padding.py)."""
        b = pad_jagged(x, offsets, timestamps, num_targets, row_multiple(x), self.layers[0].max_seq_len)
        x = b.x
        for i, layer in enumerate(self.layers):
            x = layer(x, b.offsets, b.timestamps, b.num_targets, validate=validate and i == 0)
        return real_rows(x, b.rows)


class HSTUEncoder(nn.Module):
    """Input preprocessor + HSTU stack + L2-normalised output embeddings (signature in the module
    docstring)."""

    def __init__(
        self,
        num_items_embedding_dim: int,
        num_layers: int,
        num_heads: int,
        attention_dim: int,
        linear_dim: int,
        max_seq_len: int,
        dropout: float = 0.0,
        attn_alpha: Optional[float] = None,
        normalization: str = "max_len",
        use_time_bias: bool = True,
        num_time_buckets: int = 128,
        contextual_seq_len: int = 0,
        l2_normalize: bool = True,
    ) -> None:
        super().__init__()
        self.l2_normalize = bool(l2_normalize)
        self.embedding_dim = int(num_items_embedding_dim)
        self.num_layers, self.num_heads = int(num_layers), int(num_heads)
        self.attention_dim, self.linear_dim = int(attention_dim), int(linear_dim)
        self.max_seq_len = int(max_seq_len)
        self.preprocessor = InputPreprocessor(num_items_embedding_dim, max_seq_len, dropout)
        self.stack = HSTUStack(num_layers, num_items_embedding_dim, num_heads, attention_dim,
                               linear_dim, max_seq_len, dropout, attn_alpha, normalization,
                               use_time_bias, num_time_buckets, contextual_seq_len)

    def forward(
        self,
        item_embeddings: Union[torch.Tensor, object],
        offsets: Optional[torch.Tensor] = None,
        timestamps: Optional[torch.Tensor] = None,
        num_targets: Optional[torch.Tensor] = None,
        normalize: Optional[bool] = None,
    ) -> torch.Tensor:
        """``item_embeddings [T, D]`` + ``offsets [B + 1]`` (or a JaggedTensor) -> ``[T, D]``
        sequence embeddings (unit-norm with ``l2_normalize``, or with ``normalize`` where given)."""
        x, offsets = _unpack(item_embeddings, offsets)
        if x.dim() != 2 or x.shape[1] != self.embedding_dim:
            raise ValueError(f"item_embeddings: expected [T, {self.embedding_dim}], got {tuple(x.shape)}")
        if offsets.numel() > 1:
            longest = int((offsets[1:] - offsets[:-1]).max())
            if longest > self.max_seq_len:
                raise ValueError(f"offsets: a sequence has length {longest} > max_seq_len={self.max_seq_len}")
        x = self.preprocessor(x, offsets)
        x = self.stack(x, offsets, timestamps, num_targets)
        if not (self.l2_normalize if normalize is None else normalize):
            return x
        return l2_normalize(x, _EPS)

    def flops(self, offsets: torch.Tensor, backward: bool = False) -> int:
        """Matmul FLOPs of one forward (``backward=True``: forward + backward = 3x) on this batch."""
        return hstu_flops(offsets, self.num_layers, self.embedding_dim, self.num_heads,
                          self.attention_dim, self.linear_dim, backward)

    def flops_per_token(self, seq_len: int, backward: bool = False) -> float:
        """Average FLOPs per token of a sequence of length ``seq_len``."""
        off = torch.tensor([0, int(seq_len)])
        return self.flops(off, backward) / max(int(seq_len), 1)
