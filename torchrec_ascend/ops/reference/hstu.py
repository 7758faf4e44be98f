"""Padded dense torch HSTU attention: the oracle the fused kernels are tested against.

Every sequence is padded to the batch's longest length ``L`` and the whole ``[B, H, L, L]`` score
tensor is materialised -- exactly the memory/work the fused kernels avoid.  Vectorised torch only
(scatter, gather, einsum), no Python loop over the batch; differentiable by torch autograd, which
is also how :func:`hstu_mha_backward` gets its gradients.

The semantics (shared by every backend; see docs/hstu.md)::

    s[i, j] = alpha * q_i . k_j + pos_w[max_seq_len - 1 + j - i]
                                + ts_w[bucket(ts[min(i + 1, n - 1)] - ts[j])]
    o_i     = sum_j  valid(i, j) * silu(s[i, j]) / N_b * v_j
    bucket(dt) = clamp(floor(ln(max(|dt|, 1)) / 0.301), 0, len(ts_w) - 1)   (float64)

with ``N_b = max_seq_len`` or ``n_b`` (``norm_by_seq_len``) and ``valid`` the mask of
:func:`valid_mask` (causal incl. self, targets, contextual prefix).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

__all__ = ["hstu_mha", "hstu_mha_backward", "valid_mask", "time_buckets", "TIME_BUCKET_LOG_BASE"]

TIME_BUCKET_LOG_BASE = 0.301  # bucket = floor(ln|dt| / 0.301): about 4 buckets per factor of 3.3


def time_buckets(dt: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """``clamp(floor(ln(max(|dt|, 1)) / 0.301), 0, num_buckets)`` as int64, computed in float64."""
    x = dt.abs().clamp(min=1).to(torch.float64)
    return torch.floor(torch.log(x) / TIME_BUCKET_LOG_BASE).clamp(0, num_buckets).to(torch.int64)


def _ids(pos: torch.Tensor, n: torch.Tensor, nt: torch.Tensor, c: int) -> torch.Tensor:
    """Meta's clamped position ids: contextual prefix -> 0, every target -> the first target's id."""
    return torch.minimum((pos - c + 1).clamp(min=0), n - c + 1 - nt)


def valid_mask(
    lengths: torch.Tensor, L: int, num_targets: Optional[torch.Tensor], contextual_seq_len: int
) -> torch.Tensor:
    """``[B, L, L]`` bool: which (query i, key j) pairs attend, per sequence (False past ``n_b``).

    ``valid(i, j) = i == j  or  id(i) > id(j)  or  (c > 0 and id(i) == 0 and id(j) < n - c + 1 - nt)``
    with ``id(p) = min(max(p - c + 1, 0), n - c + 1 - nt)`` (generative-recommenders' rule): causal
    with self; a target (one of the last ``nt`` tokens) sees the history and itself but no other
    target; every token sees the ``c`` contextual tokens, and those see every non-target token.
    """
    dev = lengths.device
    n = lengths.view(-1, 1, 1)
    nt = (num_targets.view(-1, 1, 1).to(lengths.dtype) if num_targets is not None
          else torch.zeros_like(n))
    pos = torch.arange(L, device=dev, dtype=lengths.dtype)
    row = _ids(pos.view(1, L, 1), n, nt, contextual_seq_len)
    col = _ids(pos.view(1, 1, L), n, nt, contextual_seq_len)
    valid = (pos.view(1, L, 1) == pos.view(1, 1, L)) | (row > col)
    if contextual_seq_len > 0:
        valid = valid | ((row == 0) & (col < n - contextual_seq_len + 1 - nt))
    inside = (pos.view(1, L, 1) < n) & (pos.view(1, 1, L) < n)
    return valid & inside


def _relative_bias(
    lengths: torch.Tensor, L: int, max_seq_len: int, pos_w: Optional[torch.Tensor],
    ts_w: Optional[torch.Tensor], ts_pad: Optional[torch.Tensor],
) -> Optional[torch.Tensor]:
    """``[B, L, L]`` (or ``[1, L, L]``) bias from the tables, or None."""
    bias = None
    pos = torch.arange(L, device=lengths.device)
    if pos_w is not None:
        idx = (max_seq_len - 1 + pos.view(1, L) - pos.view(L, 1)).clamp(0, pos_w.numel() - 1)
        bias = pos_w[idx].unsqueeze(0)
    if ts_w is not None:
        assert ts_pad is not None
        nxt = torch.minimum(pos.view(1, L) + 1, (lengths.view(-1, 1) - 1).clamp(min=0))  # [B, L]
        t_query = torch.gather(ts_pad, 1, nxt)  # ts[min(i + 1, n - 1)]
        bucket = time_buckets(t_query.unsqueeze(2) - ts_pad.unsqueeze(1), ts_w.numel() - 1)
        tb = ts_w[bucket]
        bias = tb if bias is None else bias + tb
    return bias


def hstu_mha(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor, alpha: float,
    max_seq_len: int, norm_by_seq_len: bool, num_targets: Optional[torch.Tensor],
    contextual_seq_len: int, pos_w: Optional[torch.Tensor], ts_w: Optional[torch.Tensor],
    timestamps: Optional[torch.Tensor],
) -> torch.Tensor:
    """Padded dense HSTU attention: q, k ``[T, H, dqk]``, v ``[T, H, dv]`` -> ``[T, H, dv]``."""
    T, H, dqk = q.shape
    dv = v.shape[2]
    B = offsets.numel() - 1
    offsets = offsets.to(torch.int64)
    lengths = offsets[1:] - offsets[:-1]
    L = int(lengths.max()) if B > 0 else 0
    if T == 0 or L == 0:
        return q.new_zeros((T, H, dv)) + 0 * (q.sum() + k.sum() + v.sum())
    seq = torch.repeat_interleave(torch.arange(B, device=q.device), lengths, output_size=T)
    pos = torch.arange(T, device=q.device) - offsets[seq]

    def pad(x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros((B, L) + tuple(x.shape[1:]))
        return out.index_put((seq, pos), x)

    qp, kp, vp = pad(q), pad(k), pad(v)  # [B, L, H, d]
    s = torch.einsum("bihd,bjhd->bhij", qp, kp) * alpha
    ts_pad = pad(timestamps.to(torch.int64)) if (ts_w is not None and timestamps is not None) else None
    bias = _relative_bias(lengths, L, max_seq_len, pos_w, ts_w if ts_pad is not None else None, ts_pad)
    if bias is not None:
        s = s + bias.unsqueeze(1).to(s.dtype)
    norm = (lengths.clamp(min=1).to(s.dtype) if norm_by_seq_len
            else torch.full((B,), float(max_seq_len), dtype=s.dtype, device=s.device))
    mask = valid_mask(lengths, L, num_targets, contextual_seq_len)
    p = F.silu(s) / norm.view(B, 1, 1, 1) * mask.unsqueeze(1).to(s.dtype)
    o = torch.einsum("bhij,bjhd->bihd", p, vp)  # [B, L, H, dv]
    return o[seq, pos]


def hstu_mha_backward(
    grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    offsets: torch.Tensor, alpha: float, max_seq_len: int, norm_by_seq_len: bool,
    num_targets: Optional[torch.Tensor], contextual_seq_len: int, pos_w: Optional[torch.Tensor],
    ts_w: Optional[torch.Tensor], timestamps: Optional[torch.Tensor],
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(dq, dk, dv, d_pos_w, d_ts_w)`` of :func:`hstu_mha` by torch autograd (an absent
    table gets an empty ``[0]`` gradient)."""
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    tables = [t.detach().requires_grad_(True) if t is not None else None for t in (pos_w, ts_w)]
    with torch.enable_grad():
        out = hstu_mha(*leaves, offsets, alpha, max_seq_len, norm_by_seq_len, num_targets,
                       contextual_seq_len, tables[0], tables[1], timestamps)
        inputs = leaves + [t for t in tables if t is not None]
        grads = torch.autograd.grad(out, inputs, grad_out, allow_unused=True)
    grads = [g if g is not None else torch.zeros_like(x) for g, x in zip(grads, inputs)]
    dq, dk, dv = grads[:3]
    rest = iter(grads[3:])
    dpos = next(rest) if pos_w is not None else q.new_zeros((0,))
    dts = next(rest) if ts_w is not None else q.new_zeros((0,))
    return dq, dk, dv, dpos, dts
