"""HierarchicalPartitioner: host groups fill one host, fixed layouts go to rank k, table-wise
shards spread to the placement a brute-force search finds best, a unit that fits nowhere is a
PlannerError naming table and memory, and the same proposal always gets the same ranks."""

from __future__ import annotations

import itertools

import pytest
import torch

pytest.importorskip("torchrec")

import torchrec_ascend  # noqa: E402,F401
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig  # noqa: E402
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: E402
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator  # noqa: E402
from torchrec.distributed.planner.types import PlannerError  # noqa: E402

from torchrec_ascend.distributed.planner import (  # noqa: E402
    CostModel, HierarchicalPartitioner, HierarchicalShardEstimator, HierarchicalTopology, LinkSpec,
    PlacedTable, ShardSpec)
from torchrec_ascend.distributed.planner.partitioners import format_bytes  # noqa: E402

H, L = 2, 2
W = H * L


def _topo(memory: int = 1 << 30) -> HierarchicalTopology:
    return HierarchicalTopology(hosts=H, devices_per_host=L, compute_device="cpu",
                                memory_bytes=memory, memory_bandwidth=100e9,
                                intra_host=LinkSpec(100e9, 0.0), inter_host=LinkSpec(10e9, 0.0))


def _options(tables, memory: int = 1 << 30):
    """(cost model, reserved TorchRec topology, {table: {sharding type: option}})."""
    topo = _topo(memory)
    cm = CostModel(topo)
    trc = topo.to_torchrec()
    est = HierarchicalShardEstimator(trc, cost_model=cm)
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(
        name=n, embedding_dim=d, num_embeddings=r, feature_names=[f"f_{n}"]) for n, r, d in tables],
        device=torch.device("meta"))
    options = EmbeddingEnumerator(topology=trc, batch_size=64, estimator=[est]).enumerate(
        ebc, [EmbeddingBagCollectionSharder()])
    by = {}
    for so in options:
        by.setdefault(so.name, {})[so.sharding_type] = so
    return cm, trc, by


def test_host_groups_fill_one_host_and_fixed_layouts_go_to_rank_k():
    cm, trc, by = _options([("a", 1000, 16), ("b", 1000, 16), ("c", 1000, 16)])
    plan = HierarchicalPartitioner(cm).partition(
        [by["a"]["table_row_wise"], by["b"]["row_wise"], by["c"]["data_parallel"]], trc)
    ranks = {so.name: [s.rank for s in so.shards] for so in plan}
    assert ranks["b"] == list(range(W)) and ranks["c"] == list(range(W))
    host = ranks["a"][0] // L
    assert ranks["a"] == [host * L + k for k in range(L)]
    # the proposal's own options keep no ranks (TorchRec reuses them)
    assert all(s.rank is None for s in by["a"]["table_row_wise"].shards)


def test_table_wise_placement_is_the_brute_force_best():
    tables = [("a", 5000, 64), ("b", 3000, 32), ("c", 800, 16), ("d", 200, 16)]
    cm, trc, by = _options(tables)
    proposal = [by[n]["table_wise"] for n, _, _ in tables]
    plan = HierarchicalPartitioner(cm).partition(proposal, trc)
    got = cm.price_options(plan).step_s

    def at(so, rank: int) -> PlacedTable:
        (size, offset) = (so.shards[0].size, so.shards[0].offset)
        return PlacedTable(cm.tables[so.fqn], so.sharding_type, so.compute_kernel,
                           (ShardSpec(size[0], size[1], offset[0], offset[1], rank),))

    best = min(cm.price([at(so, r) for so, r in zip(proposal, ranks)]).step_s
               for ranks in itertools.product(range(W), repeat=len(tables)))
    assert got <= best * (1 + 1e-9)
    # four equal-traffic-class tables on four ranks: one each
    assert len({so.shards[0].rank for so in plan}) == 4


def test_no_room_is_a_planner_error_naming_table_and_memory():
    cm, trc, by = _options([("big", 100_000, 64)], memory=4 << 20)  # 25.6 MB table, 4 MB device
    part = HierarchicalPartitioner(cm)
    with pytest.raises(PlannerError) as info:
        part.partition([by["big"]["table_wise"]], trc)
    msg = str(info.value)
    assert "'.big'" in msg and "needs" in msg and "free" in msg
    f = part.last_failure
    assert f is not None and f.needed > f.available
    assert f.capacity == int(trc.devices[0].storage.ddr)


def test_deterministic():
    cm, trc, by = _options([("a", 5000, 64), ("b", 3000, 32), ("c", 3000, 32)])
    proposal = [by["a"]["table_wise"], by["b"]["column_wise"], by["c"]["table_row_wise"]]
    runs = [[[s.rank for s in so.shards] for so in HierarchicalPartitioner(cm).partition(
        proposal, trc)] for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]


def test_format_bytes():
    assert format_bytes(17) == "17 bytes"
    assert format_bytes(3 << 20) == "3 MiB (3145728 bytes)"
    assert format_bytes(1.5 * (1 << 30)).startswith("1.5 GiB")
