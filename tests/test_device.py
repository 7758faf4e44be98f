"""torchrec_ascend.device: detection, override, streams/events as no-ops on cpu."""

import os
import re

import pytest
import torch

from torchrec_ascend import device

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "torchrec_ascend")


def test_detection_here_is_cpu(monkeypatch):
    monkeypatch.delenv(device.ENV_DEVICE, raising=False)
    assert device.torch_npu_available() is False  # no CANN on these machines
    assert device.npu_available() is False
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert device.device_type() == expected
    assert device.is_available("cpu") and not device.is_available("npu")


def test_override(monkeypatch):
    monkeypatch.setenv(device.ENV_DEVICE, "NPU")
    assert device.device_type() == "npu"
    if torch._C._get_privateuse1_backend_name() == "npu":
        assert device.default_device(3) == torch.device("npu", 3)
    else:
        with pytest.raises(ValueError, match="torch knows no such device type"):
            device.default_device(3)
    monkeypatch.setenv(device.ENV_DEVICE, "cpu")
    assert device.default_device(3) == torch.device("cpu")
    monkeypatch.setenv(device.ENV_DEVICE, "tpu")
    with pytest.raises(ValueError, match="TORCHREC_ASCEND_DEVICE='tpu'"):
        device.device_type()
    with pytest.raises(ValueError, match="kind='tpu'"):
        device.is_available("tpu")


def test_cpu_streams_and_events_are_noops():
    assert not device.has_streams("cpu")
    assert device.new_stream("cpu") is None
    assert device.current_stream("cpu") is None
    assert device.new_event("cpu") is None
    x = torch.ones(3)
    with device.stream_context(None):
        y = x * 2
    device.record_stream(y, None)
    device.synchronize("cpu")
    assert y.sum().item() == 6
    assert device.device_module("cpu") is torch.cpu


def test_no_other_module_touches_device_namespaces():
    """Only device.py may write torch.cuda.* / torch.npu.* (streams, events, sync, ...)."""
    pattern = re.compile(r"\btorch\.(cuda|npu)\.")
    offenders = []
    for root, _, files in os.walk(PKG):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(root, f)
            if os.path.relpath(path, PKG) == "device.py":
                continue
            with open(path, encoding="utf-8") as fh:
                for i, line in enumerate(fh, 1):
                    if pattern.search(line) and not line.lstrip().startswith("#"):
                        offenders.append(f"{os.path.relpath(path, PKG)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


# --------------------------------------------------------------------------- GEMM precision

def test_choose_gemm_dtype_follows_the_rates():
    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    assert device.choose_gemm_dtype({f32: 100.0, bf16: 300.0}) == bf16      # AVX512-BF16 / AMX
    assert device.choose_gemm_dtype({f32: 100.0, bf16: 1.0}) == f32         # AVX2: half ~100x slower
    assert device.choose_gemm_dtype({f32: 100.0, bf16: 110.0}) == f32       # within noise: keep fp32
    assert device.choose_gemm_dtype({f32: 100.0, bf16: 200.0, f16: 400.0}) == f16
    assert device.choose_gemm_dtype({f32: 100.0}) == f32
    with pytest.raises(ValueError, match="needs a float32 rate"):
        device.choose_gemm_dtype({bf16: 3.0})


def test_cpu_capability_times_only_hardware_formats(monkeypatch):
    """Flags gate which half formats are timed; the fake timings then decide."""
    timed = []

    def fake_measure(kind, dtypes):
        timed.append(tuple(dtypes))
        return {dt: {torch.float32: 120.0, torch.bfloat16: 460.0, torch.float16: 125.0}[dt] for dt in dtypes}

    monkeypatch.setattr(device, "cpu_flags", lambda: frozenset({"avx2", "amx_bf16", "avx512_bf16"}))
    cap = device._capability("cpu", fake_measure)
    assert timed[-1] == (torch.float32, torch.bfloat16)
    assert cap.fastest == torch.bfloat16 and cap.cpu_flags == ("amx_bf16", "avx512_bf16")
    assert cap.gflops[torch.bfloat16] == 460.0 and "bfloat16" in cap.reason

    monkeypatch.setattr(device, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    cap = device._capability("cpu", fake_measure)
    assert timed[-1] == (torch.float32,) and cap.fastest == torch.float32
    assert "no bf16/fp16" in cap.reason

    # hardware present but measured slow (e.g. a library without the kernel): fp32
    monkeypatch.setattr(device, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    cap = device._capability("cpu", lambda k, dts: {torch.float32: 100.0, torch.bfloat16: 40.0})
    assert cap.fastest == torch.float32
    # accelerators: bf16
    cap = device._capability("cuda", lambda k, dts: {dt: 1.0 for dt in dts})
    assert cap.fastest == torch.bfloat16 and set(cap.gflops) == {torch.float32, torch.bfloat16}


def test_capability_is_measured_once_and_cached(monkeypatch):
    calls = []

    def fake(kind, measure):
        calls.append(kind)
        return device.GemmCapability(kind, {torch.float32: 1.0, torch.bfloat16: 5.0}, torch.bfloat16)

    monkeypatch.setattr(device, "_CAPABILITIES", {})
    monkeypatch.setattr(device, "_capability", fake)
    monkeypatch.delenv(device.ENV_GEMM_DTYPE, raising=False)
    assert device.fastest_gemm_dtype("cpu") == torch.bfloat16
    assert device.fastest_gemm_dtype("cpu") == torch.bfloat16
    assert device.gemm_dtype_is_fast(torch.bfloat16, "cpu") and device.gemm_dtype_is_fast("fp32", "cpu")
    assert not device.gemm_dtype_is_fast(torch.float16, "cpu")
    assert calls == ["cpu"]
    device.gemm_capability("cpu", refresh=True)
    assert calls == ["cpu", "cpu"]
    monkeypatch.setenv(device.ENV_GEMM_DTYPE, "fp32")
    assert device.fastest_gemm_dtype("cpu") == torch.float32
    monkeypatch.setenv(device.ENV_GEMM_DTYPE, "int8")
    with pytest.raises(ValueError, match="TORCHREC_ASCEND_GEMM_DTYPE='int8'"):
        device.fastest_gemm_dtype("cpu")


def test_measured_rates_are_real_and_the_choice_follows_them():
    rates = device.measure_gemm_gflops("cpu", (torch.float32,), n=128, min_run_time=0.01, rounds=1)
    # a loaded shared machine can lose a whole time slice inside a short block: only sanity bounds
    assert set(rates) == {torch.float32} and 0.0 < rates[torch.float32] < 1e5
    cap = device.gemm_capability("cpu")
    assert cap.fastest == device.choose_gemm_dtype(cap.gflops)
    expected = set(device.half_dtypes_with_hardware(device.cpu_flags())) | {torch.float32}
    assert set(cap.gflops) == expected
    with pytest.raises(ValueError, match="n: must be >= 1"):
        device.measure_gemm_gflops("cpu", n=0)
    with pytest.raises(ValueError, match="dtype: torch.int32 is not one of"):
        device.parse_dtype(torch.int32)
