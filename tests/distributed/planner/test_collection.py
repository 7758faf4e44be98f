"""2-D plans execute (torchrec_ascend.distributed.planner.collection): world 4 (2 hosts x 2,
LOCAL_WORLD_SIZE=2, gloo), TorchRec's DMPCollection built from TwoDimShardingPlanner's plan
(each host one sharding group, replicas across hosts), the validation model trained 3 steps.

* sync every step (our plan): equal to an unsharded float32 model whose every parameter steps
  with the mean of the four ranks' gradients (1-D data-parallel-averaged training): TorchRec
  divides a sharded table's gradient by the sharding group's size (2), the sync averages the
  two hosts' replicas, so SGD steps with the world mean.
* the bytes the collectives moved (sync every step) match the replicated cost model's
  estimate within 20% on intra- and inter-host links;
* the same sync-every-step check on the simulated npu (its gloo-based backend);
* sync every 2 steps (a forced plan: column-, row-, table-wise and data parallel, every type the
  2-D planner offers): equal to a float32
  replay of the algorithm (one unsharded model per host; tables sharded in the host step with
  their host's mean gradient, the head and data-parallel tables with the world mean; replicas
  averaged after step 2) and measurably different from the sync-every-step result: replicas
  drift between syncs;
* the same with ``merge="sum"``: equal to the replay whose merge adds the hosts' changes since
  the start to the start's values, and measurably different from the averaging replay.

Tolerance atol 1e-5 / rtol 1e-4 (float32; the sharded run sums gradients and averages replicas
in another order than the replay; training moves every table by > 20 x atol).
"""

from __future__ import annotations

from typing import Dict, List

import os

import pytest
import torch

pytest.importorskip("torchrec")

import torchrec_ascend  # noqa: E402,F401
from torchrec_ascend.distributed.planner import tables as T  # noqa: E402
from torchrec_ascend.distributed.planner import collective_bytes as V  # noqa: E402
from torchrec_ascend.distributed.planner.collection import (  # noqa: E402
    TwoDimModelParallel, two_dim_model)
from torchrec_ascend.distributed.planner.two_dim import TwoDimShardingPlanner  # noqa: E402
from torchrec_ascend import device as _device  # noqa: E402
from torchrec_ascend.testing import simulated_npu  # noqa: E402
from torchrec_ascend.testing import torchrec_workload as W  # noqa: E402
from torchrec_ascend.testing.multiprocess import rank_device, run_multiprocess  # noqa: E402

from test_planners import _initial_state, _reference  # noqa: E402

STEPS = 3
L = 2
ATOL, RTOL = 1e-5, 1e-4
FORCED = {"user": "column_wise", "hot": "data_parallel", "big": "row_wise", "item": "table_wise",
          "tag": "row_wise"}
RUNS = {"ours_sync1": (None, 1, "mean"), "forced_sync2": (FORCED, 2, "mean"),
        "forced_sync2_sum": (FORCED, 2, "sum")}


def _types(plan) -> Dict[str, str]:
    return {t: ps.sharding_type for mp in plan.plan.values() for t, ps in mp.items()}


def _worker(rank: int, world: int) -> dict:
    out = {}
    for name, (forced, sync_every, merge) in RUNS.items():
        planner = TwoDimShardingPlanner(topology=V.validation_topology(),
                                        batch_size=V.VALIDATION_BATCH,
                                        constraints=V.validation_constraints(forced),
                                        sync_every=sync_every)
        model = V.ValidationModel(torch.device("meta"))
        plan = planner.collective_plan(model, T.default_sharders())
        types = _types(plan)
        syncs: List[bool] = []

        def wrap(m, p, sharders):
            dmp = two_dim_model(m, planner, torch.device("cpu"), sharders, plan=p, merge=merge)
            assert isinstance(dmp, TwoDimModelParallel)
            done = dmp.step_done
            dmp.step_done = lambda: syncs.append(done())  # type: ignore[method-assign]
            return dmp

        with W.fbgemm_cpu_kernels(types):  # fbgemm-cpu 1.8 cannot run DP sequences
            res = V.train_planned(plan, torch.device("cpu"), STEPS, V.VALIDATION_BATCH,
                                  count=sync_every == 1, wrap=wrap,
                                  init=lambda dmp: V.load_state(dmp, _initial_state()))
        res["types"], res["syncs"] = types, syncs
        res["estimate"] = planner.explain(plan).cost
        out[name] = res
        torch.distributed.barrier()
    return out


