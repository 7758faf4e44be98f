"""packing: the csrc kernels (lb_exchange_pack / lb_unpack / lb_scatter_rows) equal to the numpy/torch
references on seeded random global batches (empty ranks and peers, lengths 0/1/max, several dtypes and
trailing shapes, zero-width rows), and a whole exchange simulated in one process (every rank's buffer
cut into its peers' chunks) against direct indexing with Python loops over samples."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchrec_ascend.distributed.load_balance import packing
from torchrec_ascend.distributed.load_balance.packing import Field, plan_pack, scatter_rows, unpack
from torchrec_ascend.ops.extension import kernel

needs_ext = pytest.mark.skipif(kernel("lb_exchange_pack") is None,
                               reason="csrc extension without lb_exchange_pack: make build")

SPECS = [("ids", 0, torch.int64, ()), ("act", 0, torch.uint8, (3,)), ("w", 1, torch.float32, (2, 2)),
         ("z", 1, torch.float64, (0,)), ("users", -1, torch.int32, ()), ("emb", -1, torch.bfloat16, (5,))]
FIELDS = [Field(*spec) for spec in SPECS]
CPU = torch.device("cpu")


def _global(seed: int, counts, max_len: int):
    """Global rows [N, 1 + 2] (cost bits unused), bins [N] (peer 1 gets nothing when world > 2) and
    every rank's local tensors."""
    g = np.random.default_rng(seed)
    counts = np.asarray(counts, dtype=np.int64)
    world, N = counts.size, int(counts.sum())
    lengths = g.choice([0, 1, max_len, *range(max_len + 1)], size=(N, 2)).astype(np.int64)
    rows = np.concatenate([g.integers(0, 2 ** 40, (N, 1)), lengths], 1).astype(np.int64)
    bins = g.integers(0, world, N).astype(np.int64)
    if world > 2:
        bins[bins == 1] = 0
    tensors, start = [], 0
    for n in counts.tolist():
        local = lengths[start:start + n]
        tensors.append([torch.from_numpy(g.integers(0, 200, ((n if f.group < 0 else int(local[:, f.group].sum())),)
                                                    + f.trailing).astype(np.float64)).to(f.dtype) for f in FIELDS])
        start += n
    return rows, counts, bins, tensors


def _rows_to(rank_tensors, local_lengths, samples, f: Field) -> torch.Tensor:
    """Direct indexing: the rows of field ``f`` for local ``samples`` (a Python loop)."""
    t = rank_tensors[FIELDS.index(f)]
    if f.group < 0:
        idx = list(samples)
    else:
        off = np.concatenate([[0], np.cumsum(local_lengths[:, f.group])])
        idx = [i for b in samples for i in range(off[b], off[b + 1])]
    return t[torch.tensor(idx, dtype=torch.int64)] if idx else t[:0]


CASES = [(0, (0, 0, 0), 4), (1, (1,), 5), (2, (17, 0, 9, 4), 6), (3, (40, 23), 1), (4, (9, 3, 0, 1, 7, 2, 5, 8), 0),
         (5, (64, 64, 30, 1, 12), 12)]


@needs_ext
@pytest.mark.parametrize("seed,counts,max_len", CASES)
def test_exchange_pack_matches_the_reference(seed, counts, max_len):
    rows, cnt, bins, tensors = _global(seed, counts, max_len)
    for rank in range(cnt.size):
        plan, buf = plan_pack(rows, cnt, bins, rank, tensors[rank], FIELDS, CPU)
        rbuf, table, order, recv_global, recv_lengths = packing._plan_pack_reference(
            rows, cnt, bins, rank, tensors[rank], FIELDS, CPU)
        assert torch.equal(plan.table, table)
        assert np.array_equal(plan.order, order) and np.array_equal(plan.recv_global, recv_global)
        assert torch.equal(plan.recv_lengths, recv_lengths)
        assert buf.numel() == rbuf.numel() == sum(plan.send_bytes)
        # the reference leaves padding bytes uninitialised: compare the payload segments only
        pos = 0
        for p in range(cnt.size):
            for f in FIELDS:
                nb = plan.lists[0][f.kind][p] * f.row_bytes
                assert torch.equal(buf[pos:pos + nb], rbuf[pos:pos + nb]), (rank, p, f.name)
                assert not buf[pos + nb:pos + packing._pad(nb)].any()
                pos += packing._pad(nb)
        assert pos == buf.numel()


