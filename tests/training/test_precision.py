"""train.precision -> compute dtype: fixed choices, ``auto`` following the device's measured
GEMM choice (forced here through TORCHREC_ASCEND_GEMM_DTYPE, so the test does not depend on
this machine's timing) and, on CPU, the measured layer step; bad names rejected."""

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


@pytest.mark.parametrize("step_faster", [True, False])
def test_auto_on_cpu_needs_the_whole_step_faster(monkeypatch, step_faster):
    """Where the bf16 GEMM is fast, auto still takes bf16 only if one HSTU layer step is faster
    in it (measured once; faked both ways here)."""
    from torchrec_ascend.training import precision

    monkeypatch.delenv(_device.ENV_GEMM_DTYPE, raising=False)
    monkeypatch.setattr(_device, "gemm_dtype_is_fast", lambda dtype, dev=None: True)
    monkeypatch.setattr(precision, "bf16_step_is_faster", lambda: (step_faster, "faked"))
    dtype, why = resolve_precision("auto", CPU)
    assert dtype == (torch.bfloat16 if step_faster else torch.float32) and why.endswith("; faked")


def test_step_measurement_is_cached_and_keeps_the_random_stream():
    from torchrec_ascend.training import precision

    torch.manual_seed(3)
    state = torch.random.get_rng_state()
    faster, why = precision.bf16_step_is_faster()
    assert isinstance(faster, bool) and "ms fp32" in why and "ms bf16" in why
    assert torch.equal(torch.random.get_rng_state(), state)
    assert precision.bf16_step_is_faster() == (faster, why)


def test_auto_on_cuda_is_bf16(monkeypatch):
    # npu / cuda have bf16 units: chosen without a measurement (none is possible here)
    monkeypatch.delenv(_device.ENV_GEMM_DTYPE, raising=False)
    dtype, why = resolve_precision("auto", torch.device("cuda"))
    assert dtype == torch.bfloat16 and "cuda" in why


def test_bad_name():
    with pytest.raises(ValueError, match=r"precision: 'half' is not one of \['auto', 'fp32', 'bf16'\]"):
        resolve_precision("half", CPU)
