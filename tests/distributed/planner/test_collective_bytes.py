"""measured_matrix / compare on hand-made rows; the validation batches.  CommCounter's
multi-process check (the bytes counted per destination equal the tensors handed to each
collective) runs in test_planners.py's world-4 spawn (:func:`count_raw_collectives` and
:func:`check_raw_collectives` here), to spawn the ranks once."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

pytest.importorskip("torchrec")

import torchrec_ascend  # noqa: E402,F401

from torchrec_ascend.distributed.planner import HierarchicalTopology, allreduce_matrix  # noqa: E402
from torchrec_ascend.distributed.planner import collective_bytes as V  # noqa: E402
from torchrec_ascend.distributed.planner.estimators import CostModel  # noqa: E402

W = 4


def count_raw_collectives(rank: int, world: int) -> dict:
    """On each rank of a world-4 group: known collectives inside a CommCounter."""
    c = V.CommCounter(world)
    x = torch.zeros(16)  # fp32: 4 bytes an element
    dist.all_reduce(torch.zeros(3))  # outside the block: not counted
    with c:
        splits = [1, 2, 3, 4]  # rank r sends splits[j] rows of 2 floats to rank j
        out = torch.zeros((rank + 1) * world, 2)  # every rank sends me rank + 1 rows
        dist.all_to_all_single(out, torch.zeros(10, 2),
                               output_split_sizes=[rank + 1] * world, input_split_sizes=splits)
        dist.all_to_all_single(torch.zeros(8), torch.zeros(8, dtype=torch.float32))
        dist.reduce_scatter_tensor(torch.zeros(4), x)
        dist.all_gather_into_tensor(torch.zeros(4 * world), torch.zeros(4))
        dist.all_gather([torch.zeros(5) for _ in range(world)], torch.zeros(5))
        pair = dist.new_group([1, 3])
        if rank in (1, 3):
            dist.all_to_all_single(torch.zeros(6), torch.zeros(6), group=pair)
            dist.all_reduce(torch.zeros(5), group=pair)  # a subgroup: 2 x 20 / 2 to the peer
        dist.all_reduce(torch.zeros(7))
    dist.all_reduce(torch.zeros(3))
    assert not getattr(dist.all_reduce, "__name__", "") == "wrapper"  # unpatched on exit
    return c.row()


def check_raw_collectives(rows) -> None:
    """Every rank's counted bytes, collective by collective, against the tensors sent."""
    for r, row in enumerate(rows):
        a2a = np.array([j + 1 for j in range(W)], dtype=float) * 2 * 4  # uneven splits
        a2a += 2 * 4  # 8 floats in 4 even chunks
        if r in (1, 3):
            a2a[4 - r] += 3 * 4  # the pair group: 6 floats, half to the peer (global rank)
        a2a[r] = 0  # a rank's own chunk is no link traffic
        np.testing.assert_allclose(row["sent"]["all_to_all"], a2a)
        rs = np.full(W, 4 * 4.0)
        rs[r] = 0
        np.testing.assert_allclose(row["sent"]["reduce_scatter"], rs)
        ag = np.full(W, (4 + 5) * 4.0)
        ag[r] = 0
        np.testing.assert_allclose(row["sent"]["all_gather"], ag)
        assert row["allreduce"] == [28]
        if r in (1, 3):
            want = np.zeros(W)
            want[4 - r] = 20.0
            np.testing.assert_allclose(row["sent"]["all_reduce_group"], want)
        else:
            assert "all_reduce_group" not in row["sent"]


def test_measured_matrix_and_compare():
    topo = HierarchicalTopology.from_preset("cpu", hosts=2, devices_per_host=2)
    rows = [{"sent": {"all_to_all": np.eye(W)[(r + 1) % W] * 100.0}, "allreduce": [40]}
            for r in range(W)]
    m = V.measured_matrix(rows, topo)
    want = allreduce_matrix(40.0, topo)
    for r in range(W):
        want[r, (r + 1) % W] += 100.0
    np.testing.assert_allclose(m, want)
    cost = CostModel(topo).price([])
    result = V.compare(cost, m)
    assert result["inter_measured"] == pytest.approx((m * ~topo.same_host()).sum())
    assert result["error"] == pytest.approx(1.0)  # nothing estimated, something measured
    with pytest.raises(ValueError, match="payloads"):
        V.measured_matrix(rows[:3] + [{"sent": {}, "allreduce": [8]}], topo)
    with pytest.raises(ValueError, match="rows"):
        V.measured_matrix(rows[:2], topo)


def test_batches_are_seeded_and_have_the_designed_means():
    a, b = V.make_batch(1, 3, 512), V.make_batch(1, 3, 512)
    assert torch.equal(a.bags.values(), b.bags.values())
    assert not torch.equal(a.bags.values(), V.make_batch(2, 3, 512).bags.values())
    lengths = a.bags.length_per_key()
    assert lengths[0] / 512 == pytest.approx(1.0, rel=0.15)  # user: pooling 1
    assert lengths[2] / 512 == pytest.approx(3.0, rel=0.15)  # big_a: pooling 3
