"""The cost model against a plain-loop rendering of TorchRec 1.8's protocol, the textbook
all-reduce volume, hand-computed memory and time, and TorchRec's own enumerator.

The loop reference walks ranks, features, shards and (for table-row-wise / grid) the two output
steps one by one, the way ``KJTAllToAll``, ``PooledEmbeddingsAllToAll``,
``PooledEmbeddingsReduceScatter``, ``SequenceEmbeddingsAllToAll`` and
``TwRwPooledEmbeddingDist`` move data; the measured check (bytes TorchRec's collectives really
move on gloo) is in test_planners.py.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

pytest.importorskip("torchrec")

import torchrec_ascend  # noqa: E402,F401
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig  # noqa: E402
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: E402
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator  # noqa: E402
from torchrec.distributed.planner.types import Topology  # noqa: E402
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward  # noqa: E402
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad  # noqa: E402

from torchrec_ascend.distributed.planner import (  # noqa: E402
    CostModel, HierarchicalShardEstimator, HierarchicalTopology, LinkSpec, PlacedTable, ShardSpec,
    TableWorkload, allreduce_matrix)
from torchrec_ascend.distributed.planner.estimators import PHASES, TIME_PHASES  # noqa: E402

H, L = 3, 2
W = H * L


def _topo(allreduce: str = "hierarchical") -> HierarchicalTopology:
    return HierarchicalTopology(hosts=H, devices_per_host=L, compute_device="cpu",
                                memory_bytes=1 << 30, memory_bandwidth=50e9,
                                intra_host=LinkSpec(100e9, 2e-6), inter_host=LinkSpec(10e9, 9e-6),
                                allreduce=allreduce)


def _table(pooled: bool, weighted: bool = False, optimizer: str = "sgd") -> TableWorkload:
    return TableWorkload(module="ebc" if pooled else "ec", name="t", rows=120, dim=8,
                     pooling_factors=(3.0, 1.5), batch_sizes=(10, 6), pooled=pooled,
                     weighted=weighted, optimizer=optimizer)


# (sharding type, shards as (rows, cols, row offset, col offset, rank))
LAYOUTS = {
    "table_wise": [(120, 8, 0, 0, 3)],
    "column_wise": [(120, 4, 0, 0, 1), (120, 4, 0, 4, 4)],
    "row_wise": [(20, 8, 20 * k, 0, k) for k in range(W)],
    "table_row_wise": [(60, 8, 0, 0, 2), (60, 8, 60, 0, 3)],
    "grid_shard": [(60, 4, 0, 0, 0), (60, 4, 60, 0, 1), (60, 4, 0, 4, 4), (60, 4, 60, 4, 5)],
}


def _placed(t: TableWorkload, stype: str) -> PlacedTable:
    return PlacedTable(t, stype, "fused", tuple(ShardSpec(*s) for s in LAYOUTS[stype]))


def _loop_reference(t: TableWorkload, pt: PlacedTable, index_bytes=8, length_bytes=8) -> dict:
    """Bytes rank src sends rank dst per phase, rank pair by rank pair."""
    m = {p: [[0.0] * W for _ in range(W)] for p in PHASES}
    id_bytes = index_bytes + (4 if t.weighted else 0)
    e = t.output_bytes
    for src in range(W):  # input dist: every rank's KJT, bucketed per shard
        for shard in pt.shards:
            for b, p in zip(t.batch_sizes, t.pooling_factors):
                m["input"][src][shard.rank] += b * length_bytes
                m["input"][src][shard.rank] += b * p * id_bytes * shard.rows / t.rows
    for dst in range(W):  # output dist, forward
        for b, p in zip(t.batch_sizes, t.pooling_factors):
            if not t.pooled:  # each id's vector from its row owner
                for shard in pt.shards:
                    m["forward"][shard.rank][dst] += b * p * shard.rows / t.rows * shard.cols * e
            elif pt.sharding_type in ("table_row_wise", "grid_shard"):
                # step 1: inside the owning host, reduce-scatter by destination local rank
                # (each partial vector of dst's samples goes to the host peer with dst's local
                # rank); step 2: that peer sends the sums to dst
                for shard in pt.shards:
                    host = shard.rank // L
                    peer = host * L + dst % L
                    m["forward"][shard.rank][peer] += b * shard.cols * e
                groups = {s.col_offset: s for s in pt.shards}
                for g in groups.values():
                    peer = (g.rank // L) * L + dst % L
                    m["forward"][peer][dst] += b * g.cols * e
            else:  # every shard sends dst the (partial) pooled vectors of dst's samples
                for shard in pt.shards:
                    m["forward"][shard.rank][dst] += b * shard.cols * e
    for src, dst in itertools.product(range(W), range(W)):
        m["backward"][src][dst] = m["forward"][dst][src]
    return {p: np.array(v) for p, v in m.items()}


@pytest.mark.parametrize("stype", sorted(LAYOUTS))
@pytest.mark.parametrize("pooled", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
def test_traffic_matches_the_loop_reference(stype, pooled, weighted):
    if not pooled and stype in ("table_row_wise", "grid_shard"):
        pytest.skip("TorchRec 1.8's EmbeddingCollection has no table-row-wise / grid")
    t = _table(pooled, weighted)
    pt = _placed(t, stype)
    got = CostModel(_topo()).traffic(pt)
    want = _loop_reference(t, pt)
    for p in PHASES:
        np.testing.assert_allclose(got[p], want[p], rtol=1e-12, atol=1e-9, err_msg=p)


def test_int32_ids_and_lengths_halve_the_input_bytes():
    t = _table(True)
    pt = _placed(t, "row_wise")
    a = CostModel(_topo()).traffic(pt)["input"]
    b = CostModel(_topo(), index_bytes=4, length_bytes=4).traffic(pt)["input"]
    np.testing.assert_allclose(b, a / 2)
    np.testing.assert_allclose(b, _loop_reference(t, pt, 4, 4)["input"])


@pytest.mark.parametrize("algorithm", ["hierarchical", "direct"])
def test_allreduce_volume(algorithm):
    """Bandwidth-optimal all-reduce: every rank sends 2 (n - 1) / n of the payload (Patarasuk &
    Yuan 2009); the hierarchical one sends 2 (H - 1) / H of it out of each host."""
    size = 1200.0
    topo = _topo(algorithm)
    m = allreduce_matrix(size, topo)
    same = topo.same_host()
    np.testing.assert_allclose(np.diag(m), 0.0)
    if algorithm == "direct":
        np.testing.assert_allclose(m.sum(1), 2 * size * (W - 1) / W)
        return
    np.testing.assert_allclose((m * same).sum(1), 2 * size * (L - 1) / L)
    for h in range(H):
        rows = slice(h * L, (h + 1) * L)
        np.testing.assert_allclose((m * ~same)[rows].sum(), 2 * size * (H - 1) / H)
    # an all-reduce over some ranks only is the direct exchange among them
    sub = allreduce_matrix(size, topo, ranks=[0, 3, 5])
    assert sub[0, 3] == sub[3, 5] == pytest.approx(2 * size / 3) and sub[1].sum() == 0


def test_data_parallel_moves_only_its_gradient():
    t = _table(True)
    pt = PlacedTable(t, "data_parallel", "dense",
                     tuple(ShardSpec(120, 8, 0, 0, r) for r in range(W)))
    m = CostModel(_topo()).traffic(pt)
    for p in ("input", "forward", "backward"):
        assert m[p].sum() == 0
    np.testing.assert_allclose(m["grad_sync"], allreduce_matrix(120 * 8 * 4, _topo()))


@pytest.mark.parametrize("optimizer,state", [("sgd", 0), ("rowwise_adagrad", 120 * 4),
                                             ("adagrad", 120 * 8 * 4), ("adam", 2 * 120 * 8 * 4)])
def test_memory_by_hand(optimizer, state):
    t = _table(True, optimizer=optimizer)
    cm = CostModel(_topo(), buffer_copies=2)
    mem = cm.memory(_placed(t, "table_wise"))
    ids_in = W * (16 * 8 + (10 * 3 + 6 * 1.5) * 8)  # every rank's lengths and ids
    out = W * 16 * 8 * 4  # the pooled vectors of every rank's samples
    want = 120 * 8 * 4 + state + 2 * (ids_in + 2 * out)
    assert mem[3] == pytest.approx(want)
    assert mem.sum() == pytest.approx(want)
    dp = cm.memory(PlacedTable(t, "data_parallel", "dense",
                               tuple(ShardSpec(120, 8, 0, 0, r) for r in range(W))))
    local = 16 * 8 + (10 * 3 + 6 * 1.5) * 8 + 2 * 16 * 8 * 4
    np.testing.assert_allclose(dp, 2 * 120 * 8 * 4 + state + 2 * local)


def test_lookup_time_by_hand():
    t = _table(False)
    cm = CostModel(_topo(), bwd_compute_multiplier=2.0)
    comp = cm.compute(_placed(t, "row_wise"))
    ids = W * (10 * 3 + 6 * 1.5) * 20 / 120  # every rank's ids in one 20-row block
    np.testing.assert_allclose(comp, ids * 8 * 4 * 3 / 50e9)


def test_price_times_and_latencies_by_hand():
    topo = _topo()
    cm = CostModel(topo)
    a = _placed(_table(True), "table_row_wise")
    b = PlacedTable(TableWorkload("ebc", "u", 10, 8, (1.0,), (16,)), "data_parallel", "dense",
                    tuple(ShardSpec(10, 8, 0, 0, r) for r in range(W)))
    cost = cm.price([a, b])
    mats = {p: cm.traffic(a)[p] + cm.traffic(b)[p] for p in PHASES}
    mats["input"] += (~np.eye(W, dtype=bool)) * 3 * 8  # the splits exchange of one group
    mats["backward"] = mats["backward"] + mats["grad_sync"]
    same = topo.same_host()
    for p in TIME_PHASES:
        worst = 0.0
        for r in range(W):
            intra = max(sum(mats[p][r, j] for j in range(W) if same[r, j] and j != r),
                        sum(mats[p][j, r] for j in range(W) if same[r, j] and j != r))
            inter = max(sum(mats[p][r, j] for j in range(W) if not same[r, j]),
                        sum(mats[p][j, r] for j in range(W) if not same[r, j]))
            worst = max(worst, intra / 100e9 + inter / 10e9)
        # input: splits + lengths + values; forward/backward: reduce-scatter + all-to-all;
        # backward also the data-parallel all-reduce
        lat = {"input": 3 * 9e-6, "forward": 9e-6 + 2e-6, "backward": 9e-6 + 2e-6 + 9e-6}[p]
        assert cost.phase_s[p] == pytest.approx(worst + lat, rel=1e-12), p
    assert cost.inter_bytes == pytest.approx(sum((m * ~same).sum() for m in
                                                 (cm.traffic(a)[p] + cm.traffic(b)[p]
                                                  for p in PHASES)) + 3 * 8 * (W * W - W * L))
    assert cost.step_s == pytest.approx(cost.step_comm_s + cost.compute_s.max())


def test_table_row_wise_group_must_fill_one_host():
    t = _table(True)
    bad = PlacedTable(t, "table_row_wise", "fused",
                      (ShardSpec(60, 8, 0, 0, 1), ShardSpec(60, 8, 60, 0, 2)))
    with pytest.raises(ValueError, match="spans hosts"):
        CostModel(_topo()).traffic(bad)


def test_bad_specs():
    with pytest.raises(ValueError, match="bandwidth"):
        LinkSpec(0.0)
    with pytest.raises(ValueError, match="latency"):
        LinkSpec(1.0, -1.0)
    with pytest.raises(ValueError, match="pooling_factors"):
        TableWorkload("m", "t", 10, 4, (1.0, 2.0), (4,))
    with pytest.raises(ValueError, match="optimizer"):
        TableWorkload("m", "t", 10, 4, (1.0,), (4,), optimizer="lion")
    with pytest.raises(ValueError, match="sharding_type"):
        PlacedTable(_table(True), "diagonal", "fused", (ShardSpec(120, 8, 0, 0, 0),))
    with pytest.raises(ValueError, match="index_bytes"):
        CostModel(_topo(), index_bytes=2)
    with pytest.raises(ValueError, match="ranks"):
        CostModel(_topo()).traffic(PlacedTable(_table(True), "table_wise", "fused",
                                               (ShardSpec(120, 8, 0, 0, W),)))


def _enumerate(topology: Topology, module, sharder=None):
    est = HierarchicalShardEstimator(topology)
    enum = EmbeddingEnumerator(topology=topology, batch_size=32, estimator=[est])
    return est, enum.enumerate(module, [sharder or EmbeddingBagCollectionSharder()])


def _ebc():
    return EmbeddingBagCollection(tables=[EmbeddingBagConfig(
        name="t0", embedding_dim=16, num_embeddings=1000, feature_names=["f0"])],
        device=torch.device("meta"))


@pytest.mark.parametrize("device,tier", [("cuda", "hbm"), ("cpu", "ddr")])
def test_estimator_sets_storage_and_perf(device, tier):
    topo = HierarchicalTopology.from_preset("h100" if device == "cuda" else "cpu", hosts=2,
                                            devices_per_host=2).to_torchrec()
    est, options = _enumerate(topo, _ebc())
    assert {so.sharding_type for so in options} >= {"table_wise", "row_wise", "data_parallel"}
    spec = est.cost_model.tables[".t0"]
    assert (spec.rows, spec.dim, spec.batch_sizes, spec.optimizer) == (1000, 16, (32,), "sgd")
    for so in options:
        for shard in so.shards:
            other = "ddr" if tier == "hbm" else "hbm"
            assert getattr(shard.storage, tier) > 0 and getattr(shard.storage, other) == 0
            assert shard.perf is not None and shard.perf.total >= 0
        if so.sharding_type == "table_wise":
            # one shard: the table's own memory model
            pt = PlacedTable(spec, "table_wise", so.compute_kernel, (ShardSpec(1000, 16, 0, 0, 0),))
            assert getattr(so.shards[0].storage, tier) == pytest.approx(
                est.cost_model.memory(pt)[0], abs=1)


def test_estimator_infers_the_optimizer():
    topo = HierarchicalTopology.from_preset("cpu", hosts=1, devices_per_host=2).to_torchrec()
    ebc = _ebc()
    apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": 0.1})
    est, _ = _enumerate(topo, ebc)
    assert est.cost_model.tables[".t0"].optimizer == "rowwise_adagrad"
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_ADAGRAD})
    est, _ = _enumerate(topo, _ebc(), sharder)
    assert est.cost_model.tables[".t0"].optimizer == "adagrad"
