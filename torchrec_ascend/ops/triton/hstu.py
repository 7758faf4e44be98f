"""Triton kernels for fused jagged HSTU attention (``torchrec_ascend::hstu_mha`` and its backward).

No padded tensor is ever built: every program works on one tile of one sequence of one head,
reading rows ``offsets[b] + i`` of the jagged ``[T, H, d]`` inputs directly.  The semantics are
those of :mod:`torchrec_ascend.ops.reference.hstu` (the oracle)::

    s[i, j] = alpha * q_i . k_j + pos_w[max_seq_len - 1 + j - i]
                                + ts_w[bucket(ts[min(i + 1, n - 1)] - ts[j])]
    o_i     = sum_j valid(i, j) * silu(s[i, j]) / N * v_j

Kernels (grid ``(B * H, tiles)``; a program whose tile starts past its sequence's end exits):

* ``_q_tile_kernel`` (``BWD=False``, the forward): one program per (sequence, head, query tile);
  loops over key tiles only up to the tile's causal limit (``min(i_max + 1, n)``; the history end
  ``n - num_targets`` for tiles holding contextual rows), target keys only on the diagonal (a
  target sees no other target).
* ``_bwd_dkdv_kernel``: one program per (sequence, head, key tile); loops over the query tiles
  that can see those keys (rows ``>=`` the tile start, plus the contextual rows) and accumulates
  ``dk``, ``dv`` in registers: deterministic, no atomics.
* ``_q_tile_kernel`` (``BWD=True``, dq): the forward's programs and loop (the same code, one
  kernel: score, bias and mask of a key tile are written once), accumulating ``dq`` in registers and scattering ``d(score)`` into the bias-table gradients with
  atomic adds into ``_BIAS_SLOTS`` (64) fp32 copies (program ``p`` uses copy ``p % 64``, spreading
  contention), summed on the host side.

The relative bias is computed in-kernel from the small tables.  The time bucket
``floor(ln(max(|dt|, 1)) / 0.301)`` is estimated with an fp32 log and then corrected against an
exact integer threshold table (``thr[k]`` = smallest ``|dt|`` whose float64 bucket is ``>= k``, made
once per table size with the reference's own :func:`~torchrec_ascend.ops.reference.hstu.time_buckets`),
so buckets equal the reference's bit for bit without float64 arithmetic on the device.

Only ``triton.language`` builtins are used (no ``@jit`` helpers of ``tl.standard`` such as
``tl.zeros`` / ``tl.sigmoid``), so the kernels interpret correctly even when triton itself was
imported before ``TRITON_INTERPRET=1`` was set.

Matmuls accumulate in fp32 (fp64 for fp64 inputs); fp32 inputs use IEEE fp32 products (no TF32).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import triton
import triton.language as tl

from ..reference import hstu as _ref

__all__ = ["hstu_mha_fwd", "hstu_mha_bwd", "time_bucket_thresholds", "default_blocks"]

_INT64_MAX = 2 ** 63 - 1
_BIAS_SLOTS = 64


# --------------------------------------------------------------------------- device helpers


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _ids(p, c, kid):
    """generative-recommenders' clamped position ids: contextual prefix -> 0, targets -> kid."""
    return tl.minimum(tl.maximum(p - c + 1, 0), kid)


@triton.jit
def _bucket(dt, THR, num_buckets):
    """Exact ``clamp(floor(ln(max(|dt|, 1)) / 0.301), 0, num_buckets)``: fp32 estimate, then one
    correction step against the integer thresholds ``THR[0 .. num_buckets + 1]``."""
    x = tl.maximum(tl.abs(dt), 1)
    est = tl.floor(tl.log(x.to(tl.float32)) / 0.301).to(tl.int32)
    est = tl.minimum(tl.maximum(est, 0), num_buckets)
    lo = tl.load(THR + est)
    hi = tl.load(THR + est + 1)
    b = tl.where(x < lo, est - 1, tl.where(x >= hi, est + 1, est))
    return tl.minimum(tl.maximum(b, 0), num_buckets)


