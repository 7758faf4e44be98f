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


def test_process_group_backend_per_device():
    from torchrec_ascend.device import process_group_backend

    assert process_group_backend("cpu") == "gloo"
    assert process_group_backend("npu") == "cpu:gloo,npu:hccl"
    assert process_group_backend("cuda") == "cpu:gloo,cuda:nccl"
    with pytest.raises(ValueError, match="no process-group backend known"):
        process_group_backend("meta")
