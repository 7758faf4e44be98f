"""Benchmark cases for the training-path sparse ops (ops/sparse.py), ours vs fbgemm's CPU kernel.

A keyed batch like TorchRec's: T=4 features x B=256 samples, heavy-tailed lengths up to 512 (mean
about 128), int64 ids over 8M rows, fp32 per-id weights; pooled embeddings [B, 8 x 256] fp32.
``quick`` uses the same shapes (these ops are cheap); benchmarks/ops.py repeats fewer times.
"""

from __future__ import annotations

from typing import List

import torch

from benchmarks.common import heavy_tailed_lengths
from benchmarks.op_cases import Case, case, offsets_of


def cases(quick: bool) -> List[Case]:
    """One case per training-path op (two for block_bucketize: sequence and pos+weights)."""
    del quick  # same shapes either way
    g = torch.Generator().manual_seed(0)
    b, t, max_len, d, tables, ranks, rows = 256, 4, 512, 256, 8, 8, 8_000_000
    lengths = torch.cat([heavy_tailed_lengths(b, max_len, generator=g) for _ in range(t)])
    n = int(lengths.sum())
    offsets = offsets_of(lengths)
    ids = torch.randint(0, rows, (n,), generator=g)
    weights = torch.rand(n, generator=g)
    values_f = torch.randn(n, generator=g)
    tag = f"T={t} B={b} L<={max_len} N={n}"
    out: List[Case] = []

    def add(op: str, shapes: str, *args, fb_args=None):
        out.append(case(op, shapes, args, fb_args, training_path=True))

    add("asynchronous_complete_cumsum", f"lengths [{t * b}] int64", lengths)
    add("asynchronous_exclusive_cumsum", f"lengths [{t * b}] int64", lengths)
    add("asynchronous_inclusive_cumsum", f"lengths [{t * b}] int64", lengths)
    perm_t = torch.randperm(t, generator=g).to(torch.int32)
    add("permute_2D_sparse_data", tag + " int64 ids + fp32 weights", perm_t, lengths.view(t, b),
        ids, weights, None)
    perm_tb = torch.randperm(t * b, generator=g).to(torch.int32)
    add("permute_1D_sparse_data", tag + " int64 ids + fp32 weights", perm_tb, lengths, ids,
        weights, None)

    block_sizes = torch.full((t,), (rows + ranks - 1) // ranks, dtype=torch.int64)
    add("block_bucketize_sparse_features", tag + f" {ranks} ranks, sequence", lengths, ids, False,
        True, block_sizes, ranks, None)
    add("block_bucketize_sparse_features", tag + f" {ranks} ranks, pos + weights", lengths, ids,
        True, False, block_sizes, ranks, weights)

    add("invert_permute", f"N={n} int64", torch.randperm(n, generator=g))
    seg_perm = torch.randperm(t * b, generator=g)
    out_off = offsets_of(lengths[seg_perm])
    add("expand_into_jagged_permute", tag + " segment permute", seg_perm, offsets, out_off, n)

    rows_per_table = torch.full((t,), rows, dtype=torch.int64)
    # WARNING mode, all ids valid: nothing is repaired, so every call does the same work
    add("bounds_check_indices", tag + " WARNING, all valid", rows_per_table, ids, offsets, 1,
        torch.zeros(1, dtype=torch.int64), None, fb_args=(rows_per_table, ids.clone(),
                                                          offsets.clone(), 1,
                                                          torch.zeros(1, dtype=torch.int64), None))
    add("segment_sum_csr", tag + " fp32, batch_size 1", 1, offsets, values_f)
    sel = torch.randperm(b, generator=g)[: b // 2]
    add("keyed_jagged_index_select_dim1", tag + f" select {b // 2} samples, fp32", values_f,
        lengths, offsets, sel, b, None, None)
    add("offsets_range", tag, offsets[:-1].contiguous(), n)

    dims = torch.full((tables,), d, dtype=torch.int64)
    od = offsets_of(dims)
    pp = torch.randperm(tables, generator=g)
    iod = offsets_of(dims[pp])
    pooled = torch.randn(b, tables * d, generator=g)
    for op in ("permute_pooled_embs", "permute_pooled_embs_auto_grad",
               "permute_pooled_embs_auto_grad_split"):
        add(op, f"[{b}, {tables} x {d}] fp32", pooled, od, pp, iod, torch.argsort(pp))
    return out
