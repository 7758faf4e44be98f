"""The simulated npu refuses fbgemm ops we did not register: TorchRec code on npu runs on our
kernels, and fails with the clear error when one of them is removed.  (Simulation only: with
torch_npu present these tests skip; the real device is tested by the multi-process tests.)"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchrec")

import torchrec_ascend  # noqa: E402,F401
from torchrec_ascend import device as _device  # noqa: E402
from torchrec_ascend.testing import simulated_npu  # noqa: E402

pytestmark = pytest.mark.skipif(
    _device.torch_npu_available() or not simulated_npu.available(),
    reason="simulated npu: needs no torch_npu and the built torchrec_ascend._simnpu")


@pytest.fixture(scope="module")
def npu():
    assert simulated_npu.enable()
    return torch.device("npu", 0)


def _kjt(dev):
    from torchrec import KeyedJaggedTensor

    return KeyedJaggedTensor(keys=["a", "b", "c"], values=torch.arange(7, device=dev),
                             lengths=torch.tensor([2, 0, 1, 3, 1, 0], device=dev))


def test_torchrec_kjt_permute_on_npu_matches_cpu(npu):
    got = _kjt(npu).permute([2, 0, 1])
    want = _kjt(torch.device("cpu")).permute([2, 0, 1])
    assert got.values().device.type == "npu"
    assert torch.equal(got.values().cpu(), want.values())
    assert torch.equal(got.lengths().cpu(), want.lengths())


def test_removing_our_kernel_fails_with_the_clear_error(npu):
    with simulated_npu.without_kernel("fbgemm::permute_2D_sparse_data"):
        with pytest.raises(NotImplementedError, match="no npu kernel for fbgemm::permute_2D_sparse_data"):
            _kjt(npu).permute([2, 0, 1])
    _kjt(npu).permute([2, 0, 1])  # restored


def test_an_unregistered_fbgemm_op_is_refused_not_run_on_cpu(npu):
    # fbgemm's TBE constructor calls it; without our npu kernel it must not run fbgemm's CPU one
    with simulated_npu.without_kernel("fbgemm::get_infos_metadata"):
        with pytest.raises(NotImplementedError, match="no npu kernel for fbgemm::get_infos_metadata"):
            torch.ops.fbgemm.get_infos_metadata(torch.empty(0, device=npu), 4, 2)
    assert torch.ops.fbgemm.get_infos_metadata(torch.empty(0, device=npu), 4, 2) == \
        torch.ops.fbgemm.get_infos_metadata(torch.empty(0), 4, 2)