@triton.jit
def _scores(
    q, k, offs_m, offs_n, row_ok, col_ok, tq, tk, PW, TW, THR,
    alpha, max_seq_len, num_buckets, ctx, kid,
    HAS_CTX: tl.constexpr, HAS_POS: tl.constexpr, HAS_TS: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr,
):
    """Scores ``alpha * q k^T + bias`` of one [BLOCK_M, BLOCK_N] tile, its validity mask and the
    table indices (position, time bucket) each element read."""
    s = tl.dot(q, tl.trans(k), out_dtype=ACC, input_precision=PRECISION) * alpha
    rel = offs_n[None, :] - offs_m[:, None]
    pidx = tl.minimum(tl.maximum(max_seq_len - 1 + rel, 0), 2 * max_seq_len - 2)
    if HAS_POS:
        s += tl.load(PW + pidx).to(ACC)
    bkt = rel * 0
    if HAS_TS:
        bkt = _bucket(tq[:, None] - tk[None, :], THR, num_buckets)
        s += tl.load(TW + bkt).to(ACC)
    idm = _ids(offs_m, ctx, kid)
    idn = _ids(offs_n, ctx, kid)
    valid = (rel == 0) | (idm[:, None] > idn[None, :])
    if HAS_CTX:
        valid = valid | ((idm[:, None] == 0) & (idn[None, :] < kid))
    valid = valid & row_ok[:, None] & col_ok[None, :]
    return s, valid, pidx, bkt


@triton.jit
def _seq_info(OFF, NT, b, ctx, HAS_NT: tl.constexpr):
    start = tl.load(OFF + b).to(tl.int64)
    n = (tl.load(OFF + b + 1).to(tl.int64) - start).to(tl.int32)
    nt = n * 0
    if HAS_NT:
        nt = tl.load(NT + b).to(tl.int32)
    hist = n - nt  # rows [hist, n) are targets
    kid = n - ctx + 1 - nt
    return start, n, hist, kid


@triton.jit
def _key_ranges(m0, n, hist, ctx, BLOCK_M: tl.constexpr, HAS_CTX: tl.constexpr):
    """Keys a query tile [m0, m0 + BLOCK_M) can see: history keys [0, hi1) and target keys
    [lo2, m1) (only their diagonal is valid)."""
    m1 = tl.minimum(m0 + BLOCK_M, n)
    hi = m1
    if HAS_CTX:
        if m0 < ctx:
            hi = tl.maximum(hi, hist)
    hi1 = tl.minimum(hi, hist)
    lo2 = tl.maximum(hi1, m0)
    return hi1, lo2, m1


@triton.jit
def _scales(n, alpha_hi, alpha_lo, max_seq_len, NORM_BY_LEN: tl.constexpr, ACC: tl.constexpr):
    """``alpha`` (re-joined from its two fp32 halves) and ``1 / N`` in the accumulator dtype."""
    alpha = (n * 0).to(ACC) + alpha_hi + alpha_lo
    inv_norm = 1.0 / (n * 0 + max_seq_len).to(ACC)
    if NORM_BY_LEN:
        inv_norm = 1.0 / n.to(ACC)
    return alpha, inv_norm


@triton.jit
def _load_rows(PTR, base, offs, ok, stride_t, offs_d, d, other):
    ptrs = PTR + (base + offs)[:, None] * stride_t + offs_d[None, :]
    return tl.load(ptrs, mask=ok[:, None] & (offs_d[None, :] < d), other=other)


# --------------------------------------------------------------------------- forward


