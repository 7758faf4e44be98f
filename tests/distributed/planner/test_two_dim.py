"""2-D planning (torchrec_ascend.distributed.planner.two_dim): the replicated cost model against
hand computations and the 1-D model, the planner's group plan and its world explanation, the
1-D / 2-D choice, bad arguments."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("torchrec")

import torchrec_ascend  # noqa: E402,F401
from torchrec_ascend.distributed.planner import tables as T  # noqa: E402
from torchrec_ascend.distributed.planner import collective_bytes as V  # noqa: E402
from torchrec_ascend.distributed.planner.estimators import CostModel  # noqa: E402
from torchrec_ascend.distributed.planner.two_dim import (  # noqa: E402
    ReplicatedCostModel, TwoDimShardingPlanner, choose_parallelism, group_topology)
from torchrec_ascend.distributed.planner.types import (  # noqa: E402
    PlacedTable, ShardSpec, TableWorkload)

WORLD = V.validation_topology()  # 2 hosts x 2


def _table(optimizer="sgd", rows=3000, dim=8, pooled=False):
    return TableWorkload("ec", "item", rows, dim, (6.0,), (64,), pooled=pooled, optimizer=optimizer)


def _row_wise(t, L=2):
    per = t.rows // L
    return PlacedTable(t, "row_wise", "fused",
                       tuple(ShardSpec(per, t.dim, k * per, 0, k) for k in range(L)))


@pytest.mark.parametrize("optimizer,state_per_row", [("sgd", 0), ("rowwise_adagrad", 1),
                                                     ("adam", None)])
@pytest.mark.parametrize("sync_every", [1, 4])
def test_sync_bytes_cross_hosts_by_hand(optimizer, state_per_row, sync_every):
    t = _table(optimizer)
    cm = ReplicatedCostModel(WORLD, sync_every)
    m = cm.traffic(_row_wise(t))
    H = WORLD.hosts
    inter = ~WORLD.same_host()
    if state_per_row is None:  # adam: two fp32 states per element
        per_sync = t.rows * t.dim * (4 + 8)
    else:
        per_sync = t.rows * t.dim * 4 + 4 * state_per_row * t.rows
    # a ring all-reduce over H replicas: each sends 2 S (H - 1) / H; summed over the shards'
    # replicas: 2 (H - 1) x the table's bytes
    assert (m["grad_sync"] * inter).sum() == pytest.approx(2 * (H - 1) * per_sync / sync_every)
    for p in ("input", "forward", "backward"):  # lookups never leave the host
        assert (m[p] * inter).sum() == 0


def test_group_traffic_is_the_one_host_model_on_every_host():
    t = _table(pooled=True)
    pt = _row_wise(t)
    one = CostModel(group_topology(WORLD)).traffic(pt)
    two = ReplicatedCostModel(WORLD).traffic(pt)
    L = WORLD.devices_per_host
    for p in ("input", "forward", "backward"):
        for h in range(WORLD.hosts):
            block = two[p][h * L:(h + 1) * L, h * L:(h + 1) * L]
            np.testing.assert_allclose(block, one[p])
        assert two[p].sum() == pytest.approx(WORLD.hosts * one[p].sum())


def test_data_parallel_table_all_reduces_over_the_world():
    t = _table(rows=64)
    dp = PlacedTable(t, "data_parallel", "dense",
                     tuple(ShardSpec(t.rows, t.dim, 0, 0, r) for r in range(2)))
    m = ReplicatedCostModel(WORLD, sync_every=8).traffic(dp)
    one = CostModel(WORLD).traffic(PlacedTable(t, "data_parallel", "dense", tuple(
        ShardSpec(t.rows, t.dim, 0, 0, r) for r in range(WORLD.world_size))))
    np.testing.assert_allclose(m["grad_sync"], one["grad_sync"])  # every step, not amortised


def test_whole_plan_price_reports_the_world():
    t = _table()
    cm = ReplicatedCostModel(WORLD, 2)
    pt = _row_wise(t)
    cost = cm.price([pt])
    assert cost.memory.shape == (WORLD.world_size,)
    np.testing.assert_allclose(cost.memory, np.tile(cm.memory(pt), WORLD.hosts))
    assert cost.inter_bytes == pytest.approx(2 * t.rows * t.dim * 4 / 2)
    row = cost.tables[0]
    assert row["mode"] == "2d" and row["ranks"] == [0, 1, 2, 3] and row["hosts"] == [0, 1]
    # the loads the partitioner adds up: the group's ranks, with their inter-host bytes
    loads = cm.loads(pt)
    assert loads.link.shape[-1] == WORLD.devices_per_host
    assert loads.link[:, 2, :].sum() * WORLD.hosts == pytest.approx(cost.inter_bytes)


def test_planner_plans_one_host_group_and_explains_the_world():
    planner = TwoDimShardingPlanner(topology=WORLD, batch_size=V.VALIDATION_BATCH,
                                    constraints=V.validation_constraints(), sync_every=4)
    plan = planner.plan(V.ValidationModel(torch.device("meta")), T.default_sharders())
    assert planner.sharding_group_size == 2 and planner.sync_every == 4
    ranks = {r for mp in plan.plan.values() for ps in mp.values() for r in (ps.ranks or [])}
    assert ranks <= {0, 1}
    types = {ps.sharding_type for mp in plan.plan.values() for ps in mp.values()}
    assert not types & {"table_row_wise", "grid_shard"}
    ex = planner.explain()
    assert ex.topology == WORLD and len(ex.ranks()) == WORLD.world_size
    assert {x["mode"] for x in ex.cost.tables} <= {"1d", "2d"}
    for x in ex.cost.tables:
        assert x["mode"] == ("1d" if x["sharding_type"] == "data_parallel" else "2d")
    assert "mode" in ex.table()
    assert ex.cost.peak_memory <= V.VALIDATION_MEMORY * 0.85


def test_choice_takes_the_better_mode():
    model = V.ValidationModel(torch.device("meta"))
    for objective in ("time", "inter_host_bytes"):
        c = choose_parallelism(model, T.default_sharders(), WORLD, sync_every=1,
                               batch_size=V.VALIDATION_BATCH, objective=objective,
                               constraints=V.validation_constraints())
        assert set(c.costs) == {"1d", "2d"}
        key = (lambda x: (x.step_s, x.inter_bytes)) if objective == "time" else \
            (lambda x: (x.inter_bytes, x.step_s))
        assert c.mode == min(c.costs, key=lambda m: key(c.costs[m]))
        assert isinstance(c.planner, TwoDimShardingPlanner) == (c.mode == "2d")


def test_bad_arguments():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="sync_every"):
            ReplicatedCostModel(WORLD, bad)
    with pytest.raises(ValueError, match="not supported"):
        TwoDimShardingPlanner(topology=WORLD, batch_size=8,
                              constraints=V.validation_constraints(
                                  {"user": "table_row_wise", "hot": "data_parallel",
                                   "big": "row_wise", "item": "row_wise", "tag": "table_wise"})
                              ).plan(V.ValidationModel(torch.device("meta")),
                                     T.default_sharders())
