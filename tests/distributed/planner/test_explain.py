"""explain: per-rank rows add up to the totals and to the cost model's price, the JSON holds the
same numbers, the text shows every rank and table, the picture is written; TorchRec's own plan
is priced the same way."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("torchrec")

import torchrec_ascend  # noqa: E402,F401
from torchrec.distributed.planner import EmbeddingShardingPlanner  # noqa: E402

from torchrec_ascend.distributed.planner import (  # noqa: E402
    DeviceMemoryReservation, HierarchicalShardingPlanner, HierarchicalTopology, explain)
from torchrec_ascend.distributed.planner import tables as T  # noqa: E402
from torchrec_ascend.distributed.planner import collective_bytes as V  # noqa: E402


def _planned():
    topo = HierarchicalTopology.from_preset("cpu", hosts=2, devices_per_host=2,
                                            memory_bytes=250_000)
    cons = T.table_constraints(V.validation_tables())
    planner = HierarchicalShardingPlanner(topology=topo, batch_size=16, constraints=cons)
    model = V.ValidationModel(torch.device("meta"))
    return planner, planner.plan(model, T.default_sharders()), model, cons, topo


def test_rows_add_up_and_match_the_price(tmp_path):
    planner, plan, _, _, topo = _planned()
    ex = planner.explain(plan)
    ranks, totals = ex.ranks(), ex.totals()
    assert [r["rank"] for r in ranks] == list(range(4))
    assert sum(r["inter_host_bytes"] for r in ranks) == pytest.approx(totals["inter_host_bytes"])
    assert sum(r["intra_host_bytes"] for r in ranks) == pytest.approx(totals["intra_host_bytes"])
    price = planner.cost_model.price(planner.placed_tables())
    assert totals["inter_host_bytes"] == pytest.approx(price.inter_bytes)
    assert totals["est_step_comm_s"] == pytest.approx(price.step_comm_s)
    assert totals["peak_rank_memory_bytes"] == pytest.approx(max(r["memory_bytes"] for r in ranks))
    assert sum(t["inter_host_bytes"] for t in ex.cost.tables) <= totals["inter_host_bytes"]
    for r in ranks:  # a rank lists a table iff one of its shards is there
        held = {pt.table.fqn for pt in ex.placed if r["rank"] in pt.ranks}
        assert set(r["tables"]) == held
    doc = json.loads(ex.to_json())
    assert doc["totals"] == json.loads(json.dumps(totals))
    assert len(doc["ranks"]) == 4 and len(doc["tables"]) == 5
    text = str(ex)
    for name in ("ebc.big", "ec.item", "inter-host"):
        assert name in text
    png = ex.plot(str(tmp_path / "p.png"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_torchrec_plan_is_priced_with_the_same_model():
    planner, _, model, cons, topo = _planned()
    trc = EmbeddingShardingPlanner(topology=topo.to_torchrec(), batch_size=16, constraints=cons,
                                   storage_reservation=DeviceMemoryReservation(0.15))
    theirs = trc.plan(model, T.default_sharders())
    a = planner.explain(theirs)
    b = explain(theirs, topo, planner.cost_model.tables, cost_model=planner.cost_model)
    assert a.totals() == b.totals()
    types = {f"{p}.{t}": ps.sharding_type for p, mp in theirs.plan.items() for t, ps in mp.items()}
    assert {x["table"]: x["sharding_type"] for x in a.cost.tables} == types
    assert np.isfinite(a.cost.step_s)


def test_explain_needs_every_table_spec():
    planner, plan, _, _, topo = _planned()
    with pytest.raises(ValueError, match="TableWorkload"):
        explain(plan, topo, {})
