"""Benchmark cases for the jagged op family (ops/jagged.py), ours vs fbgemm's CPU kernel.

B=256 sequences, heavy-tailed lengths up to 512 (mean about 128), D=256 fp32 (``quick``: B=64).
Forward ops only; the backward ops TorchRec/HSTU call directly (``*_backward``) are timed too,
and the conversions / elementwise ops again with J=2 and J=3 jagged dimensions.
"""

from __future__ import annotations

from typing import List

import torch

from benchmarks.common import heavy_tailed_lengths
from benchmarks.op_cases import Case, case, offsets_of


def cases(quick: bool) -> List[Case]:
    """One case per jagged op (composite ops and their ``_forward`` kernels alike)."""
    g = torch.Generator().manual_seed(1)
    B, max_L, D = (64 if quick else 256), 512, 256
    lengths = heavy_tailed_lengths(B, max_L, generator=g)
    offsets = offsets_of(lengths)
    N = int(offsets[-1])
    x = torch.randn(N, D, generator=g)
    y = torch.randn(N, D, generator=g)
    dense = torch.randn(B, max_L, D, generator=g)
    dense2 = torch.randn(B, max_L, D, generator=g)
    tag = f"B={B} L<={max_L} N={N} D={D}"
    out: List[Case] = []

    def add(op: str, shapes: str, *args):
        out.append(case(op, shapes, args))

    add("jagged_to_padded_dense_forward", tag, x, [offsets], [max_L], 0.0)
    add("jagged_to_padded_dense", tag, x, [offsets], [max_L], 0.0)
    add("jagged_to_padded_dense_backward", tag, dense, [offsets], N)
    add("dense_to_jagged_forward", tag, dense, [offsets], N)
    add("dense_to_jagged", tag, dense, [offsets], N)
    add("jagged_1d_to_dense", f"B={B} L<={max_L} N={N}", x[:, 0].contiguous(), offsets, max_L, 0)
    add("jagged_2d_to_dense", tag, x, offsets, max_L)
    keys = 2
    kl = torch.cat([lengths, heavy_tailed_lengths(B, max_L, generator=g)])
    kv = torch.randn(int(kl.sum()), D, generator=g)
    per_key = [0, int(lengths.sum()), int(kl.sum())]  # values start of each key (+ end)
    add("stacked_jagged_2d_to_dense", f"{keys} keys x {tag}", kv, kl.view(keys, B), per_key,
        [max_L] * keys, 0)
    add("jagged_dense_elementwise_add", tag, x, [offsets], dense)
    add("jagged_dense_elementwise_add_jagged_output", tag, x, [offsets], dense)
    add("jagged_dense_elementwise_mul", tag, x, [offsets], dense)
    add("jagged_dense_dense_elementwise_add_jagged_output", tag, x, [offsets], dense, dense2)
    add("jagged_softmax", tag, x, offsets, max_L)
    add("jagged_jagged_bmm", tag + f" -> [{B}, {D}, {D}]", x, y, offsets, max_L)
    add("jagged_dense_bmm", tag + f" x [{B}, {D}, {D}]", x, offsets,
        torch.randn(B, D, D, generator=g), max_L)
    heads = 4
    add("batched_dense_vec_jagged_2d_mul", f"{tag} H={heads}",
        torch.randn(B * heads, max_L, generator=g), x, offsets)
    sel = torch.randperm(B, generator=g)[: B // 2]
    add("jagged_index_select", tag + f" select {B // 2}", x, lengths, sel)
    start = (torch.rand(B, generator=g) * lengths).to(torch.int64)
    add("jagged_slice", tag + " slice 64", x, lengths, start, 64)
    out += multi_dim_cases(quick, g)
    return out


def multi_dim_cases(quick: bool, g: torch.Generator) -> List[Case]:
    """The conversions and elementwise ops with J=2 and J=3 jagged dimensions (fbgemm's CPU
    kernels take any number): B sequences of up to 16 sub-sequences of up to 32 items (J=2), or
    of up to 8 x 8 x 16 (J=3), D=64."""
    out: List[Case] = []
    B, D = (32 if quick else 128), 64
    for dims in ([16, 32], [8, 8, 16]):
        offsets, entries = [], B
        for n in dims:
            lengths = heavy_tailed_lengths(entries, n, generator=g)
            offsets.append(offsets_of(lengths))
            entries = int(offsets[-1][-1])
        T = entries
        x = torch.randn(T, D, generator=g)
        dense = torch.randn(B, *dims, D, generator=g)
        dense2 = torch.randn(B, *dims, D, generator=g)
        tag = f"J={len(dims)} B={B} N={'x'.join(map(str, dims))} T={T} D={D}"
        for op, args in (
                ("jagged_to_padded_dense_forward", (x, offsets, dims, 0.0)),
                ("jagged_to_padded_dense_backward", (dense, offsets, T)),
                ("dense_to_jagged_forward", (dense, offsets, T)),
                ("jagged_dense_elementwise_add", (x, offsets, dense)),
                ("jagged_dense_elementwise_add_jagged_output", (x, offsets, dense)),
                ("jagged_dense_elementwise_mul", (x, offsets, dense)),
                ("jagged_dense_dense_elementwise_add_jagged_output", (x, offsets, dense, dense2))):
            out.append(case(op, tag, args))
    return out
