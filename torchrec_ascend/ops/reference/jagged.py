"""Torch-composite jagged ops: conversions and elementwise ops with any number of jagged
dimensions, softmax, batched GEMMs and selections (one jagged dimension, as in fbgemm).

A jagged tensor with ``J`` jagged dimensions is ``values [T, *inner]`` plus ``offsets``, a list
of ``J`` int tensors: ``offsets[0]`` has ``B + 1`` entries, ``offsets[d]`` has
``offsets[d - 1][-1] + 1``.  Its dense form is ``[B, N_0, ..., N_{J-1}, *inner]``: slot
``(b, j_0, ..., j_{J-1})`` holds the values row reached by walking the offsets
(``p = b``; ``p = offsets[d][p] + j_d`` while ``j_d < offsets[d][p + 1] - offsets[d][p]``), or
padding where the walk leaves the jagged tensor (longer sequences are truncated to ``N_d``).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch


def single_offsets(offsets: List[torch.Tensor], arg: str = "offsets") -> torch.Tensor:
    """The offsets tensor of an op that takes exactly one jagged dimension."""
    if len(offsets) != 1:
        raise ValueError(f"{arg}: expected exactly one jagged dimension, got {len(offsets)}")
    return offsets[0]


def dense_slots(offsets: Sequence[torch.Tensor], max_lengths: Sequence[int]
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(flat index of every valid slot of the dense ``[B, N_0, ..., N_{J-1}]``, values row it
    holds), both int64 and in increasing slot order.  One gather per jagged dimension."""
    first = offsets[0]
    b = first.numel() - 1
    slot = torch.arange(b, device=first.device)  # flat dense index of each live entry
    row = slot  # index of each live entry into the offsets of the current level
    for off, n in zip(offsets, max_lengths):
        off = off.to(torch.int64)
        n = int(n)
        start = off.index_select(0, row)
        length = off.index_select(0, row + 1) - start
        j = torch.arange(n, device=off.device)
        keep = j.unsqueeze(0) < length.unsqueeze(1)
        slot = (slot.unsqueeze(1) * n + j.unsqueeze(0))[keep]
        row = (start.unsqueeze(1) + j.unsqueeze(0))[keep]
    return slot, row


