"""Sampled-softmax loss over jagged outputs with a shared negative pool (intra-batch logit sharing).

For every valid token t with query ``q_t``, positive ``p_t`` and negatives ``n_j``::

    s_t     = <q_t, p_t> / tau  - log_q(pos_t)        (positive logit, logQ-corrected)
    s_tj    = <q_t, n_j> / tau  - log_q(n_j)          (negative logits, logQ-corrected)
    s_tj    = MASKED  where id(n_j) == pos_t  (or neg_mask[t, j])
    loss_t  = logsumexp(s_t, s_t1, ..., s_tR) - s_t

With a **shared pool** (``negatives.ids`` is ``[R]``, ``neg_emb`` ``[R, D]``, looked up once) all
T x R negative logits are one ``[T, D] x [D, R]`` GEMM: every token sees R negatives at the
cost of R embedding lookups.  **Per-token** negatives (``ids [T, K]``, ``emb [T, K, D]``) can be
used instead of, or in addition to (``extra_negatives``), the shared pool.  Per-token negatives
may also come **indexed** (``neg_index [T, K]`` into ``neg_emb [U, D]``, the U distinct rows,
each looked up once): the loss normalises the U rows once and computes the ``[T, K]`` logits
either as one ``[T, D] x [D, U]`` GEMM followed by a gather (when ``U <= GEMM_GATHER_RATIO x K``:
a small corpus) or by gathering ``[T, K, D]`` rows (a large one); both give the same logits.

Masked logits are set to -1e30 (not -inf: exp underflows to exactly 0.0 in fp32, so the entry
contributes exactly nothing to the loss or to any gradient, without the NaN that an all -inf row
gives in the backward of logsumexp).  A negative equal to the positive is therefore removed, not
down-weighted.  A shared pool's hits are not written at all: the row-wise logsumexp
(:func:`~torchrec_ascend.modules.logsumexp.logsumexp_rows`) leaves them out of their rows, the
same sums and gradients without a ``[T, R]`` write.

``half_precision="fp16"|"bf16"`` computes the shared-pool logit GEMM from half-precision rows
(see :mod:`torchrec_ascend.sampling.quant`): only the valid rows are quantised (padding is
dropped first), with a per-row scale where fp16's range demands it, fp32 accumulation, and the
softmax / loss in fp32.
"""

from __future__ import annotations

from typing import List, Optional, Union

import torch

from ..modules.l2norm import l2_normalize, l2_normalized_dot
from ..modules.logsumexp import RowExclusions, logsumexp_rows
from ..ops.validation import FLOAT_DTYPES, INDEX_DTYPES, check_same_device, check_tensor
from .quant import COMPUTE_MODES, half_logits, resolve_half_dtype
from .samplers import NegativeSample

__all__ = ["MASKED_LOGIT", "GEMM_GATHER_RATIO", "SampledSoftmaxLoss", "sampled_softmax_loss"]

MASKED_LOGIT = -1e30
# indexed per-token negatives: GEMM + gather while U <= this x K.  On an AVX2-only 2-core AMD EPYC
# (1 thread, T = 20,000, D = 50, K = 128) forward + backward took 1.2 s by GEMM + gather with
# U = 3,600 and 2.2 s by a [T, K, D] gather: the GEMM path costs ~1/50 of the gather path per
# column, so 32 leaves margin on either side.
GEMM_GATHER_RATIO = 32
_REDUCTIONS = ("mean", "sum", "none")


