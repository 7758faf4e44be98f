"""Torch-composite sparse-feature ops (cumsums, permutes, bucketize, ...)."""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch


def asynchronous_complete_cumsum(t_in: torch.Tensor) -> torch.Tensor:
    """[0, cumsum(t_in)] along the last dim (1-D or 2-D input)."""
    c = torch.cumsum(t_in, dim=-1).to(t_in.dtype)
    zero = t_in.new_zeros(t_in.shape[:-1] + (1,))
    return torch.cat([zero, c], dim=-1)


def asynchronous_exclusive_cumsum(t_in: torch.Tensor) -> torch.Tensor:
    """``[0, cumsum(t_in)[:-1]]`` over all entries in row-major order, in the input's shape and
    dtype (fbgemm takes any shape)."""
    flat = t_in.reshape(-1)
    out = torch.zeros_like(flat)
    if flat.numel() > 1:
        out[1:] = torch.cumsum(flat[:-1], dim=0).to(t_in.dtype)
    return out.reshape(t_in.shape)


def asynchronous_inclusive_cumsum(t_in: torch.Tensor) -> torch.Tensor:
    """cumsum over all entries in row-major order, in the input's shape and dtype."""
    return torch.cumsum(t_in.reshape(-1), dim=0).to(t_in.dtype).reshape(t_in.shape)


# --------------------------------------------------------------------------- shared helpers


def rows_2d(lengths: torch.Tensor) -> torch.Tensor:
    """``lengths [T, ...]`` as ``[T, prod(...)]`` (explicit width: ``T`` or the width may be 0)."""
    width = 1
    for n in lengths.shape[1:]:
        width *= int(n)
    return lengths.reshape(lengths.shape[0], width)


def expand_ranges(starts: torch.Tensor, lengths: torch.Tensor,
                  total: Optional[int] = None) -> torch.Tensor:
    """``cat([arange(s, s + n) for s, n in zip(starts, lengths)])`` without a Python loop: the
    source position of every element of segments laid back to back (int64)."""
    lengths = lengths.to(torch.int64)
    if total is None:
        total = int(lengths.sum()) if lengths.numel() else 0
    seg = torch.repeat_interleave(
        torch.arange(lengths.numel(), device=lengths.device), lengths, output_size=total
    )
    out_start = asynchronous_exclusive_cumsum(lengths)
    return starts.to(torch.int64)[seg] + (torch.arange(total, device=lengths.device) - out_start[seg])


def _gather_opt(t: Optional[torch.Tensor], idx: torch.Tensor) -> Optional[torch.Tensor]:
    return None if t is None else t.index_select(0, idx)


# --------------------------------------------------------------------------- permutes


