"""HierarchicalShardingPlanner: TorchRec's planner API, plans that execute, errors on every rank.

Single process: plan() returns a ShardingPlan for every table (TorchRec's validation passes),
takes a HierarchicalTopology, a plain TorchRec Topology or the environment, logs no warning, and
an infeasible model raises HierarchicalPlannerError naming the table and both memory sizes.

World 4 (2 hosts x 2, LOCAL_WORLD_SIZE=2; slow): collective_plan gives every rank the plan a
single process computes; an infeasible topology raises on every rank (no hang); the validation
model (torchrec_ascend.distributed.planner.collective_bytes) trained 2 steps under our plan and two
forced plans covering every sharding type (gloo) and under our plan on the simulated npu matches
an unsharded float32 model trained on the same batches (every parameter steps with the mean of
the ranks' gradients, as DDP and TorchRec's all-to-all backward average them); and the bytes the
collectives moved match the cost model's estimate within 20% on intra- and inter-host links.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Dict, List

import pytest
import torch

pytest.importorskip("torchrec")

import torchrec_ascend  # noqa: E402,F401
from torchrec.distributed.planner import Topology  # noqa: E402
from torchrec.distributed.planner.types import PlannerError  # noqa: E402
from torchrec.distributed.types import ShardingPlan  # noqa: E402

from torchrec_ascend import device as _device  # noqa: E402
from torchrec_ascend.distributed.planner import (  # noqa: E402
    HierarchicalPlannerError, HierarchicalShardingPlanner, plan_digest)
from torchrec_ascend.distributed.planner import tables as T  # noqa: E402
from torchrec_ascend.distributed.planner import collective_bytes as V  # noqa: E402
from torchrec_ascend.testing import simulated_npu  # noqa: E402
from torchrec_ascend.testing import torchrec_workload as W  # noqa: E402
from torchrec_ascend.testing.multiprocess import rank_device, run_multiprocess  # noqa: E402

from test_collective_bytes import check_raw_collectives, count_raw_collectives  # noqa: E402

BATCH = V.VALIDATION_BATCH
STEPS = 2
MEMORY = V.VALIDATION_MEMORY
ATOL, RTOL = 1e-5, 1e-4
FORCED = {k: v for k, v in V.VALIDATION_PLANS.items() if v is not None}
_topology = V.validation_topology
_constraints = V.validation_constraints


def _planner(device_type: str = "cpu", forced=None, memory: int = MEMORY):
    return HierarchicalShardingPlanner(topology=_topology(device_type, memory), batch_size=BATCH,
                                       constraints=_constraints(forced))


def _types(plan: ShardingPlan) -> Dict[str, str]:
    return {t: ps.sharding_type for mp in plan.plan.values() for t, ps in mp.items()}


# ---------------------------------------------------------------------- single process


def test_plan_covers_every_table_and_respects_memory():
    planner = _planner()
    plan = planner.plan(V.ValidationModel(torch.device("meta")), T.default_sharders())
    assert set(plan.plan) == {"ebc", "ec"}
    assert set(_types(plan)) == {t.name for t in V.validation_tables()}
    ex = planner.explain()
    assert ex.cost.peak_memory <= MEMORY * 0.85  # the default 15% reservation
    # 600 kB per device: "big" (4000 x 8 fp32 = 128 kB, twice with its dense gradient, and the
    # buffers of 64-sample batches) cannot be data parallel
    assert _types(plan)["big"] != "data_parallel"


def test_forced_constraints_are_honoured():
    for forced in FORCED.values():
        plan = _planner(forced=forced).plan(V.ValidationModel(torch.device("meta")),
                                            T.default_sharders())
        assert _types(plan) == forced


def test_plan_logs_and_warns_nothing(caplog):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with caplog.at_level(logging.WARNING):
            planner = _planner()
            planner.plan(V.ValidationModel(torch.device("meta")), T.default_sharders())
            planner.explain()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_accepts_a_torchrec_topology_and_the_environment(monkeypatch):
    model = V.ValidationModel(torch.device("meta"))
    topo = _topology().to_torchrec()
    a = HierarchicalShardingPlanner(topology=topo, batch_size=BATCH, constraints=_constraints())
    b = _planner()
    assert plan_digest(a.plan(model, T.default_sharders())) == \
        plan_digest(b.plan(model, T.default_sharders()))
    assert a.topology.hosts == 2 and a.topology.devices_per_host == 2
    # a TorchRec Topology without local_world_size is one host
    one = HierarchicalShardingPlanner(topology=Topology(world_size=4, compute_device="cpu"),
                                      batch_size=BATCH, constraints=_constraints())
    assert one.topology.hosts == 1 and one.topology.devices_per_host == 4
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    env = HierarchicalShardingPlanner(constraints=_constraints())
    assert (env.topology.hosts, env.topology.devices_per_host) == (2, 4)


def test_infeasible_plan_names_table_and_memory():
    planner = _planner(memory=60_000)
    with pytest.raises(HierarchicalPlannerError) as info:
        planner.plan(V.ValidationModel(torch.device("meta")), T.default_sharders())
    msg = str(info.value)
    assert isinstance(info.value, PlannerError)
    assert "needs" in msg and "free" in msg and "bytes" in msg
    assert any(f"'{t}'" in msg for t in ("ebc.big", "ec.item", "ebc.user"))


def test_bad_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        HierarchicalShardingPlanner(topology=_topology(), batch_size=0)
    with pytest.raises(ValueError, match="topology"):
        HierarchicalShardingPlanner(topology="2x8")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="objective"):
        HierarchicalShardingPlanner(topology=_topology(), objective="cheap")


def test_placed_tables_needs_a_plan():
    with pytest.raises(ValueError, match="plan"):
        _planner().placed_tables()


# ---------------------------------------------------------------------- world 4


def _initial_state() -> Dict[str, torch.Tensor]:
    with torch.random.fork_rng():
        torch.manual_seed(11)
        model = V.ValidationModel(torch.device("cpu"))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _gloo_worker(rank: int, world: int) -> dict:
    device = torch.device("cpu")
    model = V.ValidationModel(torch.device("meta"))
    out: dict = {}
    for name, forced in [("ours", None)] + list(FORCED.items()):
        planner = _planner(forced=forced)
        plan = planner.collective_plan(model, T.default_sharders(),
                                       torch.distributed.GroupMember.WORLD)
        with W.fbgemm_cpu_kernels(_types(plan)):  # fbgemm-cpu 1.8 cannot run DP sequences
            res = V.train_planned(plan, device, STEPS, BATCH,
                                  init=lambda dmp: W.load_global(dmp, _initial_state()))
        res["digest"] = plan_digest(plan)
        res["types"] = _types(plan)
        res["estimate"] = planner.explain(plan).cost
        out[name] = res
        torch.distributed.barrier()
    errors = []
    for memory in (60_000,):  # infeasible: every rank must raise, none may hang
        try:
            _planner(memory=memory).collective_plan(model, T.default_sharders())
        except HierarchicalPlannerError as e:
            errors.append(str(e))
    out["errors"] = errors
    out["raw_collectives"] = count_raw_collectives(rank, world)
    return out


def _npu_worker(rank: int, world: int) -> dict:
    device = rank_device("npu", int(os.environ["LOCAL_RANK"]))
    planner = _planner(device_type="npu")
    plan = planner.collective_plan(V.ValidationModel(torch.device("meta")), T.default_sharders())
    res = V.train_planned(plan, device, STEPS, BATCH, count=False,
                          init=lambda dmp: W.load_global(dmp, _initial_state()))
    res["types"] = _types(plan)
    return res


@pytest.fixture(scope="module")
def gloo_runs() -> List[dict]:
    return run_multiprocess(_gloo_worker, 4, local_world_size=2)


def _reference(world: int, steps: int = STEPS) -> dict:
    """The unsharded model on every rank's batches: losses per rank and step, final weights.
    Every parameter steps with the mean of the ranks' gradients: DDP averages the head and the
    data-parallel tables, TorchRec's all-to-all backward divides the sharded tables' gradients
    by the world size (``torchrec.distributed.comm_ops`` gradient division, on by default)."""
    model = V.ValidationModel(torch.device("cpu"))
    model.load_state_dict(_initial_state())
    losses = [[] for _ in range(world)]
    for step in range(steps):
        model.zero_grad()
        total = 0.0
        for r in range(world):
            loss = model(V.make_batch(r, step, BATCH))
            losses[r].append(float(loss.detach()))
            total = total + loss
        total.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= V.LR * p.grad / world
    return {"losses": losses, "state": {k: v.detach() for k, v in model.state_dict().items()}}


def _check_against_reference(per_rank: List[dict], where: str) -> None:
    world = len(per_rank)
    ref = _reference(world)
    init = _initial_state()
    for r, res in enumerate(per_rank):
        torch.testing.assert_close(torch.tensor(res["losses"]), torch.tensor(ref["losses"][r]),
                                   atol=ATOL, rtol=RTOL, msg=f"{where} rank {r} losses")
        for key, pieces in res["shards"].items():
            for offsets, t in pieces:
                sl = tuple(slice(o, o + n) for o, n in zip(offsets, t.shape))
                torch.testing.assert_close(t, ref["state"][key][sl], atol=ATOL, rtol=RTOL,
                                           msg=f"{where} rank {r} {key} {offsets}")
    for k in ref["state"]:  # every table moves well beyond the tolerance
        moved = float((ref["state"][k] - init[k]).abs().max())
        assert moved > 20 * ATOL, f"{where}: training moved {k} by only {moved}"


@pytest.mark.slow
def test_collective_plan_is_the_single_process_plan_on_every_rank(gloo_runs):
    model = V.ValidationModel(torch.device("meta"))
    for name, forced in [("ours", None)] + list(FORCED.items()):
        expected = plan_digest(_planner(forced=forced).plan(model, T.default_sharders()))
        assert [r[name]["digest"] for r in gloo_runs] == [expected] * 4, name


@pytest.mark.slow
def test_comm_counter_counts_what_each_collective_sends(gloo_runs):
    check_raw_collectives([r["raw_collectives"] for r in gloo_runs])


@pytest.mark.slow
def test_infeasible_collective_plan_raises_on_every_rank(gloo_runs):
    for r in gloo_runs:
        assert len(r["errors"]) == 1
        assert "needs" in r["errors"][0] and "free" in r["errors"][0]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ours"] + list(FORCED))
def test_planned_model_matches_unsharded_gloo(gloo_runs, name):
    _check_against_reference([r[name] for r in gloo_runs], f"gloo/{name}")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ours"] + list(FORCED))
def test_estimated_bytes_match_the_collectives(gloo_runs, name):
    topo = _topology()
    measured = V.measured_matrix([r[name]["comm"] for r in gloo_runs], topo) / STEPS
    result = V.compare(gloo_runs[0][name]["estimate"], measured)
    assert result["intra_measured"] > 0 and result["inter_measured"] > 0, result
    assert result["error"] <= 0.20, result


def test_every_sharding_type_is_exercised():
    types = set()
    for forced in FORCED.values():
        types |= set(forced.values())
    assert types == {"table_wise", "row_wise", "column_wise", "table_row_wise", "grid_shard",
                     "data_parallel"}


@pytest.mark.slow
@pytest.mark.skipif(not (_device.torch_npu_available() or simulated_npu.available()),
                    reason="needs torch_npu or the built simulated npu")
def test_planned_model_matches_unsharded_npu():
    runs = run_multiprocess(_npu_worker, 4, local_world_size=2, device_type="npu")
    _check_against_reference(runs, "npu/ours")