def _check_sample(name: str, s: NegativeSample, emb: torch.Tensor, t: int, d: int,
                  index: Optional[torch.Tensor] = None, values: bool = False) -> None:
    """Shapes and dtypes of a sample and its embeddings; ``values``: also the range of
    ``index`` (reads it: a device sync on npu/cuda)."""
    if not isinstance(s, NegativeSample):
        raise ValueError(f"{name}: expected a NegativeSample, got {type(s).__name__}")
    check_tensor(f"{name}.ids", s.ids, dtypes=INDEX_DTYPES)
    emb_name = "neg_emb" if name == "negatives" else "extra_neg_emb"
    check_tensor(emb_name, emb, dtypes=FLOAT_DTYPES)
    if index is not None:
        check_tensor("neg_index", index, dim=2, dtypes=INDEX_DTYPES)
        if s.ids.dim() != 2 or tuple(index.shape) != tuple(s.ids.shape) or s.ids.shape[0] != t:
            raise ValueError(f"neg_index: needs per-token negatives ({name}.ids [T={t}, K]) of "
                             f"its shape, got neg_index {tuple(index.shape)} and ids "
                             f"{tuple(s.ids.shape)}")
        if emb.dim() != 2 or emb.shape[1] != d:
            raise ValueError(f"{emb_name}: with neg_index expected shape [U, D={d}] (the "
                             f"distinct rows), got {tuple(emb.shape)}")
        if values and index.numel() and (int(index.min()) < 0 or int(index.max()) >= emb.shape[0]):
            raise ValueError(f"neg_index: values must be in [0, U={emb.shape[0]}), got "
                             f"[{int(index.min())}, {int(index.max())}]")
    elif s.ids.dim() == 1:
        if emb.dim() != 2 or emb.shape[0] != s.ids.shape[0] or emb.shape[1] != d:
            raise ValueError(f"{emb_name}: expected shape [R={s.ids.shape[0]}, D={d}] for a shared "
                             f"pool, got {tuple(emb.shape)}")
    elif s.ids.dim() == 2:
        if s.ids.shape[0] != t:
            raise ValueError(f"{name}.ids: per-token negatives need {t} rows (one per token), "
                             f"got shape {tuple(s.ids.shape)}")
        if tuple(emb.shape) != (t, s.ids.shape[1], d):
            raise ValueError(f"{emb_name}: expected shape [T={t}, K={s.ids.shape[1]}, D={d}], "
                             f"got {tuple(emb.shape)}")
    else:
        raise ValueError(f"{name}.ids: expected [R] or [T, K], got shape {tuple(s.ids.shape)}")
    if tuple(s.log_q.shape) != tuple(s.ids.shape):
        raise ValueError(f"{name}.log_q: shape {tuple(s.log_q.shape)} != ids shape {tuple(s.ids.shape)}")
    if tuple(s.pos_log_q.shape) != (t,):
        raise ValueError(f"{name}.pos_log_q: expected shape [T={t}], got {tuple(s.pos_log_q.shape)}")


def _pool_hits(pool_ids: torch.Tensor, pos_ids: torch.Tensor) -> RowExclusions:
    """All ``(t, j)`` with ``pool_ids[j] == pos_ids[t]`` (pool may repeat ids), by row ``t``
    (CSR), O((T + R) log R)."""
    sorted_ids, order = torch.sort(pool_ids)
    lo = torch.searchsorted(sorted_ids, pos_ids)
    hi = torch.searchsorted(sorted_ids, pos_ids, right=True)
    counts = hi - lo
    ends = torch.cumsum(counts, 0)
    starts = torch.repeat_interleave(lo - (ends - counts), counts)
    j_idx = order[starts + torch.arange(int(ends[-1]) if counts.numel() else 0, device=pos_ids.device)]
    return RowExclusions(torch.cat([ends.new_zeros(1), ends]), j_idx)


