"""npu kernels of fbgemm's TBE plumbing (torchrec_ascend.distributed.fbgemm_tbe_npu), on the simulated
npu: get_infos_metadata equals fbgemm's CPU kernel; fbgemm's own TBE module (what TorchRec's
FUSED kernel runs on npu) trains on npu like on cpu; unsupported arguments are refused."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("fbgemm_gpu")

import torchrec_ascend  # noqa: E402,F401
from torchrec_ascend import device as _device  # noqa: E402
from torchrec_ascend.distributed import fbgemm_tbe_npu as embedding_npu  # noqa: E402
from torchrec_ascend.testing import simulated_npu  # noqa: E402


def test_infos_metadata_equals_fbgemm_cpu():
    cases = [(1, 1), (6, 3), (7, 4), (2**26 - 1, 63), (10, 64), (10, 1000), (2**20, 100),
             (2**31 - 1, 1), (2**25 - 1, 127)]
    gen = torch.Generator().manual_seed(0)
    cases += [(int(torch.randint(1, 2**20, (1,), generator=gen)), int(torch.randint(1, 2**11, (1,), generator=gen)))
              for _ in range(20)]
    for B, T in cases:
        want = torch.ops.fbgemm.get_infos_metadata(torch.empty(0), B, T)
        assert embedding_npu.infos_metadata(B, T) == tuple(want), (B, T)


@pytest.mark.parametrize("B,T,arg", [(0, 3, "B"), (4, 0, "T"), (-1, 2, "B"), (2**26, 64, "B")])
def test_infos_metadata_bad_input(B, T, arg):
    with pytest.raises(ValueError, match=f"^{arg}:"):
        embedding_npu.infos_metadata(B, T)


needs_sim = pytest.mark.skipif(
    _device.torch_npu_available() or not simulated_npu.available(),
    reason="simulated npu: needs no torch_npu and the built torchrec_ascend._simnpu")


def _tbe(device, optimizer, pooling):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)

    # what TorchRec builds on a device without cuda/mtia: CPU mode, HOST placement
    opt = {"sgd": EmbOptimType.EXACT_SGD, "adagrad": EmbOptimType.EXACT_ADAGRAD,
           "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD}[optimizer]
    dims = [4, 4] if pooling == "none" else [4, 8]
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(11, dims[0], EmbeddingLocation.HOST, ComputeDevice.CPU),
         (7, dims[1], EmbeddingLocation.HOST, ComputeDevice.CPU)],
        optimizer=opt, learning_rate=0.3, eps=0.01, device=device,
        pooling_mode={"sum": PoolingMode.SUM, "mean": PoolingMode.MEAN, "none": PoolingMode.NONE}[pooling])
    with torch.no_grad():
        g = torch.Generator().manual_seed(3)
        for w in tbe.split_embedding_weights():
            w.copy_(torch.randn(w.shape, generator=g).to(w.device))
    return tbe


@needs_sim
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
@pytest.mark.parametrize("pooling", ["sum", "mean", "none"])
def test_fbgemm_tbe_trains_on_npu_like_cpu(optimizer, pooling):
    """Forward, fused backward + optimizer, 3 steps; lengths 0, 1 and the max. Tolerance 1e-5."""
    assert simulated_npu.enable()
    npu = torch.device("npu", 0)
    cpu_tbe, npu_tbe = _tbe(torch.device("cpu"), optimizer, pooling), _tbe(npu, optimizer, pooling)
    gen = torch.Generator().manual_seed(5)
    for step in range(3):
        lengths = torch.randint(0, 4, (2 * 5,), generator=gen)
        lengths[0], lengths[1], lengths[-1] = 0, 1, 3
        n0 = int(lengths[:5].sum())
        indices = torch.cat([torch.randint(0, 11, (n0,), generator=gen),
                             torch.randint(0, 7, (int(lengths.sum()) - n0,), generator=gen)])
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        want = cpu_tbe(indices, offsets)
        got = npu_tbe(indices.to(npu), offsets.to(npu))
        assert got.device.type == "npu"
        torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)
        up = torch.randn(want.shape, generator=gen)
        (want * up).sum().backward()
        (got * up.to(npu)).sum().backward()
    for a, b in zip(npu_tbe.split_embedding_weights(), cpu_tbe.split_embedding_weights()):
        torch.testing.assert_close(a.cpu(), b, atol=1e-5, rtol=1e-5)
    if optimizer != "sgd":
        for a, b in zip(npu_tbe.split_optimizer_states(), cpu_tbe.split_optimizer_states()):
            torch.testing.assert_close(a[0].cpu(), b[0], atol=1e-5, rtol=1e-5)


@needs_sim
def test_lookup_refuses_what_it_cannot_do():
    assert simulated_npu.enable()
    npu = torch.device("npu", 0)
    tbe = _tbe(npu, "sgd", "sum")
    indices, offsets = torch.tensor([1, 2], device=npu), torch.tensor([0, 1, 2], device=npu)
    with pytest.raises(ValueError, match="^feature_requires_grad:"):
        tbe(indices, offsets, feature_requires_grad=torch.ones(2, device=npu, dtype=torch.int))
    with pytest.raises(ValueError, match="^aux_int:"):
        embedding_npu.lookup_pt2("sgd", None, [], None, 0, 0, None, 0, indices, offsets, 0, None,
                                 None, 0, [None] * 7, [0, 1], [0.0, 0.0], [False] * 7)



def test_placements_checked_once_per_version():
    """A table's placements are read to the host on first use and again only after an
    in-place change; a placement we cannot address is refused either way."""
    host = torch.zeros(4)
    offsets = torch.tensor([0])
    placements = torch.tensor([embedding_npu._PLACEMENT_HOST])
    embedding_npu._unpack_table("weights", [host, placements, offsets])
    assert id(placements) in embedding_npu._CHECKED_PLACEMENTS
    embedding_npu._unpack_table("weights", [host, placements, offsets])  # cached
    placements.fill_(2)  # UVM_CACHING: bumps the version
    with pytest.raises(ValueError, match=r"^weights: placements \[2\] are not supported"):
        embedding_npu._unpack_table("weights", [host, placements, offsets])
    with pytest.raises(ValueError, match=r"^weights: placements \[1\] are not supported"):
        embedding_npu._unpack_table("weights", [host, torch.tensor([1]), offsets])
