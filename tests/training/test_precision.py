"""train.precision -> compute dtype: fixed choices, ``auto`` following the device's measured
GEMM choice (forced here through TORCHREC_ASCEND_GEMM_DTYPE, so the test does not depend on
this machine's timing), bad names rejected."""

from __future__ import annotations

import pytest
import torch

from torchrec_ascend import device as _device
from torchrec_ascend.training.precision import PRECISIONS, resolve_precision

CPU = torch.device("cpu")


def test_fixed_choices():
    assert resolve_precision("fp32", CPU)[0] == torch.float32
    assert resolve_precision("bf16", CPU)[0] == torch.bfloat16
    assert PRECISIONS == ("auto", "fp32", "bf16")


@pytest.mark.parametrize("forced,want", [("bfloat16", torch.bfloat16), ("float32", torch.float32),
                                         ("float16", torch.float32)])
def test_auto_follows_the_measured_choice(monkeypatch, forced, want):
    monkeypatch.setenv(_device.ENV_GEMM_DTYPE, forced)
    dtype, why = resolve_precision("auto", CPU)
    assert dtype == want and why.startswith("train.precision=auto: ")


def test_auto_on_cuda_is_bf16(monkeypatch):
    # npu / cuda have bf16 units: chosen without a measurement (none is possible here)
    monkeypatch.delenv(_device.ENV_GEMM_DTYPE, raising=False)
    dtype, why = resolve_precision("auto", torch.device("cuda"))
    assert dtype == torch.bfloat16 and "cuda" in why


def test_bad_name():
    with pytest.raises(ValueError, match=r"precision: 'half' is not one of \['auto', 'fp32', 'bf16'\]"):
        resolve_precision("half", CPU)