class SampledSoftmaxLoss(torch.nn.Module):
    """Sampled softmax with logQ correction, accidental-hit masking and a shared negative pool.

    Args:
        temperature: tau > 0, logits are divided by it.
        l2_normalize: L2-normalise query, positive and negative embeddings first (cosine logits).
        logq_correction: subtract ``log_q`` (expected sample count, from the sampler) from the
            negative logits, and ``pos_log_q`` from the positive logit when ``correct_positive``.
        correct_positive: see above (TensorFlow's convention; set False to correct negatives only).
        half_precision: ``None`` (fp32), ``"fp16"`` or ``"bf16"`` for the shared-pool GEMM.
        per_row_scale: ``"auto"``/``True``/``False``: per-row power-of-two scales for fp16 rows.
        half_compute: ``"auto"`` (half GEMM where the device runs it fast, else fp32 GEMM on the
            widened half rows: storage-only), ``"half"`` or ``"fp32"`` to force one.
        reduction: ``"mean"`` (over valid tokens), ``"sum"`` or ``"none"`` (``[T_valid]``).
        validate: check values (``pos_log_q`` finite where used), a device sync on npu/cuda.
    """

    def __init__(self, temperature: float = 0.05, l2_normalize: bool = True,
                 logq_correction: bool = True, correct_positive: bool = True,
                 half_precision: Union[str, torch.dtype, None] = None,
                 per_row_scale: Union[bool, str] = "auto", half_compute: str = "auto",
                 reduction: str = "mean", validate: bool = True) -> None:
        super().__init__()
        if not (isinstance(temperature, (int, float)) and temperature > 0):
            raise ValueError(f"temperature: must be a number > 0, got {temperature!r}")
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction: expected one of {_REDUCTIONS}, got {reduction!r}")
        if per_row_scale not in (True, False, "auto"):
            raise ValueError(f"per_row_scale: expected True, False or 'auto', got {per_row_scale!r}")
        self.temperature = float(temperature)
        self.l2_normalize = l2_normalize
        self.logq_correction = logq_correction
        self.correct_positive = correct_positive
        self.half_dtype = resolve_half_dtype(half_precision)
        self.per_row_scale = per_row_scale
        if half_compute not in COMPUTE_MODES:
            raise ValueError(f"half_compute: expected one of {COMPUTE_MODES}, got {half_compute!r}")
        self.half_compute = half_compute
        self.reduction = reduction
        self.validate = validate

    def extra_repr(self) -> str:
        return (f"temperature={self.temperature}, l2_normalize={self.l2_normalize}, "
                f"logq_correction={self.logq_correction}, half={self.half_dtype}, "
                f"reduction={self.reduction!r}")

    def _norm(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """``x`` in fp32, L2-normalised where the loss normalises, times ``scale``."""
        if self.l2_normalize:
            return l2_normalize(x.float(), scale=scale)
        return x.float() * scale if scale != 1.0 else x.float()

    def _neg_lse(self, q: torch.Tensor, pos_ids: torch.Tensor, s: NegativeSample,
                 emb: torch.Tensor, mask: Optional[torch.Tensor],
                 index: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``[T]``: each query's logsumexp over its corrected, masked negative logits, ``[T, R]``
        (shared) or ``[T, K]`` (per token; ``index``: indexed into the distinct rows ``emb``,
        module docstring).  ``q`` is already divided by the temperature.

        A shared pool's accidental hits (few: found by binary search, not a dense ``[T, R]``
        compare) are left out of the logsumexp by :func:`logsumexp_rows`'s exclusions, and in half
        precision its logQ correction is the kernel's bias too: the logits stay as the half GEMM
        gives them (bf16 on the CPU, no widening pass) and neither takes a ``[T, R]`` pass.
        """
        n = self._norm(emb)
        bias: Optional[torch.Tensor] = None
        excluded: Optional[RowExclusions] = None
        if index is not None:
            if n.shape[0] <= GEMM_GATHER_RATIO * index.shape[1]:
                logits = torch.gather(q @ n.t(), 1, index.to(torch.int64))
            else:
                logits = torch.bmm(n[index], q.unsqueeze(2)).squeeze(2)
            if self.logq_correction:
                logits = logits - s.log_q.to(logits.dtype)
            logits = logits.masked_fill(s.ids == pos_ids[:, None], MASKED_LOGIT)
        elif s.shared:
            correction = -s.log_q.to(q.dtype) if self.logq_correction else None
            if self.half_dtype is not None:
                logits = half_logits(q, n, self.half_dtype, self.per_row_scale,
                                     self.half_compute, half_out=True)
                bias = correction
            elif correction is not None:
                logits = torch.addmm(correction[None, :], q, n.t())  # GEMM + correction, one pass
            else:
                logits = q @ n.t()
            excluded = _pool_hits(s.ids.to(pos_ids.device), pos_ids)
        else:
            logits = torch.einsum("td,tkd->tk", q, n)
            if self.logq_correction:
                logits = logits - s.log_q.to(logits.dtype)
            logits = logits.masked_fill(s.ids == pos_ids[:, None], MASKED_LOGIT)
        if mask is not None:
            logits = logits.masked_fill(mask, MASKED_LOGIT)
        return logsumexp_rows(logits, bias, excluded)

    def forward(self, query: torch.Tensor, pos_ids: torch.Tensor, pos_emb: torch.Tensor,
                negatives: NegativeSample, neg_emb: torch.Tensor,
                extra_negatives: Optional[NegativeSample] = None,
                extra_neg_emb: Optional[torch.Tensor] = None,
                valid_mask: Optional[torch.Tensor] = None,
                neg_mask: Optional[torch.Tensor] = None,
                neg_index: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The loss.

        Args:
            query: ``[T, D]`` model outputs (jagged values, or padded rows with ``valid_mask``).
            pos_ids: ``[T]`` positive item id per token.
            pos_emb: ``[T, D]`` positive item embeddings.
            negatives: shared pool (``ids [R]``) or per-token (``ids [T, K]``) sample.
            neg_emb: ``[R, D]`` or ``[T, K, D]`` embeddings of ``negatives.ids``.
            extra_negatives, extra_neg_emb: optional per-token negatives added to a shared pool.
            valid_mask: optional ``[T]`` bool, False for padding rows: they are dropped before
                anything else (no logits, no quantisation, zero gradient).
            neg_mask: optional ``[T, R]`` (or ``[T, K]``) bool of extra false negatives of the
                main ``negatives`` to mask (e.g. items in the user's history).
            neg_index: optional ``[T, K]`` rows of ``neg_emb`` (then ``[U, D]``, the distinct
                rows) holding the embeddings of per-token ``negatives.ids``:
                ``neg_emb[neg_index]`` replaces the ``[T, K, D]`` argument (module docstring).
        """
        check_tensor("query", query, dim=2, dtypes=FLOAT_DTYPES)
        t, d = query.shape
        check_tensor("pos_ids", pos_ids, dim=1, dtypes=INDEX_DTYPES)
        check_tensor("pos_emb", pos_emb, dim=2, dtypes=FLOAT_DTYPES)
        if pos_ids.shape[0] != t or tuple(pos_emb.shape) != (t, d):
            raise ValueError(f"pos_ids/pos_emb: expected [T={t}] and [T={t}, D={d}], got "
                             f"{tuple(pos_ids.shape)} and {tuple(pos_emb.shape)}")
        _check_sample("negatives", negatives, neg_emb, t, d, neg_index, self.validate)
        if (extra_negatives is None) != (extra_neg_emb is None):
            raise ValueError("extra_negatives/extra_neg_emb: give both or neither")
        if extra_negatives is not None:
            _check_sample("extra_negatives", extra_negatives, extra_neg_emb, t, d)
            if extra_negatives.shared:
                raise ValueError("extra_negatives: must be per-token (ids [T, K])")
        if neg_mask is not None:
            check_tensor("neg_mask", neg_mask, dim=2, dtypes=(torch.bool,))
            want = (t, negatives.ids.shape[-1])
            if tuple(neg_mask.shape) != want:
                raise ValueError(f"neg_mask: expected shape {want}, got {tuple(neg_mask.shape)}")
        check_same_device(query=query, pos_ids=pos_ids, pos_emb=pos_emb, neg_emb=neg_emb)

        if valid_mask is not None:
            check_tensor("valid_mask", valid_mask, dim=1, dtypes=(torch.bool,))
            if valid_mask.shape[0] != t:
                raise ValueError(f"valid_mask: expected shape [T={t}], got {tuple(valid_mask.shape)}")
            rows = torch.nonzero(valid_mask).squeeze(1)
            query, pos_ids, pos_emb = query[rows], pos_ids[rows], pos_emb[rows]
            negatives = self._rows(negatives, rows)
            if neg_index is not None:
                neg_index = neg_index[rows]
            elif not negatives.shared:
                neg_emb = neg_emb[rows]
            if extra_negatives is not None:
                extra_negatives, extra_neg_emb = self._rows(extra_negatives, rows), extra_neg_emb[rows]
            if neg_mask is not None:
                neg_mask = neg_mask[rows]

        pos_ids = pos_ids.to(torch.int64)
        q = self._norm(query, 1.0 / self.temperature)
        # q . l2(pos_emb) in one kernel pass each way (no normalised rows, no product tensor)
        pos = (l2_normalized_dot(q, pos_emb.float()) if self.l2_normalize
               else torch.linalg.vecdot(q, self._norm(pos_emb)))
        if self.logq_correction and self.correct_positive:
            if self.validate and pos.numel() and not bool(torch.isfinite(negatives.pos_log_q).all()):
                raise ValueError("negatives.pos_log_q: not finite; a positive the sampler can never "
                                 "draw (q = 0) cannot be logQ-corrected (use smoothing, or "
                                 "correct_positive=False)")
            pos = pos - negatives.pos_log_q.to(pos.dtype)

        parts: List[torch.Tensor] = [pos]
        parts.append(self._neg_lse(q, pos_ids, negatives, neg_emb, neg_mask, neg_index))
        if extra_negatives is not None:
            parts.append(self._neg_lse(q, pos_ids, extra_negatives, extra_neg_emb, None))
        lse = torch.logsumexp(torch.stack(parts, dim=1), dim=1)
        loss = lse - pos
        if self.reduction == "mean":
            return loss.mean() if loss.numel() else loss.sum()
        if self.reduction == "sum":
            return loss.sum()
        return loss

    @staticmethod
    def _rows(s: NegativeSample, rows: torch.Tensor) -> NegativeSample:
        """Keep the valid tokens' rows of a sample (a shared pool's ids are per batch: kept)."""
        if s.shared:
            return NegativeSample(s.ids, s.log_q, s.pos_log_q[rows])
        return NegativeSample(s.ids[rows], s.log_q[rows], s.pos_log_q[rows])


def sampled_softmax_loss(query: torch.Tensor, pos_ids: torch.Tensor, pos_emb: torch.Tensor,
                         negatives: NegativeSample, neg_emb: torch.Tensor,
                         **kwargs: object) -> torch.Tensor:
    """Functional form: ``SampledSoftmaxLoss(**options)(query, ..., **forward_kwargs)``.

    Keyword arguments that are :class:`SampledSoftmaxLoss` options configure it; the rest
    (``extra_negatives``, ``extra_neg_emb``, ``valid_mask``, ``neg_mask``, ``neg_index``) go to
    forward.
    """
    fwd_keys = ("extra_negatives", "extra_neg_emb", "valid_mask", "neg_mask", "neg_index")
    fwd = {k: kwargs.pop(k) for k in fwd_keys if k in kwargs}
    return SampledSoftmaxLoss(**kwargs)(query, pos_ids, pos_emb, negatives, neg_emb, **fwd)