def padded_index(offsets: torch.Tensor, max_len: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """One jagged dimension: (mask [B, max_len] of valid slots, values row of each valid slot,
    row-major).  Sequences longer than ``max_len`` keep their first ``max_len`` items."""
    offsets = offsets.to(torch.int64)  # index_select / index_copy_ want int64 indices
    lengths = offsets[1:] - offsets[:-1]
    pos = torch.arange(max_len, device=offsets.device, dtype=offsets.dtype)
    mask = pos.unsqueeze(0) < lengths.unsqueeze(1)
    src = (offsets[:-1].unsqueeze(1) + pos.unsqueeze(0))[mask]
    return mask, src


def _num_slots(b: int, max_lengths: Sequence[int]) -> int:
    n = b
    for m in max_lengths:
        n *= int(m)
    return n


def jagged_to_padded_dense_forward(
    values: torch.Tensor,
    offsets: List[torch.Tensor],
    max_lengths: List[int],
    padding_value: float = 0.0,
) -> torch.Tensor:
    """values [T, *inner] + J offsets -> dense [B, N_0, ..., N_{J-1}, *inner]."""
    b = offsets[0].numel() - 1
    dims = [int(m) for m in max_lengths]
    inner = tuple(values.shape[1:])
    out = values.new_full((_num_slots(b, dims),) + inner, padding_value)
    slot, row = dense_slots(offsets, dims)
    out.index_copy_(0, slot, values.index_select(0, row))
    return out.reshape((b, *dims) + inner)


def dense_to_jagged_forward(
    dense: torch.Tensor, offsets: List[torch.Tensor], total_L: Optional[int] = None
) -> torch.Tensor:
    """dense [B, N_0, ..., N_{J-1}, *inner] + J offsets -> values [total_L, *inner]; rows the
    dense form does not hold (truncated) are zero, rows at or past ``total_L`` are dropped."""
    j = len(offsets)
    total = int(offsets[-1][-1]) if total_L is None else int(total_L)
    dims = list(dense.shape[1:1 + j])
    inner = tuple(dense.shape[1 + j:])
    out = dense.new_zeros((total,) + inner)
    slot, row = dense_slots(offsets, dims)
    if total < int(offsets[-1][-1]):
        keep = row < total
        slot, row = slot[keep], row[keep]
    flat = dense.reshape((_num_slots(dense.shape[0], dims),) + inner)
    out.index_copy_(0, row, flat.index_select(0, slot))
    return out


def jagged_to_padded_dense_backward(
    grad_output: torch.Tensor, offsets: List[torch.Tensor], total_L: int
) -> torch.Tensor:
    """Gradient of :func:`jagged_to_padded_dense_forward` w.r.t. values."""
    return dense_to_jagged_forward(grad_output, offsets, total_L)


# --------------------------------------------------------------------------- row bookkeeping


def lengths_of(offsets: torch.Tensor) -> torch.Tensor:
    """Sequence lengths from offsets ``[B + 1]``."""
    return offsets[1:] - offsets[:-1]


def complete_cumsum(lengths: torch.Tensor) -> torch.Tensor:
    """Offsets ``[B + 1]`` (starting at 0) from lengths ``[B]``, same dtype."""
    out = lengths.new_zeros(lengths.numel() + 1)
    torch.cumsum(lengths, 0, out=out[1:])
    return out


def jagged_rows(offsets: torch.Tensor, total: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(sequence id, position inside its sequence) of each of the ``total`` rows (int64).

    ``total`` must equal ``offsets[-1]`` (no device sync: it is the output size)."""
    off = offsets.to(torch.int64)
    b = off.numel() - 1
    seq = torch.repeat_interleave(
        torch.arange(b, device=off.device), lengths_of(off), output_size=total
    )
    pos = torch.arange(total, device=off.device) - off[:-1].index_select(0, seq)
    return seq, pos


def _to_jagged(dense: torch.Tensor, offsets: torch.Tensor, total: int) -> torch.Tensor:
    """One jagged dimension: rows of ``dense [B, N, *inner]`` at the jagged positions."""
    return dense_to_jagged_forward(dense, [offsets], total)


def dense_dims(dense: torch.Tensor, offsets: Sequence[torch.Tensor]) -> List[int]:
    """``[N_0, ..., N_{J-1}]`` of a dense partner ``[B, N_0, ..., N_{J-1}, *inner]``."""
    return list(dense.shape[1:1 + len(offsets)])


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    """Half precision computes in fp32 (accumulations), like fbgemm's CPU kernels."""
    return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype


# --------------------------------------------------------------------------- elementwise


def jagged_dense_elementwise_add(
    x_values: torch.Tensor, x_offsets: List[torch.Tensor], y: torch.Tensor
) -> torch.Tensor:
    """Dense ``y [B, N_0.., *inner]`` plus the jagged x padded with zeros (x truncated)."""
    return y + jagged_to_padded_dense_forward(x_values, x_offsets, dense_dims(y, x_offsets), 0.0)


def jagged_dense_elementwise_add_jagged_output(
    x_values: torch.Tensor, x_offsets: List[torch.Tensor], y: torch.Tensor
) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """Jagged ``x + y`` at x's positions (y counts as 0 past its N_d); offsets returned (copied)."""
    out = x_values + dense_to_jagged_forward(y, x_offsets, x_values.shape[0])
    return out, [o.clone() for o in x_offsets]


def jagged_dense_elementwise_mul_forward(
    x_values: torch.Tensor, x_offsets: List[torch.Tensor], y: torch.Tensor
) -> torch.Tensor:
    """Jagged ``x * y`` at x's positions (0 past y's N_d)."""
    return x_values * dense_to_jagged_forward(y, x_offsets, x_values.shape[0])


def jagged_dense_elementwise_mul_backward(
    grad_output: torch.Tensor, x_offsets: List[torch.Tensor], y: torch.Tensor,
    x_values: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(grad x_values, grad y) of :func:`jagged_dense_elementwise_mul_forward`."""
    grad_x = grad_output * dense_to_jagged_forward(y, x_offsets, x_values.shape[0])
    grad_y = jagged_to_padded_dense_forward(grad_output * x_values, x_offsets,
                                            dense_dims(y, x_offsets), 0.0)
    return grad_x, grad_y


def jagged_dense_dense_elementwise_add_jagged_output_forward(
    x_values: torch.Tensor, x_offsets: List[torch.Tensor], y_0: torch.Tensor, y_1: torch.Tensor
) -> torch.Tensor:
    """Jagged ``x + y_0 + y_1`` at x's positions (the dense terms count as 0 past their N_d)."""
    t = x_values.shape[0]
    return (x_values + dense_to_jagged_forward(y_0, x_offsets, t)
            + dense_to_jagged_forward(y_1, x_offsets, t))


# --------------------------------------------------------------------------- softmax


def jagged_softmax_forward(values: torch.Tensor, x_offsets: torch.Tensor, max_L: int) -> torch.Tensor:
    """Softmax over each sequence's first ``max_L`` rows, per column; rows past ``max_L`` are 0."""
    t, d = values.shape
    b = x_offsets.numel() - 1
    seq, pos = jagged_rows(x_offsets, t)
    keep = (pos < max_L).unsqueeze(1)
    x = values.to(_compute_dtype(values))
    neg_inf = torch.tensor(float("-inf"), dtype=x.dtype, device=x.device)
    xm = torch.where(keep, x, neg_inf)
    idx = seq.unsqueeze(1).expand(t, d)
    m = x.new_full((b, d), float("-inf")).scatter_reduce_(0, idx, xm, "amax")
    e = torch.where(keep, torch.exp(x - m.index_select(0, seq)), torch.zeros((), dtype=x.dtype))
    s = x.new_zeros((b, d)).index_add_(0, seq, e)
    out = torch.where(keep, e / s.index_select(0, seq), torch.zeros((), dtype=x.dtype))
    return out.to(values.dtype)


def jagged_softmax_backward(
    grad_output: torch.Tensor, output: torch.Tensor, x_offsets: torch.Tensor, max_L: int
) -> torch.Tensor:
    """Gradient of :func:`jagged_softmax_forward` w.r.t. values (0 past ``max_L``)."""
    t, d = output.shape
    b = x_offsets.numel() - 1
    seq, pos = jagged_rows(x_offsets, t)
    keep = (pos < max_L).unsqueeze(1)
    ct = _compute_dtype(output)
    y = torch.where(keep, output.to(ct), torch.zeros((), dtype=ct))
    g = grad_output.to(ct)
    s = y.new_zeros((b, d)).index_add_(0, seq, g * y)
    return (y * (g - s.index_select(0, seq))).to(grad_output.dtype)


# --------------------------------------------------------------------------- batched GEMMs


def jagged_jagged_bmm_forward(
    x_values: torch.Tensor, y_values: torch.Tensor, x_offsets: torch.Tensor, max_L: int
) -> torch.Tensor:
    """``out[b] = x_b^T @ y_b`` over each sequence's first ``max_L`` rows: ``[B, M, N]``."""
    x = jagged_to_padded_dense_forward(x_values, [x_offsets], [max_L], 0.0)
    y = jagged_to_padded_dense_forward(y_values, [x_offsets], [max_L], 0.0)
    return torch.bmm(x.transpose(1, 2), y)


def jagged_dense_bmm_forward(
    x_values: torch.Tensor, x_offsets: torch.Tensor, y: torch.Tensor, max_L: int
) -> torch.Tensor:
    """``out_b = x_b @ y[b]`` (jagged ``[T, N]``); rows past ``max_L`` are 0."""
    x = jagged_to_padded_dense_forward(x_values, [x_offsets], [max_L], 0.0)
    return _to_jagged(torch.bmm(x, y), x_offsets, x_values.shape[0])


def heads(bh: int, b: int) -> int:
    """Heads ``H`` of ``v [B*H, N]``; an empty batch counts as one head (fbgemm's convention, so
    the output of an empty batch is ``[0, H*D]``)."""
    return bh // b if b else 1


def _per_head(a_values: torch.Tensor, a_offsets: torch.Tensor, bh: int, n: int) -> torch.Tensor:
    """a_values [T, H*D] padded to N and laid out per (batch, head): [B*H, N, D]."""
    b = a_offsets.numel() - 1
    h = heads(bh, b)
    d = a_values.shape[1] // h
    a = jagged_to_padded_dense_forward(a_values, [a_offsets], [n], 0.0)
    return a.reshape(b, n, h, d).transpose(1, 2).reshape(bh, n, d)


def batched_dense_vec_jagged_2d_mul_forward(
    v: torch.Tensor, a_values: torch.Tensor, a_offsets: torch.Tensor
) -> torch.Tensor:
    """``out[b*H + h] = v[b*H + h, :L_b] @ a_b[:, h*D:(h+1)*D]`` (a truncated to ``N = v.size(1)``):
    ``[B*H, D]``."""
    a = _per_head(a_values, a_offsets, v.shape[0], v.shape[1])
    return torch.bmm(v.unsqueeze(1), a).squeeze(1)


def batched_dense_vec_jagged_2d_mul_backward(
    grad_output: torch.Tensor, v: torch.Tensor, a_values: torch.Tensor, a_offsets: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(grad v, grad a_values) of :func:`batched_dense_vec_jagged_2d_mul_forward`."""
    bh, n = v.shape
    b = a_offsets.numel() - 1
    a = _per_head(a_values, a_offsets, bh, n)
    grad_v = torch.bmm(a, grad_output.unsqueeze(2)).squeeze(2)
    h = heads(bh, b)
    d = a.shape[2]
    dense = (v.unsqueeze(2) * grad_output.unsqueeze(1)).reshape(b, h, n, d).transpose(1, 2)
    grad_a = dense_to_jagged_forward(dense.reshape(b, n, h * d), [a_offsets], a_values.shape[0])
    return grad_v, grad_a


# --------------------------------------------------------------------------- selection


def jagged_index_select_rows(
    lengths: torch.Tensor, indices: torch.Tensor, num_rows: Optional[int] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(source row of each output row, output lengths) of selecting sequences ``indices``."""
    in_off = complete_cumsum(lengths.to(torch.int64))
    idx = indices.to(torch.int64)
    out_len = lengths.index_select(0, idx)
    out_off = complete_cumsum(out_len.to(torch.int64))
    total = int(out_off[-1]) if num_rows is None else int(num_rows)
    seq, pos = jagged_rows(out_off, total)
    src = in_off.index_select(0, idx).index_select(0, seq) + pos
    return src, out_len


def jagged_index_select(
    values: torch.Tensor, lengths: torch.Tensor, indices: torch.Tensor,
    num_dense_output_rows: Optional[int] = None,
) -> List[torch.Tensor]:
    """Sequences ``indices`` of a jagged batch: ``[values, lengths]`` of the selection."""
    src, out_len = jagged_index_select_rows(lengths, indices, num_dense_output_rows)
    return [values.index_select(0, src), out_len]


def jagged_slice_rows(
    x_lengths: torch.Tensor, start: torch.Tensor, slice_length: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(source row of each output row, output lengths) of ``x_b[start_b : start_b + slice_length]``."""
    out_len = torch.clamp(torch.minimum(x_lengths - start, torch.full_like(x_lengths, slice_length)),
                          min=0)
    in_off = complete_cumsum(x_lengths.to(torch.int64))
    out_off = complete_cumsum(out_len.to(torch.int64))
    seq, pos = jagged_rows(out_off, int(out_off[-1]))
    src = (in_off[:-1] + start.to(torch.int64)).index_select(0, seq) + pos
    return src, out_len


def jagged_slice(
    x_values: torch.Tensor, x_lengths: torch.Tensor, start: torch.Tensor, slice_length: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rows ``[start_b, start_b + slice_length)`` of each sequence (clipped at its end):
    ``(values, lengths)``."""
    src, out_len = jagged_slice_rows(x_lengths, start, slice_length)
    return x_values.index_select(0, src), out_len


def scatter_rows_back(grad: torch.Tensor, src: torch.Tensor, total: int) -> torch.Tensor:
    """Adjoint of ``values.index_select(0, src)``: rows of ``grad`` summed into ``[total, ...]``."""
    return grad.new_zeros((total,) + tuple(grad.shape[1:])).index_add_(0, src, grad)


# --------------------------------------------------------------------------- stacked (keyed)


def stacked_offsets(lengths: torch.Tensor) -> List[torch.Tensor]:
    """Per-key offsets ``[B + 1]`` from per-key lengths ``[K, B]``."""
    out = lengths.new_zeros((lengths.shape[0], lengths.shape[1] + 1))
    torch.cumsum(lengths, 1, out=out[:, 1:])
    return [o.clone() for o in out.unbind(0)]


def stacked_jagged_2d_to_dense_forward(
    values: torch.Tensor, lengths: torch.Tensor, offset_per_key: List[int],
    max_lengths_per_key: List[int], padding_value: int = 0,
) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """Key ``k`` owns rows ``offset_per_key[k]:offset_per_key[k+1]`` of ``values [T, D]`` and
    lengths ``lengths[k]``; each is padded to ``[B, max_lengths_per_key[k], D]``.  Returns
    (padded per key, offsets per key)."""
    offsets = stacked_offsets(lengths)
    padded = [
        jagged_to_padded_dense_forward(
            values[offset_per_key[k]:offset_per_key[k + 1]], [offsets[k]],
            [max_lengths_per_key[k]], float(padding_value))
        for k in range(len(offsets))
    ]
    return padded, offsets


def stacked_jagged_2d_to_dense_backward(
    B: int, D: int, total_L: int, grad_padded_values_per_key: List[torch.Tensor],
    offsets_tensor_per_key: List[torch.Tensor], offset_per_key: List[int],
) -> torch.Tensor:
    """Gradient of :func:`stacked_jagged_2d_to_dense_forward` w.r.t. values ``[total_L, D]``."""
    g0 = grad_padded_values_per_key[0]
    out = g0.new_zeros((total_L, D))
    for k, (g, off) in enumerate(zip(grad_padded_values_per_key, offsets_tensor_per_key)):
        lo, hi = offset_per_key[k], offset_per_key[k + 1]
        out[lo:hi] = dense_to_jagged_forward(g, [off], hi - lo)
    return out