def permuted_sources(permute: torch.Tensor, lengths: torch.Tensor, total: Optional[int] = None
                     ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rows ``permute`` of ``lengths [T_in, ...]`` (a feature per row): their lengths
    ``[T, width]``, and the source position of every value they hold, in output order."""
    lengths2 = rows_2d(lengths)
    perm = permute.to(torch.int64)
    permuted = lengths2.index_select(0, perm)
    starts = asynchronous_exclusive_cumsum(lengths2.reshape(-1)).reshape(lengths2.shape)
    return permuted, expand_ranges(starts.index_select(0, perm).reshape(-1), permuted.reshape(-1),
                                   total)


def permute_2D_sparse_data(
    permute: torch.Tensor,
    lengths: torch.Tensor,
    values: torch.Tensor,
    weights: Optional[torch.Tensor] = None,
    permuted_lengths_sum: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Reorder the rows (features) of ``lengths [T_in, B]`` by ``permute [T]`` (a subset, with
    repeats allowed) and move each row's values/weights along, as ``fbgemm`` does."""
    permuted_lengths, src = permuted_sources(permute, lengths, permuted_lengths_sum)
    out_lengths = permuted_lengths.reshape((permute.numel(),) + tuple(lengths.shape[1:]))
    return out_lengths, values.index_select(0, src), _gather_opt(weights, src)


def permute_1D_sparse_data(permute, lengths, values, weights=None, permuted_lengths_sum=None):
    """Reorder the segments of ``lengths`` (any shape, read flat, as fbgemm) by ``permute``
    (values/weights follow); the permuted lengths are 1-D.  Arguments and result as
    :func:`permute_2D_sparse_data`, with one length per segment."""
    out = permute_2D_sparse_data(permute, lengths.reshape(-1, 1), values, weights,
                                 permuted_lengths_sum)
    return (out[0].reshape(-1),) + out[1:]


def invert_permute(permute: torch.Tensor) -> torch.Tensor:
    """``out[permute[i]] = i``."""
    out = torch.empty_like(permute)
    ar = torch.arange(permute.numel(), device=permute.device, dtype=permute.dtype)
    return out.index_put_((permute.to(torch.int64),), ar)


def expand_into_jagged_permute(
    permute: torch.Tensor, input_offset: torch.Tensor, output_offset: torch.Tensor, output_size: int
) -> torch.Tensor:
    """Element-level permute from a segment permute: output segment ``t`` (bounds from
    ``output_offset``) reads input positions ``input_offset[permute[t]] + 0, 1, ...``."""
    lens = output_offset[1:] - output_offset[:-1]
    starts = input_offset.index_select(0, permute.to(torch.int64))
    return expand_ranges(starts, lens, int(output_size)).to(input_offset.dtype)


def offsets_range(offsets: torch.Tensor, range_size: int) -> torch.Tensor:
    """``0, 1, ..`` restarting at every offset: position within its segment, where segment ``i``
    is ``[offsets[i], offsets[i + 1])`` and the last one ends at ``range_size``."""
    range_size = int(range_size)
    ends = torch.cat([offsets[1:], offsets.new_full((1,), range_size)]) if offsets.numel() else offsets
    lens = (ends - offsets).to(torch.int64)
    starts = torch.repeat_interleave(offsets.to(torch.int64), lens, output_size=range_size)
    return (torch.arange(range_size, device=offsets.device) - starts).to(offsets.dtype)


def segment_sum_csr(batch_size: int, csr_seg: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``out[i] = values[csr_seg[i] * batch_size : csr_seg[i + 1] * batch_size].sum()``."""
    n = csr_seg.numel() - 1
    bounds = csr_seg.to(torch.int64) * int(batch_size)
    lens = bounds[1:] - bounds[:-1]
    total = int(bounds[-1] - bounds[0]) if n > 0 else 0
    seg = torch.repeat_interleave(torch.arange(n, device=values.device), lens, output_size=total)
    start = int(bounds[0]) if n > 0 else 0
    out = torch.zeros(n, dtype=values.dtype, device=values.device)
    return out.index_add_(0, seg, values[start:start + total])


def segment_sum_csr_backward(batch_size: int, csr_seg: torch.Tensor, grad: torch.Tensor,
                             num_values: int) -> torch.Tensor:
    """Gradient of :func:`segment_sum_csr` w.r.t. ``values``: each value gets its segment's
    gradient, zero outside every segment (shapes independent of the data: traceable)."""
    bounds = csr_seg.to(torch.int64) * int(batch_size)
    pos = torch.arange(num_values, device=grad.device)
    seg = torch.searchsorted(bounds, pos, right=True) - 1
    inside = (seg >= 0) & (seg < bounds.numel() - 1)
    picked = grad.index_select(0, seg.clamp(0, max(grad.shape[0] - 1, 0))) if grad.shape[0] else \
        grad.new_zeros(num_values)
    return torch.where(inside, picked, grad.new_zeros(()))


def keyed_jagged_index_select_dim1(
    values: torch.Tensor,
    lengths: torch.Tensor,
    offsets: torch.Tensor,
    indices: torch.Tensor,
    batch_size: int,
    weights: Optional[torch.Tensor] = None,
    selected_lengths_sum: Optional[int] = None,
) -> List[torch.Tensor]:
    """Select samples ``indices`` of the batch (dim 1) of every key of a KJT
    (``lengths [K * batch_size]``): returns ``[values, lengths(, weights)]``."""
    src, out_lengths = _kjt_select_positions(lengths, offsets, indices, batch_size,
                                             selected_lengths_sum)
    out = [values.index_select(0, src), out_lengths]
    if weights is not None:
        out.append(weights.index_select(0, src))
    return out


def _kjt_select_positions(lengths, offsets, indices, batch_size, total=None):
    batch_size = int(batch_size)
    k = lengths.numel() // batch_size if batch_size else 0
    idx = indices.to(torch.int64)
    out_lengths = lengths.reshape(k, batch_size).index_select(1, idx).reshape(-1)
    starts = offsets[:-1].reshape(k, batch_size).index_select(1, idx).reshape(-1)
    return expand_ranges(starts, out_lengths, total), out_lengths


def keyed_jagged_index_select_dim1_backward(
    grad: torch.Tensor, lengths: torch.Tensor, offsets: torch.Tensor, indices: torch.Tensor,
    batch_size: int, num_values: int,
) -> torch.Tensor:
    """Gradient w.r.t. ``values``: scatter-add of the selected rows' gradients."""
    src, _ = _kjt_select_positions(lengths, offsets, indices, batch_size, grad.shape[0])
    out = grad.new_zeros((num_values,) + tuple(grad.shape[1:]))
    return out.index_add_(0, src, grad)


def permute_pooled_embs(
    pooled_embs: torch.Tensor,
    offset_dim_list: torch.Tensor,
    permute_list: torch.Tensor,
    inv_offset_dim_list: torch.Tensor,
    inv_permute_list: torch.Tensor,
) -> torch.Tensor:
    """Reorder the per-table column blocks of ``pooled_embs [B, sum D]``: output block ``t`` is
    input block ``permute_list[t]`` (block bounds from ``offset_dim_list``)."""
    if pooled_embs.numel() == 0:
        return pooled_embs.clone()
    perm = permute_list.to(torch.int64)
    dims = offset_dim_list[1:] - offset_dim_list[:-1]
    cols = expand_ranges(offset_dim_list[:-1].index_select(0, perm), dims.index_select(0, perm))
    return pooled_embs.index_select(1, cols)


# --------------------------------------------------------------------------- block bucketize

_U64 = 1 << 64


def _unsigned_divmod(x: torch.Tensor, m: torch.Tensor, bits: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``divmod`` of ``x`` read as an unsigned ``bits``-bit integer (as C++ ``uindex_t`` does in
    fbgemm), by positive ``m``; results wrap to signed int64 like a C++ cast back to index_t."""
    x = x.to(torch.int64)
    m = m.to(torch.int64)
    if bits == 32:
        u = torch.where(x < 0, x + (1 << 32), x)
        return torch.div(u, m, rounding_mode="floor"), torch.remainder(u, m)
    # 64 bits: u = 2**64 + x for x < 0.  2**64 = q * m + r with q, r from 2**62 (fits int64);
    # q may exceed int64 and wraps, which is what the C++ cast back to index_t does anyway.
    r62 = torch.remainder(torch.full_like(m, 1 << 62), m)
    q62 = torch.div(torch.full_like(m, 1 << 62), m, rounding_mode="floor")
    r = torch.remainder(4 * r62, m)
    q = 4 * q62 + torch.div(4 * r62, m, rounding_mode="floor")
    neg_rem = torch.remainder(x + r, m)  # r + x < m, so floor division is exact below
    neg_div = q + torch.div(x + r, m, rounding_mode="floor")
    pos = x >= 0
    return (torch.where(pos, torch.div(x, m, rounding_mode="floor"), neg_div),
            torch.where(pos, torch.remainder(x, m), neg_rem))


def block_bucketize_sparse_features(
    lengths: torch.Tensor,
    indices: torch.Tensor,
    bucketize_pos: bool,
    sequence: bool,
    block_sizes: torch.Tensor,
    my_size: int,
    weights: Optional[torch.Tensor] = None,
    batch_size_per_feature: Optional[torch.Tensor] = None,
    max_B: int = -1,
    block_bucketize_pos: Optional[List[torch.Tensor]] = None,
    keep_orig_idx: bool = False,
    total_num_blocks: Optional[torch.Tensor] = None,
    keep_orig_idx_per_feature: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor],
           Optional[torch.Tensor]]:
    """Split every feature's ids over ``my_size`` buckets (ranks) by blocks, fbgemm's rule:

    * even blocks: bucket ``idx // (blk * local_blocks)`` and new id ``idx % (blk * local_blocks)``
      for ``idx < blk * global_blocks``; larger (or negative, read unsigned) ids go to bucket
      ``(idx % global_blocks) // local_blocks`` with new id ``idx // global_blocks``;
      ``global_blocks = total_num_blocks[t]`` (default ``my_size``), ``local = global / my_size``.
    * uneven blocks (``block_bucketize_pos[t]``, boundaries starting at 0): bucket = the last
      boundary ``<= idx``, new id ``idx - boundary``; ids past the last bucket as above with
      ``my_size`` blocks.

    Outputs are bucket-major: ``new_lengths [my_size * len(lengths)]`` and the ids of bucket ``p``,
    bag ``j`` back to back in input order; ``unbucketize_permute`` (``sequence``) maps each input
    position to its output position, ``new_pos`` (``bucketize_pos``) holds each id's position in
    its input bag.
    """
    dev = lengths.device
    my_size = int(my_size)
    n_len = lengths.numel()
    n = indices.numel()
    t_count = block_sizes.numel()
    bits = 32 if indices.dtype == torch.int32 else 64
    if batch_size_per_feature is not None:
        slot_table = torch.repeat_interleave(
            torch.arange(t_count, device=dev), batch_size_per_feature.to(torch.int64), output_size=n_len
        )
    else:
        b = n_len // t_count if t_count else 0
        slot_table = torch.arange(n_len, device=dev) // max(b, 1)
    lens64 = lengths.to(torch.int64)
    bag = torch.repeat_interleave(torch.arange(n_len, device=dev), lens64, output_size=n)
    table = slot_table[bag]
    x = indices.to(torch.int64)
    neg = x < 0
    blk = block_sizes.to(torch.int64)[table]
    if total_num_blocks is not None:
        gnb = total_num_blocks.to(torch.int64)[table]
        lnb = gnb // my_size
    else:
        gnb = torch.full_like(x, my_size)
        lnb = torch.ones_like(x)
    keep = torch.full_like(x, bool(keep_orig_idx), dtype=torch.bool)
    if keep_orig_idx_per_feature is not None:
        keep = keep_orig_idx_per_feature.to(torch.bool)[table]

    if block_bucketize_pos is not None and len(block_bucketize_pos) > 0:
        sizes = [int(p.numel()) for p in block_bucketize_pos]
        width = max(sizes)
        imax = torch.iinfo(torch.int64).max
        bounds = torch.full((t_count, width), imax, dtype=torch.int64, device=dev)
        for t, p in enumerate(block_bucketize_pos):  # one row per feature, not per sample
            bounds[t, :sizes[t]] = p.to(torch.int64)
        nb = torch.tensor(sizes, dtype=torch.int64, device=dev)[table]
        cmp_x = x
        if bool((blk == 0).any()):
            # blk_size 0: ids are first folded onto the boundaries' range (fbgemm's hashing rule)
            last = bounds.gather(1, (torch.tensor(sizes, device=dev) - 1).clamp_min(0)[:, None])[:, 0][table]
            _, folded = _unsigned_divmod(x, gnb, bits)
            cmp_x = torch.where(blk == 0, folded * last // gnb, x)
        row = bounds.index_select(0, table)
        lb = (row <= cmp_x[:, None]).sum(1) - 1
        lb = torch.where(neg & (blk != 0), nb - 1, lb)  # unsigned compare: negatives are huge
        in_range = lb < my_size
        div_m, mod_m = _unsigned_divmod(x, torch.full_like(x, my_size), bits)
        div_g, _ = _unsigned_divmod(x, gnb, bits)
        p = torch.where(in_range, lb, mod_m)
        base = row.gather(1, lb.clamp(0, width - 1)[:, None])[:, 0]
        new_idx = torch.where(blk == 0, div_g, torch.where(in_range, x - base, div_m))
    else:
        local_size = blk * lnb
        below = (~neg) & (x < blk * gnb)
        div_g, mod_g = _unsigned_divmod(x, gnb, bits)
        safe_local = torch.where(below, local_size, torch.ones_like(local_size))
        p = torch.where(below, x // safe_local, mod_g // lnb.clamp_min(1))
        new_idx = torch.where(below, torch.remainder(x, safe_local), div_g)
    new_idx = torch.where(keep, x, new_idx)

    key = p * n_len + bag
    new_lengths = torch.zeros(my_size * n_len, dtype=lengths.dtype, device=dev)
    new_lengths.index_add_(0, key, torch.ones_like(key, dtype=lengths.dtype))
    order = torch.argsort(key, stable=True)
    new_indices = new_idx.index_select(0, order).to(indices.dtype)
    new_weights = None if weights is None else weights.index_select(0, order)
    new_pos = None
    if bucketize_pos:
        offsets = asynchronous_exclusive_cumsum(lens64)
        in_bag = torch.arange(n, device=dev) - offsets[bag]
        new_pos = in_bag.index_select(0, order).to(indices.dtype)
    unbucketize_permute = None
    if sequence:
        unbucketize_permute = torch.empty(n, dtype=indices.dtype, device=dev)
        unbucketize_permute[order] = torch.arange(n, device=dev, dtype=indices.dtype)
    return new_lengths, new_indices, new_weights, new_pos, unbucketize_permute


# --------------------------------------------------------------------------- bounds check

# fbgemm's BoundsCheckMode
FATAL, WARNING, IGNORE, NONE, V2_IGNORE, V2_WARNING, V2_FATAL = range(7)


def bounds_check_indices(
    rows_per_table: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    bounds_check_mode: int,
    warning: torch.Tensor,
    weights: Optional[torch.Tensor] = None,
    B_offsets: Optional[torch.Tensor] = None,
    max_B: int = -1,
    b_t_map: Optional[torch.Tensor] = None,
    info_B_num_bits: int = -1,
    info_B_mask: int = -1,
    bounds_check_version: int = 1,
    prefetch_pipeline: bool = False,
) -> None:
    """fbgemm's embedding bounds check, mutating in place like fbgemm's CPU kernel.

    Bag ``k`` of table ``t`` is ``indices[offsets[k]:offsets[k + 1]]`` (``B`` bags per table, or
    ``B_offsets`` for variable batch sizes). Modes (V2_* behave as their v1 counterparts):

    * FATAL: raise ``ValueError`` on a bad offset (negative, decreasing, past ``len(indices)``,
      last != ``len(indices)``) or an index outside ``[0, rows_per_table[t])`` (``-1`` = pruned,
      allowed).  Nothing is modified.
    * WARNING: ``warning[0]`` is reset, then counts every fix: the last offset is set to
      ``len(indices)``, bad offsets are clamped (``offsets = cummax(clamp(offsets, 0, N))``), and
      out-of-range indices are set to 0.
    * IGNORE: the same fixes, silently (``warning`` untouched).
    * NONE: nothing.
    """
    mode = {V2_IGNORE: IGNORE, V2_WARNING: WARNING, V2_FATAL: FATAL}.get(int(bounds_check_mode),
                                                                      int(bounds_check_mode))
    if mode == NONE:
        return None
    dev = indices.device
    n = indices.numel()
    t_count = rows_per_table.numel()
    total_b = offsets.numel() - 1
    # fbgemm converts mismatched offsets to the indices' dtype: fixes then land on that copy only
    offs = offsets if offsets.dtype == indices.dtype else offsets.to(indices.dtype)
    o = offs.to(torch.int64)
    if B_offsets is not None:
        b_off = B_offsets.to(torch.int64)
        bag_table = torch.repeat_interleave(torch.arange(t_count, device=dev),
                                            b_off[1:] - b_off[:-1], output_size=total_b)
    else:
        b = total_b // t_count if t_count else 0
        if offsets.numel() != b * t_count + 1:
            raise ValueError(f"offsets: size {offsets.numel()} is not B ({b}) * T ({t_count}) + 1")
        bag_table = torch.arange(total_b, device=dev) // max(b, 1)
    if weights is not None and weights.numel() != 0 and weights.shape[0] != n:
        raise ValueError(f"weights: size {weights.shape[0]} is not equal to indices size {n}")

    if mode == FATAL:
        if total_b >= 0 and int(o[-1]) != n:
            raise ValueError(f"offsets: last offset {int(o[-1])} != number of indices {n}")
        s, e = o[:-1], o[1:]
        bad = (s < 0) | (s > e) | (e > n)
        if bool(bad.any()):
            k = int(torch.nonzero(bad)[0, 0])
            raise ValueError(f"offsets: bag {k} spans [{int(s[k])}, {int(e[k])}) outside "
                             f"0 <= start <= end <= {n}")
        fixed = o
    else:
        last_bad = int(o[-1]) != n
        o_last = o.clone()
        o_last[-1] = n
        fixed = torch.cummax(o_last.clamp(0, n), dim=0).values
        count = int(last_bad)
        # the start each bag sees: bag 0 the raw offset, later bags the fixed end of the previous
        seen = torch.cat([o_last[:1], fixed[1:-1]])
        bad_bags = (seen < 0) | (seen > o_last[1:]) | (o_last[1:] > n)
        count += int(bad_bags.sum())
    lens = fixed[1:] - fixed[:-1]
    start = int(fixed[0]) if total_b >= 0 else 0
    total = int(fixed[-1]) - start if total_b >= 0 else 0
    pos_table = torch.repeat_interleave(bag_table, lens, output_size=total)
    window = indices[start:start + total].to(torch.int64)
    rows = rows_per_table.to(torch.int64)[pos_table]
    oob = (window != -1) & ((window < 0) | (window >= rows))
    if mode == FATAL:
        if bool(oob.any()):
            i = int(torch.nonzero(oob)[0, 0])
            raise ValueError(
                f"indices: indices[{start + i}]={int(window[i])} of table {int(pos_table[i])} is "
                f"outside [0, {int(rows[i])})")
        return None
    if mode == WARNING:
        warning.zero_()
        warning.add_(count + int(oob.sum()))
    if not torch.equal(fixed, o):
        offs.copy_(fixed.to(offs.dtype))
    if bool(oob.any()):
        indices[start:start + total] = indices[start:start + total].masked_fill(oob, 0)
    return None
