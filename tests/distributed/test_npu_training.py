"""Issue #4 acceptance: TorchRec on device "npu" trains like TorchRec on cpu with fbgemm's kernels.

The user code is :mod:`torchrec_ascend.testing.torchrec_workload`: plain TorchRec
(EmbeddingBagCollection + EmbeddingCollection + dense part, EmbeddingShardingPlanner,
DistributedModelParallel, TorchRec's train pipelines) plus one ``import torchrec_ascend``; the
device is its only argument.  On npu (the real device with torch_npu, the simulated one without:
fbgemm ops served only by our PrivateUse1 kernels) it trains 4 steps under table_wise, row_wise,
column_wise, data_parallel (world 2) and table_row_wise (world 4, LOCAL_WORLD_SIZE=2), through
TrainPipelineSparseDist and TrainPipelineSemiSync (world 2 also TrainPipelineBase and
TrainPipelineFusedSparseDist, and DistributedModelParallel(device=npu) with no plan given); the
same runs on cpu with fbgemm's kernels
are the reference (semi-sync against semi-sync: its lookups run one step ahead of the update).

Tolerance: 1e-6 absolute + 1e-5 relative on every loss and every embedding weight (fp32;
measured: losses equal, weights within 7.5e-9).
"""

from __future__ import annotations

import contextlib
import os
from typing import List, Optional, Sequence, Tuple

import pytest
import torch

pytest.importorskip("torchrec")

import torchrec_ascend  # noqa: E402,F401
from torchrec_ascend import device as _device  # noqa: E402
from torchrec_ascend.testing import simulated_npu  # noqa: E402
from torchrec_ascend.testing import torchrec_workload as W  # noqa: E402
from torchrec_ascend.testing.multiprocess import rank_device, run_multiprocess  # noqa: E402

PIPELINES = ("sparse_dist", "semi_sync")
ALL_PIPELINES = ("base", "sparse_dist", "semi_sync", "fused_sparse_dist")  # world 2 runs them all
STEPS = 4
ATOL, RTOL = 1e-6, 1e-5

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (_device.torch_npu_available() or simulated_npu.available()),
                       reason="needs torch_npu or the built simulated npu (torchrec_ascend._simnpu)"),
]


Run = Tuple[Optional[W.Sharding], str]  # (sharding; None = DMP without a plan, pipeline)


def _worker(rank: int, world_size: int, device_type: str, runs: Sequence[Run]) -> List[dict]:
    """Train every (sharding, pipeline) of ``runs``, in order."""
    device = rank_device(device_type, int(os.environ["LOCAL_RANK"]))
    out = []
    for sharding, pipeline in runs:
        ctx = W.fbgemm_cpu_kernels(sharding) if device_type == "cpu" else contextlib.nullcontext()
        with ctx:
            out.append(W.train(device, sharding, pipeline, STEPS))
        torch.distributed.barrier()
    return out


def _run_and_compare(world: int, runs: Sequence[Run]) -> None:
    npu = run_multiprocess(_worker, world, ("npu", runs), local_world_size=2, device_type="npu")
    # the cpu reference of a run without a plan uses the plan DMP made for the npu topology
    cpu_runs = [(s if s is not None else npu[0][i]["sharding_types"], p)
                for i, (s, p) in enumerate(runs)]
    cpu = run_multiprocess(_worker, world, ("cpu", cpu_runs), local_world_size=2)
    init = W.initial_state()
    for i, (sharding, pipeline) in enumerate(runs):
        where = f"{sharding or 'no plan'}/{pipeline}"
        for rank, (n, c) in enumerate(zip(npu, cpu)):
            n, c = n[i], c[i]
            assert n["devices"] == ["npu"], (where, rank, n["devices"])
            assert n["sharding_types"] == c["sharding_types"], where
            assert len(n["losses"]) == STEPS, where
            torch.testing.assert_close(torch.tensor(n["losses"]), torch.tensor(c["losses"]),
                                       atol=ATOL, rtol=RTOL, msg=f"{where} rank{rank} losses")
        got, want = W.assemble([r[i] for r in npu]), W.assemble([r[i] for r in cpu])
        assert max(float((want[k] - init[k]).abs().max()) for k in want) > 1e-4, \
            f"{where}: training did not move the tables"
        for k in want:
            assert not torch.isnan(want[k]).any(), (where, k)
            torch.testing.assert_close(got[k], want[k], atol=ATOL, rtol=RTOL, msg=f"{where} {k}")


def test_npu_training_world2_matches_cpu_fbgemm():
    """Every sharding type x every pipeline, and DistributedModelParallel(device=npu) without a
    plan (DMP plans itself for the npu topology)."""
    shardings = ("table_wise", "row_wise", "column_wise", "data_parallel")
    runs = [(s, p) for s in shardings for p in ALL_PIPELINES] + [(None, "sparse_dist")]
    _run_and_compare(2, runs)


def test_npu_training_table_row_wise_world4_matches_cpu_fbgemm():
    _run_and_compare(4, [("table_row_wise", p) for p in PIPELINES])


def _failing_worker(rank: int, world_size: int) -> None:
    """A table_wise npu run with our npu kernel of permute_2D_sparse_data removed."""
    with simulated_npu.without_kernel("fbgemm::permute_2D_sparse_data"):
        W.train(rank_device("npu", int(os.environ["LOCAL_RANK"])), "table_wise", "sparse_dist", 1)


@pytest.mark.skipif(_device.torch_npu_available(), reason="simulated npu only")
def test_npu_training_fails_clearly_without_one_of_our_kernels():
    with pytest.raises(Exception, match="no npu kernel for fbgemm::permute_2D_sparse_data"):
        run_multiprocess(_failing_worker, 2, device_type="npu")
