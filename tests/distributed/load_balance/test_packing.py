"""packing: the csrc kernels (lb_pack / lb_unpack / lb_scatter_rows) byte-identical to the torch
references on seeded random batches (empty peers, lengths 0/1/max, several dtypes and trailing
shapes, zero-width rows), and the round trip against direct indexing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchrec_ascend.distributed.load_balance import packing
from torchrec_ascend.distributed.load_balance.packing import (
    Field, pack, pack_batch, peer_bytes, scatter_rows, token_index, unpack)
from torchrec_ascend.ops.extension import kernel

needs_ext = pytest.mark.skipif(kernel("lb_pack") is None, reason="csrc extension without lb_pack: make build")

SPECS = [("ids", 0, torch.int64, ()), ("act", 0, torch.uint8, (3,)), ("w", 1, torch.float32, (2, 2)),
         ("z", 1, torch.float64, (0,)), ("users", -1, torch.int32, ()), ("emb", -1, torch.bfloat16, (5,))]


def _batch(seed: int, B: int, world: int, max_len: int):
    g = np.random.default_rng(seed)
    lengths = g.choice([0, 1, max_len, *range(max_len + 1)], size=(B, 2)).astype(np.int64)
    dest = g.integers(0, world, B).astype(np.int64)
    if world > 2:
        dest[dest == 1] = 0  # peer 1 gets nothing
    order = np.argsort(dest, kind="stable")
    fields, tensors = [], []
    for name, grp, dtype, trailing in SPECS:
        n = B if grp < 0 else int(lengths[:, grp].sum())
        t = torch.from_numpy(g.integers(0, 200, (n,) + trailing).astype(np.float64)).to(dtype)
        fields.append(Field(name, grp, dtype, trailing))
        tensors.append(t)
    per_peer = []
    for f in fields:
        w = np.ones(B, dtype=np.int64) if f.group < 0 else lengths[:, f.group]
        per_peer.append([int(x) for x in np.bincount(dest, w, world).astype(np.int64)])
    return tensors, fields, order, lengths, dest, per_peer


def _reference(tensors, fields, order, lengths, per_peer, world):
    tok = [torch.from_numpy(token_index(lengths[:, g], order)) for g in range(lengths.shape[1])]
    rows = [t.index_select(0, torch.from_numpy(order) if f.group < 0 else tok[f.group])
            for t, f in zip(tensors, fields)]
    return pack(rows, fields, per_peer, world, torch.device("cpu")), rows


@needs_ext
@pytest.mark.parametrize("seed,B,world,max_len", [(0, 0, 3, 4), (1, 1, 1, 5), (2, 17, 4, 6), (3, 40, 2, 1),
                                                  (4, 9, 8, 0), (5, 64, 5, 12)])
def test_kernels_match_the_torch_references(seed, B, world, max_len):
    tensors, fields, order, lengths, dest, per_peer = _batch(seed, B, world, max_len)
    (ref_buf, ref_sizes), rows = _reference(tensors, fields, order, lengths, per_peer, world)
    buf, sizes = pack_batch(tensors, fields, order, lengths, dest, per_peer, world, torch.device("cpu"))
    assert sizes == ref_sizes == peer_bytes(fields, per_peer, world)
    # the reference leaves padding bytes uninitialised: compare the payload segments only
    pos = 0
    for p in range(world):
        for f, fld in enumerate(fields):
            nb = per_peer[f][p] * fld.row_bytes
            assert torch.equal(buf[pos:pos + nb], ref_buf[pos:pos + nb]), (p, fld.name)
            assert not buf[pos + nb:pos + packing._pad(nb)].any()
            pos += packing._pad(nb)
    assert pos == buf.numel()
    # as the receiver of its own buffer: unpack gives back the grouped rows (== direct indexing)
    got = unpack(buf, fields, per_peer, world)
    ref = packing._unpack_reference(buf, fields, per_peer, world)
    for g, r, row, fld in zip(got, ref, rows, fields):
        assert g.dtype == fld.dtype and g.shape == row.shape == r.shape
        assert torch.equal(g, row) and torch.equal(r, row)


def test_fallback_without_the_extension_packs_the_same_payload(monkeypatch):
    tensors, fields, order, lengths, dest, per_peer = _batch(7, 23, 3, 5)
    monkeypatch.setattr(packing, "kernel", lambda name: None)
    buf, sizes = pack_batch(tensors, fields, order, lengths, dest, per_peer, 3, torch.device("cpu"))
    assert sizes == peer_bytes(fields, per_peer, 3)
    got = unpack(buf, fields, per_peer, 3)
    for t, f, g in zip(tensors, fields, got):  # direct indexing, a Python loop over samples
        off = np.concatenate([[0], np.cumsum(lengths[:, max(f.group, 0)])])
        idx = list(order) if f.group < 0 else [i for b in order for i in range(off[b], off[b + 1])]
        assert torch.equal(g, t[torch.tensor(idx, dtype=torch.int64)] if idx else t[:0])


@pytest.mark.parametrize("use_ext", [True, False])
@pytest.mark.parametrize("trailing", [(), (3,), (0,)])
def test_scatter_rows_inverts_a_gather(monkeypatch, use_ext, trailing):
    if use_ext and kernel("lb_scatter_rows") is None:
        pytest.skip("csrc extension without lb_scatter_rows")
    if not use_ext:
        monkeypatch.setattr(packing, "kernel", lambda name: None)
    g = torch.Generator().manual_seed(3)
    x = torch.randn((11,) + trailing, generator=g, dtype=torch.float64)
    order = torch.randperm(11, generator=g)
    out = scatter_rows(packing.to_bytes(x[order]), order, x.dtype, trailing)
    assert out.shape == x.shape and torch.equal(out, x)


@needs_ext
def test_kernels_name_the_bad_argument():
    fn, up, sc = kernel("lb_pack"), kernel("lb_unpack"), kernel("lb_scatter_rows")
    t = torch.arange(4)
    ln = torch.ones(4, 1, dtype=torch.int64)
    with pytest.raises(ValueError, match="dest"):
        fn([t], [0], [8], torch.arange(4), ln, torch.tensor([0, 0, 5, 1]), 2, 16)
    with pytest.raises(ValueError, match="order: not grouped"):
        fn([t], [0], [8], torch.arange(4), ln, torch.tensor([1, 0, 0, 1]), 2, 16)
    with pytest.raises(ValueError, match="rows: field 0"):
        fn([t[:3]], [0], [8], torch.arange(4), ln, torch.zeros(4, dtype=torch.int64), 2, 16)
    with pytest.raises(ValueError, match="buf: has"):
        up(torch.zeros(8, dtype=torch.uint8), [8], torch.tensor([[1, 1]]), 16)
    with pytest.raises(ValueError, match="index: must be a permutation"):
        sc(torch.zeros(16, dtype=torch.uint8), torch.tensor([1, 1]), 8)