@pytest.fixture(scope="module")
def runs() -> List[dict]:
    return run_multiprocess(_worker, 4, local_world_size=L)


def _mean_gradient_reference(world: int) -> dict:
    """One unsharded model; every parameter steps with the mean of the ranks' gradients
    (test_planners' reference of 1-D training), the final state for every host."""
    ref = _reference(world, STEPS)
    return {"losses": ref["losses"], "states": [ref["state"]] * (world // L)}


def _two_dim_replay(world: int, types: Dict[str, str], sync_every: int,
                    merge: str = "mean") -> dict:
    """One unsharded model per host: tables sharded in the host step with the mean gradient of
    the host's ranks, the head and data-parallel tables with the world's mean; every
    ``sync_every`` steps the sharded tables are merged over the hosts: averaged (``mean``), or
    their value at the last merge plus the sum of the hosts' changes since (``sum``)."""
    H = world // L
    models = []
    for _ in range(H):
        m = V.ValidationModel(torch.device("cpu"))
        m.load_state_dict(_initial_state())
        models.append(m)
    names = [n for n, _ in models[0].named_parameters()]

    def sharded(name: str) -> bool:
        parts = name.split(".")
        return parts[0] in ("ebc", "ec") and types[parts[2]] != "data_parallel"

    anchors = {n: p.detach().clone() for n, p in models[0].named_parameters() if sharded(n)}
    losses = [[] for _ in range(world)]
    for step in range(STEPS):
        for h, m in enumerate(models):
            m.zero_grad()
            total = 0.0
            for r in range(h * L, (h + 1) * L):
                loss = m(V.make_batch(r, step, V.VALIDATION_BATCH))
                losses[r].append(float(loss.detach()))
                total = total + loss
            total.backward()
        params = [dict(m.named_parameters()) for m in models]
        with torch.no_grad():
            for n in names:
                if sharded(n):
                    for p in params:
                        p[n] -= V.LR * p[n].grad / L
                else:
                    g = sum(p[n].grad for p in params) / world
                    for p in params:
                        p[n] -= V.LR * g
            if (step + 1) % sync_every == 0:
                for n in names:
                    if sharded(n):
                        if merge == "sum":
                            merged = anchors[n] + sum(p[n] - anchors[n] for p in params)
                        else:
                            merged = sum(p[n] for p in params) / H
                        anchors[n] = merged.clone()
                        for p in params:
                            p[n].copy_(merged)
    return {"losses": losses,
            "states": [{k: v.detach() for k, v in m.state_dict().items()} for m in models]}


def _check(per_rank: List[dict], ref: dict, where: str) -> None:
    init = _initial_state()
    for r, res in enumerate(per_rank):
        torch.testing.assert_close(torch.tensor(res["losses"]), torch.tensor(ref["losses"][r]),
                                   atol=ATOL, rtol=RTOL, msg=f"{where} rank {r} losses")
        state = ref["states"][r // L]
        for key, pieces in res["shards"].items():
            for offsets, t in pieces:
                sl = tuple(slice(o, o + n) for o, n in zip(offsets, t.shape))
                torch.testing.assert_close(t, state[key][sl], atol=ATOL, rtol=RTOL,
                                           msg=f"{where} rank {r} {key} {offsets}")
    for k in ref["states"][0]:
        moved = float((ref["states"][0][k] - init[k]).abs().max())
        assert moved > 20 * ATOL, f"{where}: training moved {k} by only {moved}"


@pytest.mark.slow
def test_plans_are_two_dimensional(runs):
    ours = runs[0]["ours_sync1"]["types"]
    assert any(t != "data_parallel" for t in ours.values()), ours
    assert runs[0]["forced_sync2"]["types"] == runs[0]["forced_sync2_sum"]["types"] == FORCED
    assert [r["ours_sync1"]["syncs"] for r in runs] == [[True] * STEPS] * 4
    for name in ("forced_sync2", "forced_sync2_sum"):
        assert [r[name]["syncs"] for r in runs] == [[False, True, False]] * 4


@pytest.mark.slow
def test_sync_every_step_matches_mean_gradient_training(runs):
    ref = _mean_gradient_reference(4)
    _check([r["ours_sync1"] for r in runs], ref, "sync1 vs unsharded mean-gradient")
    replay = _two_dim_replay(4, runs[0]["ours_sync1"]["types"], 1)
    _check([r["ours_sync1"] for r in runs], replay, "sync1 vs replay")


@pytest.mark.slow
def test_replicas_drift_between_syncs(runs):
    types = runs[0]["forced_sync2"]["types"]
    replay = _two_dim_replay(4, types, 2)
    _check([r["forced_sync2"] for r in runs], replay, "sync2 vs replay")
    # the algorithm differs from 1-D training: step 3 ran on unsynced replicas
    one_d = _mean_gradient_reference(4)
    gap = max(float((replay["states"][h][k] - one_d["states"][0][k]).abs().max())
              for h in range(2) for k in one_d["states"][0])
    hosts_gap = max(float((replay["states"][0][k] - replay["states"][1][k]).abs().max())
                    for k in one_d["states"][0])
    assert gap > 20 * ATOL and hosts_gap > 20 * ATOL, (gap, hosts_gap)


@pytest.mark.slow
def test_sum_merge_adds_the_replicas_changes(runs):
    """merge="sum": after step 2 every replica is its value at the start plus the sum of the
    two hosts' changes (then step 3 on unsynced replicas), not their average."""
    types = runs[0]["forced_sync2_sum"]["types"]
    summed = _two_dim_replay(4, types, 2, merge="sum")
    _check([r["forced_sync2_sum"] for r in runs], summed, "sync2 sum vs replay")
    averaged = _two_dim_replay(4, types, 2)
    gap = max(float((summed["states"][h][k] - averaged["states"][h][k]).abs().max())
              for h in range(2) for k in summed["states"][0])
    assert gap > 20 * ATOL, gap


@pytest.mark.slow
def test_estimated_bytes_match_the_collectives(runs):
    """The replicated cost model's bytes per step (sync every step) against what the
    collectives moved: all-to-alls inside each host, the replica sync and the data-parallel
    all-reduces across hosts."""
    topo = V.validation_topology()
    measured = V.measured_matrix([r["ours_sync1"]["comm"] for r in runs], topo) / STEPS
    result = V.compare(runs[0]["ours_sync1"]["estimate"], measured)
    assert result["intra_measured"] > 0 and result["inter_measured"] > 0, result
    assert result["error"] <= 0.20, result


def _npu_worker(rank: int, world: int) -> dict:
    device = rank_device("npu", int(os.environ["LOCAL_RANK"]))
    planner = TwoDimShardingPlanner(topology=V.validation_topology("npu"),
                                    batch_size=V.VALIDATION_BATCH,
                                    constraints=V.validation_constraints(), sync_every=1)
    plan = planner.collective_plan(V.ValidationModel(torch.device("meta")), T.default_sharders())
    res = V.train_planned(plan, device, STEPS, V.VALIDATION_BATCH, count=False,
                          wrap=lambda m, p, sh: two_dim_model(m, planner, device, sh, plan=p),
                          init=lambda dmp: V.load_state(dmp, _initial_state()))
    res["types"] = _types(plan)
    return res


@pytest.mark.slow
@pytest.mark.skipif(not (_device.torch_npu_available() or simulated_npu.available()),
                    reason="needs torch_npu or the built simulated npu")
def test_sync_every_step_matches_mean_gradient_training_npu():
    per_rank = run_multiprocess(_npu_worker, 4, local_world_size=L, device_type="npu")
    assert any(t != "data_parallel" for t in per_rank[0]["types"].values())
    _check(per_rank, _mean_gradient_reference(4), "npu sync1 vs unsharded mean-gradient")
