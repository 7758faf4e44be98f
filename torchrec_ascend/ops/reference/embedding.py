"""Torch-composite table-batched embedding (TBE): lookup forward, fused-optimizer backward.

Layout (fbgemm's, see docs/embedding_ops.md): ``T`` features, batch ``B``; ``offsets [T*B + 1]``
delimit bag ``t*B + b`` in ``indices`` (row ids local to feature ``t``'s table); all tables live
back to back in one flat ``weights`` tensor, row ``i`` of feature ``t`` at
``weights[weights_offsets[t] + i*D_t : ... + D_t]`` with ``D_t = D_offsets[t+1] - D_offsets[t]``.
Features sharing a table share ``weights_offsets`` (and state offsets).

Everything is gather / index_add / unique over all indices at once (no Python loop over the
batch or the tables), padded to ``max_D`` columns with a mask where tables have mixed dims.
Arithmetic is fp32 for fp16/bf16/fp32 weights (fbgemm's accumulation type), fp64 for fp64.
Indices past ``offsets[-1]`` belong to no bag and are ignored.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

__all__ = [
    "SUM",
    "MEAN",
    "NONE",
    "output_dtype_of",
    "pooled_forward",
    "nobag_forward",
    "grad_indice_weights",
    "row_grads",
    "apply_sgd",
    "apply_adagrad",
    "apply_rowwise_adagrad",
    "apply_adam",
    "dense_lookup",
    "dense_lookup_backward",
]

SUM, MEAN, NONE = 0, 1, 2  # fbgemm PoolingMode
# fbgemm SparseType ints -> torch dtypes (FP32, FP16, BF16); anything else: the weights' dtype
_OUTPUT_DTYPES = {0: torch.float32, 1: torch.float16, 5: torch.bfloat16}


def output_dtype_of(weights: torch.Tensor, output_dtype: int) -> torch.dtype:
    """The torch dtype of fbgemm's ``output_dtype`` (a SparseType int); float64 weights (which
    fbgemm does not take) always give float64 output."""
    if weights.dtype == torch.float64:
        return torch.float64
    return _OUTPUT_DTYPES.get(int(output_dtype), weights.dtype)


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def pick(host: torch.Tensor, dev: torch.Tensor) -> torch.Tensor:
    """The tensor that holds the data: host (CPU training) when non-empty, else dev."""
    return host if host.numel() > 0 else dev


class _Layout:
    """Per-index bookkeeping shared by forward and backward (all ``[N]`` tensors).

    bag: bag id ``t*B + b``; valid: the index belongs to a bag; t, b: feature and sample;
    D: the feature's dim; start: flat position of the row's first element in ``weights``.
    """

    def __init__(self, weights_offsets, D_offsets, D, indices, offsets):
        dev = indices.device
        T = weights_offsets.numel()
        self.T = T
        self.B = (offsets.numel() - 1) // T if T > 0 else 0
        self.N = indices.numel()
        offs = offsets.to(torch.int64)
        pos = torch.arange(self.N, device=dev, dtype=torch.int64)
        TB = self.T * self.B
        # bag of position p: number of bag ends <= p (ends past the last bag: TB = no bag)
        bag = torch.searchsorted(offs[1:TB + 1].contiguous(), pos, right=True)
        self.valid = bag < TB
        self.bag = torch.clamp(bag, max=max(TB - 1, 0))
        self.t = torch.div(self.bag, max(self.B, 1), rounding_mode="floor")
        self.b = self.bag - self.t * self.B
        if D_offsets is not None:
            d_of = D_offsets.to(torch.int64)
            self.D_t = d_of[1:] - d_of[:-1]
            self.D_begin = d_of[:-1][self.t]
        else:
            self.D_t = torch.full((T,), int(D), dtype=torch.int64, device=dev)
            self.D_begin = torch.zeros_like(self.t)
        self.D = self.D_t[self.t]
        # one dim for every feature (a host-side check on a [T] tensor): enables the row fast path
        self.uniform = D_offsets is None or bool((self.D_t == self.D_t[:1]).all()) if T > 0 else True
        self.w_aligned = _aligned(self.uniform, weights_offsets, int(self.D_t[0])) if T > 0 else False
        self.idx = indices.to(torch.int64)
        self.start = weights_offsets.to(torch.int64)[self.t] + self.idx * self.D
        lengths = offs[1:TB + 1] - offs[:TB]
        self.L = lengths[self.bag] if TB > 0 else torch.zeros_like(pos)


class _Rows:
    """Rows ``flat[start[i] + d]`` for ``d < D[i]``, read as ``values [len(start), max_D]`` (0 past
    ``D[i]`` and for rows with ``valid == False``), and written back with :meth:`store` /
    :meth:`accumulate`.

    ``aligned``: every row is a whole row of ``flat.view(-1, max_D)`` (one dim for all tables,
    offsets multiples of it): then rows move with index_select / index_copy_ (fast path);
    otherwise element positions ``[len(start), max_D]`` are gathered under a mask."""

    def __init__(self, flat, start, D, max_D: int, valid=None, aligned: bool = False):
        self.flat, self.max_D = flat, int(max_D)
        n = start.shape[0]
        self.fast = aligned and self.max_D > 0 and flat.numel() % self.max_D == 0
        if self.fast:
            self.row = torch.div(start, self.max_D, rounding_mode="floor")
            if valid is not None:
                self.row = torch.where(valid, self.row, 0)
                self.mask = valid[:, None].expand(n, self.max_D)
            else:
                self.mask = None
            view = flat.view(-1, self.max_D)
            vals = view.index_select(0, self.row) if flat.numel() else flat.new_zeros(n, self.max_D)
        else:
            cols = torch.arange(self.max_D, device=start.device, dtype=torch.int64)
            self.mask = cols[None, :] < D[:, None]
            if valid is not None:
                self.mask = self.mask & valid[:, None]
            self.pos = torch.where(self.mask, start[:, None] + cols[None, :], 0)
            vals = flat[self.pos.reshape(-1)].reshape(self.pos.shape) if flat.numel() else \
                flat.new_zeros(self.pos.shape)
        self.values = vals if self.mask is None else vals * self.mask.to(vals.dtype)

    def store(self, new: torch.Tensor) -> None:
        """Write ``new`` into the (distinct, valid) rows."""
        if self.fast:
            self.flat.view(-1, self.max_D).index_copy_(0, self.row, new.to(self.flat.dtype))
        else:
            self.flat.index_put_((self.pos[self.mask],), new[self.mask].to(self.flat.dtype))

    def accumulate(self, new: torch.Tensor) -> None:
        """Add ``new`` into the rows (duplicates add up)."""
        if self.fast:
            self.flat.view(-1, self.max_D).index_add_(0, self.row, new.to(self.flat.dtype))
        else:
            self.flat.index_put_((self.pos[self.mask],), new[self.mask].to(self.flat.dtype), accumulate=True)


def _aligned(uniform: bool, offsets: torch.Tensor, D: int) -> bool:
    """One dim for all tables and every table (state) offset a multiple of it."""
    return uniform and bool((offsets.to(torch.int64) % int(D) == 0).all())


def _scale(lay: _Layout, indice_weights: Optional[torch.Tensor], pooling_mode: int, acc) -> torch.Tensor:
    """Per-index factor: per-sample weight, times ``1/L`` under MEAN (fbgemm's forward scales
    weighted MEAN bags by ``1/L`` too)."""
    s = torch.ones(lay.N, dtype=acc, device=lay.idx.device)
    if indice_weights is not None and indice_weights.numel() > 0:
        s = s * indice_weights.to(acc)
    if int(pooling_mode) == MEAN:
        s = s / torch.clamp(lay.L, min=1).to(acc)
    return s * lay.valid.to(acc)


def pooled_forward(weights, weights_offsets, D_offsets, total_D: int, max_D: int, indices, offsets,
                   pooling_mode: int, indice_weights=None, output_dtype: int = 0) -> torch.Tensor:
    """Pooled lookup ``[B, total_D]``: bag sum (or mean) of rows, times per-sample weights."""
    acc = _acc(weights.dtype)
    lay = _Layout(weights_offsets, D_offsets, None, indices, offsets)
    max_D, total_D = int(max_D), int(total_D)
    if lay.N == 0 or lay.B == 0:
        return torch.zeros(lay.B, total_D, dtype=output_dtype_of(weights, output_dtype), device=weights.device)
    rows = _Rows(weights, lay.start, lay.D, max_D, lay.valid, lay.w_aligned)
    vals = rows.values.to(acc) * _scale(lay, indice_weights, pooling_mode, acc)[:, None]
    if lay.uniform and total_D == lay.T * max_D:
        # output row b holds features t = 0..T-1 side by side: accumulate into [B*T (+1 spare), D]
        out = torch.zeros(lay.B * lay.T + 1, max_D, dtype=acc, device=weights.device)
        dst = torch.where(lay.valid, lay.b * lay.T + lay.t, lay.B * lay.T)
        out.index_add_(0, dst, vals)
        out = out[:-1].reshape(lay.B, total_D)
    else:
        out_flat = torch.zeros(lay.B * total_D + 1, dtype=acc, device=weights.device)
        cols = torch.arange(max_D, device=weights.device, dtype=torch.int64)
        dst = lay.b[:, None] * total_D + lay.D_begin[:, None] + cols[None, :]
        dst = torch.where(rows.mask, dst, lay.B * total_D)  # masked -> the spare last slot
        out_flat.index_add_(0, dst.reshape(-1), vals.reshape(-1))
        out = out_flat[:-1].reshape(lay.B, total_D)
    return out.to(output_dtype_of(weights, output_dtype))


def nobag_forward(weights, weights_offsets, D: int, indices, offsets, output_dtype: int = 0) -> torch.Tensor:
    """Sequence lookup (no pooling) ``[N, D]``: row of each index (zero for indices in no bag)."""
    lay = _Layout(weights_offsets, None, D, indices, offsets)
    rows = _Rows(weights, lay.start, lay.D, int(D), lay.valid, lay.w_aligned)
    return rows.values.to(output_dtype_of(weights, output_dtype))


def _index_grads(grad_output, lay: _Layout, max_D: int, pooling_mode: int, indice_weights, nobag: bool):
    """Gradient w.r.t. each looked-up row, ``[N, max_D]`` in the accumulation dtype."""
    acc = _acc(grad_output.dtype)
    g = grad_output.to(acc)
    if nobag:
        g = g.reshape(lay.N, -1)[:, : int(max_D)]
        return g * lay.valid[:, None].to(acc)
    start = lay.b * g.shape[1] + lay.D_begin
    aligned = lay.uniform and g.shape[1] == lay.T * int(max_D)
    rows = _Rows(g.reshape(-1), start, lay.D, int(max_D), lay.valid, aligned)
    return rows.values * _scale(lay, indice_weights, pooling_mode, acc)[:, None]


def grad_indice_weights(grad_output, weights, weights_offsets, D_offsets, max_D: int, indices, offsets,
                        feature_requires_grad=None, pooling_mode: int = SUM) -> torch.Tensor:
    """Gradient w.r.t. per-sample weights: ``<grad_output[b, feature t], row>`` per index (times
    ``1/L`` under MEAN); zero for features with ``feature_requires_grad[t] == 0``."""
    acc = _acc(grad_output.dtype)
    lay = _Layout(weights_offsets, D_offsets, None, indices, offsets)
    if lay.N == 0 or lay.B == 0:
        return torch.zeros(lay.N, dtype=acc, device=indices.device)
    g = _index_grads(grad_output, lay, max_D, pooling_mode, None, nobag=False)
    rows = _Rows(weights, lay.start, lay.D, int(max_D), lay.valid, lay.w_aligned)
    out = (g * rows.values.to(acc)).sum(1)
    if feature_requires_grad is not None and feature_requires_grad.numel() > 0:
        out = out * (feature_requires_grad.to(torch.int64)[lay.t] != 0).to(acc)
    return out


class RowGrads:
    """Gradients summed per distinct row (duplicates across bags and features merged, as the
    "exact" fbgemm optimizers do).  ``[U]``: start (flat row start in weights), t (a feature
    that owns the row), idx (local row id), D; ``[U, max_D]``: grad, mask; ``uniform``: one dim
    for all features; ``w_aligned``: rows are whole rows of ``weights.view(-1, D)``."""

    def __init__(self, start, t, idx, D, grad, mask, uniform, w_aligned):
        self.start, self.t, self.idx, self.D, self.grad, self.mask = start, t, idx, D, grad, mask
        self.uniform, self.w_aligned = uniform, w_aligned

    def weights(self, weights: torch.Tensor) -> _Rows:
        return _Rows(weights, self.start, self.D, self.grad.shape[1], aligned=self.w_aligned)

    def state(self, state: torch.Tensor, state_offsets: torch.Tensor) -> _Rows:
        """An element-wise state laid out like the weights, from its own per-feature offsets."""
        start = state_offsets.to(torch.int64)[self.t] + self.idx * self.D
        return _Rows(state, start, self.D, self.grad.shape[1],
                     aligned=_aligned(self.uniform, state_offsets, self.grad.shape[1]))


def row_grads(grad_output, weights_offsets, D_offsets, D: Optional[int], max_D: int, indices, offsets,
              pooling_mode: int = SUM, indice_weights=None) -> RowGrads:
    """Per-row summed gradients of a pooled (``D_offsets`` given) or sequence (``D``) lookup."""
    nobag = D_offsets is None
    lay = _Layout(weights_offsets, D_offsets, D, indices, offsets)
    max_D = int(D) if nobag else int(max_D)
    g = _index_grads(grad_output, lay, max_D, pooling_mode, indice_weights, nobag)
    keys = lay.start[lay.valid]
    uniq, inv = torch.unique(keys, return_inverse=True)
    U = uniq.numel()
    grad = torch.zeros(U, max_D, dtype=g.dtype, device=g.device).index_add_(0, inv, g[lay.valid])
    t = torch.zeros(U, dtype=torch.int64, device=g.device).scatter_(0, inv, lay.t[lay.valid])
    idx = torch.zeros(U, dtype=torch.int64, device=g.device).scatter_(0, inv, lay.idx[lay.valid])
    Du = lay.D_t[t]
    cols = torch.arange(max_D, device=g.device)
    mask = cols[None, :] < Du[:, None]
    return RowGrads(uniq, t, idx, Du, grad, mask, lay.uniform, lay.w_aligned)


def apply_sgd(weights: torch.Tensor, rg: RowGrads, lr: torch.Tensor) -> None:
    """``w -= lr * g`` on every touched row, in place."""
    w = rg.weights(weights)
    w.store(w.values.to(rg.grad.dtype) - lr.to(rg.grad.dtype) * rg.grad)


def apply_adagrad(weights, momentum1, momentum1_offsets, rg: RowGrads, lr, eps: float) -> None:
    """Exact (element-wise) Adagrad: ``m += g*g; w -= lr * g / (sqrt(m) + eps)``, in place."""
    acc = rg.grad.dtype
    w, m = rg.weights(weights), rg.state(momentum1, momentum1_offsets)
    m_new = m.values.to(acc) + rg.grad * rg.grad
    m.store(m_new)
    w.store(w.values.to(acc) - lr.to(acc) * rg.grad / (torch.sqrt(m_new) + eps))


def apply_rowwise_adagrad(weights, momentum1, momentum1_offsets, rg: RowGrads, lr, eps: float,
                          weight_decay: float = 0.0, weight_decay_mode: int = 0,
                          max_norm: float = 0.0) -> None:
    """Row-wise Adagrad (fbgemm's formula): ``m += mean_d(g'^2)`` with ``g' = g + wd*w`` under
    L2 (mode 1); ``mult = lr / (sqrt(m) + eps)``; ``w = c*w - mult*g`` with ``c = 1 - mult*wd``
    (L2), ``1 - lr*wd`` (decoupled, modes 2 and 5) or 1; then rows with norm above
    ``max_norm > 0`` are scaled down to it.  In place."""
    acc = rg.grad.dtype
    rows = rg.weights(weights)
    w = rows.values.to(acc)
    lr = lr.to(acc)
    g = rg.grad
    g_eff = g + weight_decay * w if int(weight_decay_mode) == 1 else g
    g_avg_sq = (g_eff * g_eff).sum(1) / rg.D.to(acc)
    m_pos = momentum1_offsets.to(torch.int64)[rg.t] + rg.idx
    m = momentum1[m_pos].to(acc) + g_avg_sq
    momentum1.index_put_((m_pos,), m.to(momentum1.dtype))
    mult = lr / (torch.sqrt(m) + eps)
    if int(weight_decay_mode) == 1:
        corr = 1.0 - mult * weight_decay
    elif int(weight_decay_mode) in (2, 5):
        corr = (1.0 - lr * weight_decay).expand_as(mult)
    else:
        corr = torch.ones_like(mult)
    w = corr[:, None] * w - mult[:, None] * g
    if max_norm > 0.0:
        norm = torch.sqrt((w * w * rg.mask.to(acc)).sum(1))
        w = w * torch.where(norm > max_norm, max_norm / norm, torch.ones_like(norm))[:, None]
    rows.store(w)


def apply_adam(weights, momentum1, momentum1_offsets, momentum2, momentum2_offsets, rg: RowGrads, lr,
               eps: float, beta1: float, beta2: float, weight_decay: float, iter: int) -> None:
    """Adam (fbgemm's formula, element-wise states): ``m1 = b1*m1 + (1-b1)*g``,
    ``m2 = b2*m2 + (1-b2)*g^2``, ``w -= lr * (m1/(1-b1^iter) / (sqrt(m2/(1-b2^iter)) + eps)
    + wd*w)`` with ``iter`` the 1-based step.  In place."""
    acc = rg.grad.dtype
    rows = rg.weights(weights)
    w = rows.values.to(acc)
    g = rg.grad
    s1, s2 = rg.state(momentum1, momentum1_offsets), rg.state(momentum2, momentum2_offsets)
    m1 = beta1 * s1.values.to(acc) + (1.0 - beta1) * g
    m2 = beta2 * s2.values.to(acc) + (1.0 - beta2) * g * g
    s1.store(m1)
    s2.store(m2)
    c1 = 1.0 - beta1 ** int(iter)
    c2 = 1.0 - beta2 ** int(iter)
    upd = (m1 / c1) / (torch.sqrt(m2 / c2) + eps) + weight_decay * w
    rows.store(w - lr.to(acc) * upd)


# --------------------------------------------------------------------------- dense (data parallel)


def _dense_forward(dev_weights, weights_offsets, D_offsets, total_D, max_D, indices, offsets,
                   pooling_mode, indice_weights, output_dtype):
    if int(pooling_mode) == NONE:
        return nobag_forward(dev_weights, weights_offsets, int(max_D), indices, offsets, output_dtype)
    return pooled_forward(dev_weights, weights_offsets, D_offsets, total_D, max_D, indices, offsets,
                          pooling_mode, indice_weights, output_dtype)


def dense_lookup_backward(grad_output, dev_weights, weights_offsets, D_offsets, max_D: int, indices, offsets,
                          pooling_mode: int, indice_weights=None, feature_requires_grad=None,
                          ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(grad of dev_weights (flat, like dev_weights), grad of indice_weights or None)."""
    nobag = int(pooling_mode) == NONE
    rg = row_grads(grad_output, weights_offsets, None if nobag else D_offsets, int(max_D), int(max_D),
                   indices, offsets, pooling_mode, indice_weights)
    gw = torch.zeros_like(dev_weights)
    rg.weights(gw).accumulate(rg.grad)
    giw = None
    if indice_weights is not None and indice_weights.numel() > 0 and not nobag:
        giw = grad_indice_weights(grad_output, dev_weights, weights_offsets, D_offsets, max_D, indices,
                                  offsets, feature_requires_grad, pooling_mode).to(indice_weights.dtype)
    return gw, giw


class _DenseLookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, dev_weights, indice_weights, weights_offsets, D_offsets, total_D, max_D, indices,
                offsets, pooling_mode, feature_requires_grad, output_dtype):
        # the weights' own gradient does not read them: save them only for the indice-weight
        # gradient, so an optimizer step between forward and backward (TorchRec's semi-sync
        # pipeline on data-parallel tables) does not invalidate the saved graph
        ctx.need_w = ctx.needs_input_grad[1]
        ctx.save_for_backward(dev_weights if ctx.need_w else None, indice_weights, weights_offsets,
                              D_offsets, indices, offsets, feature_requires_grad)
        ctx.w_meta = (dev_weights.shape, dev_weights.dtype, dev_weights.device)
        ctx.max_D, ctx.pooling_mode = max_D, pooling_mode
        return _dense_forward(dev_weights, weights_offsets, D_offsets, total_D, max_D, indices, offsets,
                              pooling_mode, indice_weights, output_dtype)

    @staticmethod
    def backward(ctx, grad):
        dev_weights, iw, wo, Do, indices, offsets, frg = ctx.saved_tensors
        if dev_weights is None:  # zeros of the right shape (one element, expanded): never read
            shape, dtype, device = ctx.w_meta
            dev_weights = torch.zeros((), dtype=dtype, device=device).expand(shape)
        gw, giw = dense_lookup_backward(grad, dev_weights, wo, Do, ctx.max_D, indices, offsets,
                                        ctx.pooling_mode, iw, frg)
        return (gw, giw if ctx.need_w else None) + (None,) * 9


def dense_lookup(dev_weights, weights_offsets, D_offsets, total_D: int, max_D: int, indices, offsets,
                 pooling_mode: int, indice_weights=None, feature_requires_grad=None,
                 output_dtype: int = 0) -> torch.Tensor:
    """Data-parallel lookup: pooled ``[B, total_D]`` (SUM/MEAN) or, for sequence tables
    (``pooling_mode == NONE``), one row per index ``[N, max_D]``.  Differentiable w.r.t.
    ``dev_weights`` and ``indice_weights`` (it records its own autograd node when called with
    grad enabled, as fbgemm's kernel does, so it also works as a plain dispatcher kernel)."""
    if torch.is_grad_enabled() and (dev_weights.requires_grad or
                                    (indice_weights is not None and indice_weights.requires_grad)):
        return _DenseLookup.apply(dev_weights, indice_weights, weights_offsets, D_offsets, total_D, max_D,
                                  indices, offsets, pooling_mode, feature_requires_grad, output_dtype)
    return _dense_forward(dev_weights, weights_offsets, D_offsets, total_D, max_D, indices, offsets,
                          pooling_mode, indice_weights, output_dtype)
