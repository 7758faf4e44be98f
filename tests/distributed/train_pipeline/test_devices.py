"""The pipelines on ``npu`` (the real device with torch_npu, the simulated one without).

One 2-rank gloo run on npu: TorchRec's DMP + TrainPipelineSparseDist (checked against cpu with
fbgemm's kernels by tests/distributed/test_npu_training.py) is the reference for our
staleness-0 pipelines; semi_async with staleness 1 must read version ``max(j - 1, 0)`` for
batch ``j`` (from the weights) and every weight lives on npu.  The batch copy runs on the
prefetch thread's npu side stream.  Tolerance as in test_semi_async.py.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchrec")

from torchrec_ascend import device as _device  # noqa: E402
from torchrec_ascend.testing import pipeline_workload as SW  # noqa: E402
from torchrec_ascend.testing import simulated_npu  # noqa: E402
from torchrec_ascend.testing.multiprocess import run_multiprocess  # noqa: E402

ATOL, RTOL = 1e-6, 1e-5
STEPS = 4
REF = ("torchrec", "torchrec_sparse_dist", 0, "row_wise", STEPS)
SYNC = [("ours", kind, 0, "row_wise", STEPS) for kind in ("sync", "sparse_dist", "semi_async")]
STALE1 = ("ours", "semi_async", 1, "row_wise", STEPS)
RUNS = [REF, *SYNC, STALE1]


@pytest.mark.slow
@pytest.mark.skipif(not (_device.torch_npu_available() or simulated_npu.available()),
                    reason="needs torch_npu or the built simulated npu (torchrec_ascend._simnpu)")
def test_pipelines_on_npu():
    results = run_multiprocess(SW.worker, 2, (RUNS, {"track_versions": True}, "npu"),
                               device_type="npu")
    for rank, per_run in enumerate(results):
        ref = per_run[0]
        for i, run in enumerate(RUNS):
            got = per_run[i]
            assert got["devices"] == ["npu"], (rank, run, got["devices"])
            assert len(got["losses"]) == STEPS, (rank, run)
        for run in SYNC:
            got = per_run[RUNS.index(run)]
            torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(ref["losses"]),
                                       atol=ATOL, rtol=RTOL, msg=f"rank{rank} {run[1]} losses")
            for key, pieces in ref["state"].items():
                for (o, want), (o2, have) in zip(pieces, got["state"][key]):
                    assert o == o2
                    torch.testing.assert_close(have, want, atol=ATOL, rtol=RTOL,
                                               msg=f"rank{rank} {run[1]} {key}")
        stale = per_run[RUNS.index(STALE1)]
        assert stale["distinct"]
        assert stale["staleness"] == {j: min(j, 1) for j in range(STEPS)}, rank