@triton.jit
def _q_block(
    acc, q, do, tq, offs_m, row_ok, n0, bound, start, h, inv_norm, slot,
    K, V, TS, PW, TW, THR, DPOS, DTS, stride_kt, stride_kh, stride_vt, stride_vh, DQ, DV,
    alpha, max_seq_len, num_buckets, ctx, kid,
    HAS_CTX: tl.constexpr, HAS_POS: tl.constexpr, HAS_TS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_DQ: tl.constexpr, BLOCK_DV: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr, BWD: tl.constexpr,
):
    """The key tile ``[n0, n0 + BLOCK_N)`` (keys ``< bound``) seen by the query tile ``q``.
    Forward: ``acc += silu(s) / N * valid @ v`` (output rows).  Backward (``BWD``):
    ``acc += alpha * dS @ k`` (dq rows) with ``dS = dO v^T * silu'(s) / N * valid``, and ``dS`` is
    scattered into the bias tables' gradient slot ``slot``."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    col_ok = offs_n < bound
    k = _load_rows(K + h * stride_kh, start, offs_n, col_ok, stride_kt, tl.arange(0, BLOCK_DQ), DQ, 0.0)
    v = _load_rows(V + h * stride_vh, start, offs_n, col_ok, stride_vt, tl.arange(0, BLOCK_DV), DV, 0.0)
    tk = tq
    if HAS_TS:
        tk = tl.load(TS + start + offs_n, mask=col_ok, other=0)
    s, valid, pidx, bkt = _scores(q, k, offs_m, offs_n, row_ok, col_ok, tq, tk, PW, TW, THR,
                                  alpha, max_seq_len, num_buckets, ctx, kid,
                                  HAS_CTX, HAS_POS, HAS_TS, ACC, PRECISION)
    sig = _sigmoid(s)
    if BWD:
        dp = tl.dot(do, tl.trans(v), out_dtype=ACC, input_precision=PRECISION)
        ds = tl.where(valid, dp * sig * (1.0 + s * (1.0 - sig)) * inv_norm, 0.0)
        acc += tl.dot(ds.to(k.dtype), k, out_dtype=ACC, input_precision=PRECISION) * alpha
        if HAS_POS:
            tl.atomic_add(DPOS + slot * (2 * max_seq_len - 1) + pidx, ds, mask=valid, sem="relaxed")
        if HAS_TS:
            tl.atomic_add(DTS + slot * (num_buckets + 1) + bkt, ds, mask=valid, sem="relaxed")
    else:
        p = tl.where(valid, s * sig * inv_norm, 0.0)
        acc += tl.dot(p.to(v.dtype), v, out_dtype=ACC, input_precision=PRECISION)
    return acc


@triton.jit
def _q_tile_kernel(
    Q, K, V, DO, OFF, NT, PW, TW, THR, TS, OUT, DPOS, DTS,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_ot, stride_oh,
    H, DQ, DV, alpha_hi, alpha_lo, max_seq_len, ctx, num_buckets, n_slots,
    NORM_BY_LEN: tl.constexpr, HAS_NT: tl.constexpr, HAS_CTX: tl.constexpr,
    HAS_POS: tl.constexpr, HAS_TS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DQ: tl.constexpr, BLOCK_DV: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr, BWD: tl.constexpr,
):
    """The forward (``OUT`` = output rows) and, with ``BWD``, the dq backward (``OUT`` = dq rows,
    table gradients into the ``DPOS`` / ``DTS`` slots; ``DO`` = grad of the output): one program per
    (sequence, head, query tile), looping over the key tiles that tile can see (:func:`_key_ranges`).
    The forward passes ``Q`` for ``DO`` and ``OUT`` for the slots (never read)."""
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    # last query tiles first: they loop over the most key tiles (shorter tail at the end)
    tile = tl.num_programs(1) - 1 - tl.program_id(1)
    m0 = tile * BLOCK_M
    slot = (tile * tl.num_programs(0) + bh) % n_slots
    start, n, hist, kid = _seq_info(OFF, NT, b, ctx, HAS_NT)
    if m0 < n:
        alpha, inv_norm = _scales(n, alpha_hi, alpha_lo, max_seq_len, NORM_BY_LEN, ACC)
        offs_m = m0 + tl.arange(0, BLOCK_M)
        row_ok = offs_m < n
        q = _load_rows(Q + h * stride_qh, start, offs_m, row_ok, stride_qt, tl.arange(0, BLOCK_DQ), DQ, 0.0)
        tq = offs_m.to(tl.int64) * 0
        if HAS_TS:
            tq = tl.load(TS + start + tl.minimum(offs_m + 1, n - 1), mask=row_ok, other=0)
        if BWD:
            do = _load_rows(DO + h * stride_doh, start, offs_m, row_ok, stride_dot, tl.arange(0, BLOCK_DV), DV, 0.0)
            offs_o = tl.arange(0, BLOCK_DQ)
            d_out = DQ
            acc = tl.full([BLOCK_M, BLOCK_DQ], 0.0, ACC)
        else:
            do = q  # unused
            offs_o = tl.arange(0, BLOCK_DV)
            d_out = DV
            acc = tl.full([BLOCK_M, BLOCK_DV], 0.0, ACC)
        hi1, lo2, m1 = _key_ranges(m0, n, hist, ctx, BLOCK_M, HAS_CTX)
        # history keys [0, hi1), then the target keys [lo2, m1) (only their diagonal is valid)
        for n0 in range(0, hi1, BLOCK_N):
            acc = _q_block(acc, q, do, tq, offs_m, row_ok, n0, hi1, start, h, inv_norm, slot,
                           K, V, TS, PW, TW, THR, DPOS, DTS, stride_kt, stride_kh, stride_vt, stride_vh,
                           DQ, DV, alpha, max_seq_len, num_buckets, ctx, kid,
                           HAS_CTX, HAS_POS, HAS_TS, BLOCK_N, BLOCK_DQ, BLOCK_DV, ACC, PRECISION, BWD)
        for n0 in range(lo2, m1, BLOCK_N):
            acc = _q_block(acc, q, do, tq, offs_m, row_ok, n0, m1, start, h, inv_norm, slot,
                           K, V, TS, PW, TW, THR, DPOS, DTS, stride_kt, stride_kh, stride_vt, stride_vh,
                           DQ, DV, alpha, max_seq_len, num_buckets, ctx, kid,
                           HAS_CTX, HAS_POS, HAS_TS, BLOCK_N, BLOCK_DQ, BLOCK_DV, ACC, PRECISION, BWD)
        optrs = OUT + h * stride_oh + (start + offs_m)[:, None] * stride_ot + offs_o[None, :]
        tl.store(optrs, acc.to(OUT.dtype.element_ty), mask=row_ok[:, None] & (offs_o[None, :] < d_out))


# --------------------------------------------------------------------------- backward: dk, dv


@triton.jit
def _dkdv_block(
    dk, dv, k, v, tk, offs_n, col_ok, m0, bound, start, h, inv_norm,
    Q, DO, TS, PW, TW, THR, stride_qt, stride_qh, stride_dot, stride_doh, DQ, DV, n,
    alpha, max_seq_len, num_buckets, ctx, kid,
    HAS_CTX: tl.constexpr, HAS_POS: tl.constexpr, HAS_TS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_DQ: tl.constexpr, BLOCK_DV: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr,
):
    offs_m = m0 + tl.arange(0, BLOCK_M)
    row_ok = offs_m < bound
    q = _load_rows(Q + h * stride_qh, start, offs_m, row_ok, stride_qt, tl.arange(0, BLOCK_DQ), DQ, 0.0)
    do = _load_rows(DO + h * stride_doh, start, offs_m, row_ok, stride_dot, tl.arange(0, BLOCK_DV), DV, 0.0)
    tq = tk
    if HAS_TS:
        tq = tl.load(TS + start + tl.minimum(offs_m + 1, n - 1), mask=row_ok, other=0)
    s, valid, _p, _b = _scores(q, k, offs_m, offs_n, row_ok, col_ok, tq, tk, PW, TW, THR,
                               alpha, max_seq_len, num_buckets, ctx, kid,
                               HAS_CTX, HAS_POS, HAS_TS, ACC, PRECISION)
    sig = _sigmoid(s)
    p = tl.where(valid, s * sig * inv_norm, 0.0)
    dv += tl.dot(tl.trans(p).to(do.dtype), do, out_dtype=ACC, input_precision=PRECISION)
    dp = tl.dot(do, tl.trans(v), out_dtype=ACC, input_precision=PRECISION)
    ds = tl.where(valid, dp * sig * (1.0 + s * (1.0 - sig)) * inv_norm, 0.0)
    dk += tl.dot(tl.trans(ds).to(q.dtype), q, out_dtype=ACC, input_precision=PRECISION) * alpha
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, DO, OFF, NT, PW, TW, THR, TS, DK, DVAL,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_dkt, stride_dkh, stride_dvt, stride_dvh,
    H, DQ, DV, alpha_hi, alpha_lo, max_seq_len, ctx, num_buckets,
    NORM_BY_LEN: tl.constexpr, HAS_NT: tl.constexpr, HAS_CTX: tl.constexpr,
    HAS_POS: tl.constexpr, HAS_TS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DQ: tl.constexpr, BLOCK_DV: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr,
):
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    n0 = tl.program_id(1) * BLOCK_N
    start, n, hist, kid = _seq_info(OFF, NT, b, ctx, HAS_NT)
    if n0 < n:
        alpha, inv_norm = _scales(n, alpha_hi, alpha_lo, max_seq_len, NORM_BY_LEN, ACC)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        col_ok = offs_n < n
        offs_dq = tl.arange(0, BLOCK_DQ)
        offs_dv = tl.arange(0, BLOCK_DV)
        k = _load_rows(K + h * stride_kh, start, offs_n, col_ok, stride_kt, offs_dq, DQ, 0.0)
        v = _load_rows(V + h * stride_vh, start, offs_n, col_ok, stride_vt, offs_dv, DV, 0.0)
        tk = offs_n.to(tl.int64) * 0
        if HAS_TS:
            tk = tl.load(TS + start + offs_n, mask=col_ok, other=0)
        dk = tl.full([BLOCK_N, BLOCK_DQ], 0.0, ACC)
        dv = tl.full([BLOCK_N, BLOCK_DV], 0.0, ACC)
        # queries that can see keys [n0, n0 + BLOCK_N): rows >= n0 (up to the diagonal only when
        # every key here is a target), plus the contextual rows above the tile.
        q_hi = n
        ctx_hi = n * 0
        if n0 >= hist:
            q_hi = tl.minimum(n0 + BLOCK_N, n)
        elif HAS_CTX:
            ctx_hi = tl.minimum(ctx, n0)
        for m0 in range(0, ctx_hi, BLOCK_M):
            dk, dv = _dkdv_block(dk, dv, k, v, tk, offs_n, col_ok, m0, ctx_hi, start, h, inv_norm,
                                 Q, DO, TS, PW, TW, THR, stride_qt, stride_qh, stride_dot, stride_doh,
                                 DQ, DV, n, alpha, max_seq_len, num_buckets, ctx, kid,
                                 HAS_CTX, HAS_POS, HAS_TS, BLOCK_M, BLOCK_DQ, BLOCK_DV, ACC, PRECISION)
        for m0 in range(n0, q_hi, BLOCK_M):
            dk, dv = _dkdv_block(dk, dv, k, v, tk, offs_n, col_ok, m0, q_hi, start, h, inv_norm,
                                 Q, DO, TS, PW, TW, THR, stride_qt, stride_qh, stride_dot, stride_doh,
                                 DQ, DV, n, alpha, max_seq_len, num_buckets, ctx, kid,
                                 HAS_CTX, HAS_POS, HAS_TS, BLOCK_M, BLOCK_DQ, BLOCK_DV, ACC, PRECISION)
        dk_ptrs = DK + h * stride_dkh + (start + offs_n)[:, None] * stride_dkt + offs_dq[None, :]
        tl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=col_ok[:, None] & (offs_dq[None, :] < DQ))
        dv_ptrs = DVAL + h * stride_dvh + (start + offs_n)[:, None] * stride_dvt + offs_dv[None, :]
        tl.store(dv_ptrs, dv.to(DVAL.dtype.element_ty), mask=col_ok[:, None] & (offs_dv[None, :] < DV))


# --------------------------------------------------------------------------- host side


_THRESHOLDS: Dict[Tuple[int, str], torch.Tensor] = {}


def time_bucket_thresholds(num_buckets: int, device: torch.device) -> torch.Tensor:
    """``[num_buckets + 2]`` int64: ``thr[0] = 0``, ``thr[k]`` = the smallest ``x >= 1`` whose
    reference bucket (:func:`~torchrec_ascend.ops.reference.hstu.time_buckets`) is ``>= k``
    (``k = 1 .. num_buckets``), ``thr[num_buckets + 1] = 2**63 - 1``.  Cached per device."""
    key = (int(num_buckets), str(device))
    if key not in _THRESHOLDS:
        ks = torch.arange(1, num_buckets + 1, dtype=torch.int64)
        # vectorised binary search for the smallest x in [1, 2**62] with bucket(x) >= k (the
        # reference's bucket is non-decreasing in x); float64 log cannot tell neighbouring large
        # integers apart, so the exact boundary may sit a few integers away from exp(0.301 k)
        lo = torch.ones_like(ks)
        hi = torch.full_like(ks, 2 ** 62)
        while bool((lo < hi).any()):
            mid = lo + (hi - lo) // 2
            ok = _ref.time_buckets(mid, num_buckets) >= ks
            hi = torch.where(ok, mid, hi)
            lo = torch.where(ok, lo, mid + 1)
        reached = _ref.time_buckets(lo, num_buckets) >= ks
        thr = torch.where(reached, lo, torch.full_like(lo, _INT64_MAX))
        edge = torch.tensor([0]), thr, torch.tensor([_INT64_MAX])
        _THRESHOLDS[key] = torch.cat(edge).to(device)
    return _THRESHOLDS[key]


def default_blocks(dqk: int, dv: int, device: torch.device) -> Tuple[int, int]:
    """(BLOCK_M, BLOCK_N): 64x64 tiles for head dims up to 64, 64x32 above; 32x32 under the
    interpreter (CPU tensors), where tiles of the small test shapes are cheaper."""
    if device.type == "cpu":
        return 32, 32
    if max(dqk, dv) <= 64:
        return 64, 64
    return 64, 32


def _meta(q: torch.Tensor, v: torch.Tensor, block_m: Optional[int], block_n: Optional[int]) -> dict:
    dqk, dv = q.shape[2], v.shape[2]
    bm, bn = default_blocks(dqk, dv, q.device)
    bm, bn = block_m or bm, block_n or bn
    for name, val in (("block_m", bm), ("block_n", bn)):
        if val < 16 or val & (val - 1):
            raise ValueError(f"{name}: must be a power of two >= 16, got {val}")
    return dict(
        BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_DQ=max(16, triton.next_power_of_2(dqk)), BLOCK_DV=max(16, triton.next_power_of_2(dv)),
        ACC=tl.float64 if q.dtype == torch.float64 else tl.float32,
        PRECISION="ieee",
        num_warps=4,
        num_stages=2 if q.element_size() >= 4 else 3,  # fp32 tiles: keep shared memory < 160 KB
    )


def _split(alpha: float) -> Tuple[float, float]:
    """``alpha`` as two fp32 values whose sum is ``alpha`` to ~48 bits (Triton passes Python
    floats as fp32; fp64 inputs get the full-precision scale back in-kernel)."""
    hi = float(torch.tensor(float(alpha), dtype=torch.float32))
    return hi, float(torch.tensor(float(alpha) - hi, dtype=torch.float32))


def _flags(num_targets, contextual_seq_len, pos_w, ts_w, norm_by_seq_len) -> dict:
    return dict(
        NORM_BY_LEN=bool(norm_by_seq_len), HAS_NT=num_targets is not None,
        HAS_CTX=int(contextual_seq_len) > 0, HAS_POS=pos_w is not None, HAS_TS=ts_w is not None,
    )


def _common(q, offsets, num_targets, pos_w, ts_w, timestamps):
    """Placeholders for absent optional tensors (never read: their HAS_* flag is off), the
    threshold table and the bucket count."""
    dummy = offsets
    nb = ts_w.numel() - 1 if ts_w is not None else 0
    thr = time_bucket_thresholds(nb, q.device) if ts_w is not None else dummy
    ts = timestamps.to(torch.int64).contiguous() if ts_w is not None else dummy
    return (num_targets.contiguous() if num_targets is not None else dummy,
            pos_w.contiguous() if pos_w is not None else dummy,
            ts_w.contiguous() if ts_w is not None else dummy,
            thr, ts, nb)


def hstu_mha_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor, alpha: float,
    max_seq_len: int, norm_by_seq_len: bool, num_targets: Optional[torch.Tensor],
    contextual_seq_len: int, pos_w: Optional[torch.Tensor], ts_w: Optional[torch.Tensor],
    timestamps: Optional[torch.Tensor], *, out: Optional[torch.Tensor] = None,
    block_m: Optional[int] = None, block_n: Optional[int] = None,
) -> torch.Tensor:
    """Forward of ``torchrec_ascend::hstu_mha`` (arguments as the op's schema; inputs already
    validated by :func:`torchrec_ascend.ops.hstu.hstu_mha`).  ``out`` (``[T, H, dv]``) is written
    in place when given; ``block_m`` / ``block_n`` override the tile sizes."""
    q, k, v, offsets = q.contiguous(), k.contiguous(), v.contiguous(), offsets.contiguous()
    T, H, dqk = q.shape
    dv = v.shape[2]
    B = offsets.numel() - 1
    if out is None:
        out = torch.empty((T, H, dv), dtype=q.dtype, device=q.device)
    if T == 0 or B == 0 or H == 0:
        return out.zero_()
    meta = _meta(q, v, block_m, block_n)
    nt, pw, tw, thr, ts, nb = _common(q, offsets, num_targets, pos_w, ts_w, timestamps)
    grid = (B * H, triton.cdiv(int(max_seq_len), meta["BLOCK_M"]))
    _q_tile_kernel[grid](
        q, k, v, q, offsets, nt, pw, tw, thr, ts, out, out, out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        H, dqk, dv, *_split(alpha), int(max_seq_len), int(contextual_seq_len), nb, 1,
        **_flags(num_targets, contextual_seq_len, pos_w, ts_w, norm_by_seq_len), **meta, BWD=False,
    )
    return out


def hstu_mha_bwd(
    grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    offsets: torch.Tensor, alpha: float, max_seq_len: int, norm_by_seq_len: bool,
    num_targets: Optional[torch.Tensor], contextual_seq_len: int, pos_w: Optional[torch.Tensor],
    ts_w: Optional[torch.Tensor], timestamps: Optional[torch.Tensor], *,
    outs: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None,
    block_m: Optional[int] = None, block_n: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of ``torchrec_ascend::hstu_mha``: ``(dq, dk, dv, d_pos_w, d_ts_w)`` (an absent table
    gets an empty ``[0]`` gradient).  ``outs`` = ``(dq, dk, dv)`` buffers written in place."""
    do = grad_out.contiguous()
    q, k, v, offsets = q.contiguous(), k.contiguous(), v.contiguous(), offsets.contiguous()
    T, H, dqk = q.shape
    dv = v.shape[2]
    B = offsets.numel() - 1
    if outs is None:
        outs = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    dq, dk, dval = outs
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    n_pos = 2 * int(max_seq_len) - 1
    dpos_slots = (torch.zeros((_BIAS_SLOTS, n_pos), dtype=acc_dtype, device=q.device)
                  if pos_w is not None else None)
    dts_slots = (torch.zeros((_BIAS_SLOTS, ts_w.numel()), dtype=acc_dtype, device=q.device)
                 if ts_w is not None else None)

    def tables():
        dpos = dpos_slots.sum(0).to(pos_w.dtype) if pos_w is not None else q.new_zeros((0,))
        dts = dts_slots.sum(0).to(ts_w.dtype) if ts_w is not None else q.new_zeros((0,))
        return dpos, dts

    if T == 0 or B == 0 or H == 0:
        dq.zero_(), dk.zero_(), dval.zero_()
        return (dq, dk, dval) + tables()
    meta = _meta(q, v, block_m, block_n)
    flags = _flags(num_targets, contextual_seq_len, pos_w, ts_w, norm_by_seq_len)
    nt, pw, tw, thr, ts, nb = _common(q, offsets, num_targets, pos_w, ts_w, timestamps)
    scalars = (H, dqk, dv, *_split(alpha), int(max_seq_len), int(contextual_seq_len), nb)
    strides = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
               do.stride(0), do.stride(1))
    grid_k = (B * H, triton.cdiv(int(max_seq_len), meta["BLOCK_N"]))
    _bwd_dkdv_kernel[grid_k](
        q, k, v, do, offsets, nt, pw, tw, thr, ts, dk, dval, *strides,
        dk.stride(0), dk.stride(1), dval.stride(0), dval.stride(1), *scalars, **flags, **meta,
    )
    grid_q = (B * H, triton.cdiv(int(max_seq_len), meta["BLOCK_M"]))
    _q_tile_kernel[grid_q](
        q, k, v, do, offsets, nt, pw, tw, thr, ts, dq,
        dpos_slots if dpos_slots is not None else dq, dts_slots if dts_slots is not None else dq,
        *strides, dq.stride(0), dq.stride(1), *scalars, _BIAS_SLOTS, **flags, **meta, BWD=True,
    )
    return (dq, dk, dval) + tables()
