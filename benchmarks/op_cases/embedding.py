"""Benchmark cases for the TBE embedding lookups (ops/embedding.py), ours vs fbgemm's CPU kernel.

T=4 tables x B=256 bags, heavy-tailed bag lengths up to 512 (mean about 128), D=256 fp32, 50k rows
per table (``quick``: B=32, 10k rows).  The backward ops apply their fused optimizer to the weights
and states in place on every call (same cost each call); fbgemm gets its own copies.  Adam has no
fbgemm CPU kernel (ours only).
"""

from __future__ import annotations

from typing import List

import torch

from benchmarks.common import heavy_tailed_lengths
from benchmarks.op_cases import Case, case, fbgemm_cpu_kernel, offsets_of
from torchrec_ascend.ops import embedding as E

HOST = 3  # fbgemm PlacementType.HOST


def cases(quick: bool) -> List[Case]:
    """Pooled (sum, weighted sum) and sequence forwards, the dense lookup, and the fused
    backward of every optimizer (sum pooling) plus the sequence RowWiseAdagrad backward."""
    g = torch.Generator().manual_seed(0)
    T, D, max_L = 4, 256, 512
    B, rows = (32, 10_000) if quick else (256, 50_000)
    lengths = torch.cat([heavy_tailed_lengths(B, max_L, generator=g) for _ in range(T)])
    offsets = offsets_of(lengths)
    N = int(offsets[-1])
    indices = torch.randint(0, rows, (N,), generator=g)
    psw = torch.rand(N, generator=g)
    weights = torch.randn(T * rows * D, generator=g)
    w_off = torch.arange(T, dtype=torch.int64) * rows * D
    D_off = (torch.arange(T + 1) * D).to(torch.int32)
    hsc = torch.arange(T + 1, dtype=torch.int64) * rows
    e, ei = torch.empty(0), torch.empty(0, dtype=torch.int32)
    plc = torch.full((T,), HOST, dtype=torch.int32)
    lr = torch.tensor(0.01)
    tag = f"T={T} B={B} L<={max_L} N={N} rows={rows} D={D}"
    out: List[Case] = []

    def fwd(iw):
        return (weights, e, e, e, plc, w_off, D_off, T * D, D, hsc, indices, offsets, 0,
                iw, ei, ei, False, 0)

    out.append(case("split_embedding_codegen_forward_unweighted_pt2_wrapper", tag + " sum",
                    fwd(None), training_path=True))
    out.append(case("split_embedding_codegen_forward_weighted_pt2_wrapper", tag + " weighted sum",
                    fwd(psw), training_path=True))
    out.append(case("split_embedding_nobag_codegen_forward_unweighted_pt2_wrapper",
                    tag + " sequence", (weights, e, e, e, plc, w_off, D, hsc, indices, offsets,
                                        ei, ei, False, 0), training_path=True))
    out.append(case("dense_embedding_codegen_lookup_function", tag + " sum, no grad",
                    (weights, w_off, D_off, T * D, D, hsc, 0, indices, offsets, 0, None, None),
                    training_path=True))

    grad = torch.randn(B, T * D, generator=g)

    def bwd(opt: str):
        w = weights.clone()
        head = [grad, w, e, e, e, plc, w_off, D_off, D, False, hsc, 0, indices, offsets, 0, None, ei,
                0, 0, False, 0, 0, False, True]
        if opt == "sgd":
            return tuple(head + [lr])
        if opt == "adagrad":
            return tuple(head + [torch.zeros_like(w), e, e, plc, w_off, lr, 1e-8])
        if opt == "rowwise_adagrad":
            return tuple(head + [torch.zeros(T * rows), e, e, plc, hsc[:-1].clone(), lr, 1e-8,
                                 0.0, 0, 0.0])
        return tuple(head + [torch.zeros_like(w), e, e, plc, w_off, torch.zeros_like(w), e, e,
                             plc, w_off, lr, 1e-8, 0.9, 0.999, 0.0, 1])

    for opt in E.OPTIMIZERS:
        name = E.backward_op_name(opt, False, False)
        fb_args = bwd(opt) if fbgemm_cpu_kernel(name) else None  # fbgemm's own weights/states
        out.append(case(name, tag + f" sum, fused {opt}", bwd(opt), fb_args, training_path=True))

    seq_grad = torch.randn(N, D, generator=g)

    def seq():
        return (seq_grad, weights.clone(), e, e, e, plc, w_off, D, hsc, 0, indices, offsets, ei,
                0, 0, False, 0, 0, False, True, torch.zeros(T * rows), e, e, plc,
                hsc[:-1].clone(), lr, 1e-8, 0.0, 0, 0.0)

    out.append(case(E.backward_op_name("rowwise_adagrad", False, True),
                    tag + " sequence, fused rowwise_adagrad", seq(), seq(), training_path=True))
    return out