@pytest.mark.parametrize("use_ext", [True, False])
@pytest.mark.parametrize("seed,counts,max_len", CASES)
def test_a_simulated_exchange_delivers_every_sample(monkeypatch, use_ext, seed, counts, max_len):
    if use_ext and kernel("lb_exchange_pack") is None:
        pytest.skip("csrc extension without lb_exchange_pack")
    if not use_ext:
        monkeypatch.setattr(packing, "kernel", lambda name: None)
    rows, cnt, bins, tensors = _global(seed, counts, max_len)
    world = cnt.size
    starts = np.concatenate([[0], np.cumsum(cnt)])
    plans, bufs = zip(*(plan_pack(rows, cnt, bins, r, tensors[r], FIELDS, CPU) for r in range(world)))
    chunks = []  # chunks[r][q]: the bytes rank r sends to rank q
    for r in range(world):
        edges = np.concatenate([[0], np.cumsum(plans[r].send_bytes)])
        chunks.append([bufs[r][edges[q]:edges[q + 1]] for q in range(world)])
    for q in range(world):
        assert plans[q].recv_bytes == [plans[r].send_bytes[q] for r in range(world)]
        got = unpack(torch.cat([chunks[r][q] for r in range(world)]), FIELDS, plans[q].recv_rows)
        mine = [i for i in range(rows.shape[0]) if bins[i] == q]  # ascending global index
        assert plans[q].recv_global.tolist() == mine
        assert plans[q].recv_lengths.T.tolist() == rows[mine, 1:].tolist()
        for f, t in zip(FIELDS, got):
            want = [_rows_to(tensors[r], rows[starts[r]:starts[r + 1], 1:],
                             [i - starts[r] for i in mine if starts[r] <= i < starts[r + 1]], f)
                    for r in range(world)]
            assert t.dtype == f.dtype and torch.equal(t, torch.cat(want)), (q, f.name)
        for r in range(world):  # the send order: local samples grouped by destination, stable
            local = bins[starts[r]:starts[r + 1]]
            assert plans[r].order.tolist() == sorted(range(int(cnt[r])), key=lambda b: (local[b], b))


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
    out = scatter_rows(packing.to_bytes(x[order]), order, x[:0])
    assert out.shape == x.shape and out.dtype == x.dtype and torch.equal(out, x)


@needs_ext
def test_kernels_name_the_bad_argument():
    fn, up, sc = kernel("lb_exchange_pack"), kernel("lb_unpack"), kernel("lb_scatter_rows")
    rows = torch.tensor([[0, 1], [0, 2], [0, 0]])
    t = torch.arange(3)
    cnt = torch.tensor([2, 1])
    with pytest.raises(ValueError, match="bins: entry 1 is 5"):
        fn(rows, cnt, torch.tensor([0, 5, 1]), 0, [t[:2]], [-1], [8], 16)
    with pytest.raises(ValueError, match="counts: sum to 4"):
        fn(rows, torch.tensor([2, 2]), torch.tensor([0, 0, 1]), 0, [t[:2]], [-1], [8], 16)
    with pytest.raises(ValueError, match="tensors: field 0 has 16 bytes, expected 24"):
        fn(rows, cnt, torch.tensor([0, 0, 1]), 0, [t[:2]], [0], [8], 16)
    with pytest.raises(ValueError, match="rank: 2 is outside"):
        fn(rows, cnt, torch.tensor([0, 0, 1]), 2, [t[:2]], [-1], [8], 16)
    with pytest.raises(ValueError, match="rows: sample 1 has a negative length"):
        fn(torch.tensor([[0, 1], [0, -2], [0, 0]]), cnt, torch.tensor([0, 0, 1]), 0, [t[:2]], [-1], [8], 16)
    with pytest.raises(ValueError, match="buf: has"):
        up(torch.zeros(8, dtype=torch.uint8), [t[:0]], [0], torch.tensor([[1, 1]]), 16)
    with pytest.raises(ValueError, match="kinds: entry 0 is 3"):
        up(torch.zeros(32, dtype=torch.uint8), [t[:0]], [3], torch.tensor([[1, 1]]), 16)
    with pytest.raises(ValueError, match="index: must be a permutation"):
        sc(torch.zeros(16, dtype=torch.uint8), torch.tensor([1, 1]), t[:0])
