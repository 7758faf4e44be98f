"""TorchRec's device gates (torchrec_ascend.distributed.gates): open, idempotent, each one doing
what docs/integration.md says.  Single process, no device needed."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

pytest.importorskip("torchrec")

import torchrec_ascend  # noqa: E402,F401  (opens the gates)
from torchrec_ascend.distributed import gates  # noqa: E402

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "integration.md")


def test_every_gate_is_open():
    assert gates.gate_status() == {g.name: "open" for g in gates.GATES}


def test_open_gates_is_idempotent():
    from torchrec.distributed.embedding_types import BaseEmbeddingSharder
    from torchrec.distributed.planner.types import Topology
    from torchrec.distributed.train_pipeline import train_pipelines as tp

    before = (Topology.__init__, BaseEmbeddingSharder.sharding_types,
              tp.TrainPipelineSemiSync.__init__)
    for _ in range(2):
        assert set(gates.open_gates().values()) == {"open"}
    after = (Topology.__init__, BaseEmbeddingSharder.sharding_types,
             tp.TrainPipelineSemiSync.__init__)
    assert before == after
    for fn in after:  # one wrapper around TorchRec's own function, never a wrapper of a wrapper
        assert gates.is_patched(fn)
        assert not gates.is_patched(fn.__wrapped__)


def test_topology_accepts_npu_like_cuda():
    from torchrec.distributed.planner.types import Topology

    npu = Topology(world_size=2, compute_device="npu", hbm_cap=1 << 30)
    cuda = Topology(world_size=2, compute_device="cuda", hbm_cap=1 << 30)
    assert npu.compute_device == "npu"
    assert [d.storage.hbm for d in npu.devices] == [d.storage.hbm for d in cuda.devices]
    with pytest.raises(AssertionError):  # other unknown names stay refused
        Topology(world_size=2, compute_device="tpu")


def test_placement_and_bandwidth_on_npu():
    from torchrec.distributed import sharding_plan
    from torchrec.distributed.planner import constants
    from torchrec.distributed.planner import planners
    from torchrec.distributed.planner.estimator import types as estimator_types

    assert sharding_plan.placement("npu", 3, 2) == "rank:3/npu:1"
    assert sharding_plan.placement("cpu", 3, 2) == "rank:3/cpu"
    assert planners.placement is sharding_plan.placement  # the by-name import is rebound too
    assert estimator_types.kernel_bw_lookup is constants.kernel_bw_lookup
    bw = dict(compute_kernel="fused", hbm_mem_bw=1.0, ddr_mem_bw=2.0, hbm_to_ddr_mem_bw=3.0)
    assert constants.kernel_bw_lookup("npu", **bw) == constants.kernel_bw_lookup("cuda", **bw)


@pytest.mark.parametrize("device", ["npu", "cpu"])
def test_sharders_offer_row_wise_family(device):
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    ebc = EmbeddingBagCollectionSharder().sharding_types(device)
    for t in ("data_parallel", "table_wise", "column_wise", "table_column_wise",
              "row_wise", "table_row_wise", "grid_shard"):
        assert t in ebc, (device, t)
    assert len(ebc) == len(set(ebc))
    ec = EmbeddingCollectionSharder().sharding_types(device)  # EC has no TWRW/GRID in 1.8
    assert {"data_parallel", "table_wise", "column_wise", "row_wise"} <= set(ec)
    assert "table_row_wise" not in EmbeddingBagCollectionSharder().sharding_types("mps")


def test_cpu_pipelines_have_no_streams_and_semi_sync_forwards_on_cpu():
    from torchrec.distributed.train_pipeline.runtime_forwards import BaseForward

    fwd = BaseForward("m", None, torch.nn.Identity(), None, None)
    assert fwd._device == torch.device("cpu")


def test_a_foreign_torchrec_version_warns(monkeypatch):
    import torchrec

    monkeypatch.setattr(gates, "_STATUS", {})  # as if never opened (the gates stay marked)
    monkeypatch.setattr(torchrec, "__version__", "9.9.0", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status = gates.open_gates()
    assert any("torchrec 1.8" in str(w.message) for w in caught)
    assert set(status.values()) == {"open"}


def test_a_missing_target_is_reported_not_raised(monkeypatch):
    def broken():
        raise AttributeError("no such function in this torchrec")

    gate = gates.Gate("broken", "torchrec/x.py", "x", "test", broken)
    monkeypatch.setattr(gates, "GATES", gates.GATES + [gate])
    monkeypatch.setattr(gates, "_STATUS", {})
    with pytest.warns(UserWarning, match="broken"):
        status = gates.open_gates()
    assert status["broken"].startswith("failed: AttributeError")
    assert all(v == "open" for k, v in status.items() if k != "broken")


def test_docs_list_every_gate_with_its_torchrec_file():
    with open(DOC, encoding="utf-8") as fh:
        doc = fh.read()
    for g in gates.GATES:
        assert f"`{g.name}`" in doc, g.name
        assert g.torchrec_file in doc, g.torchrec_file
