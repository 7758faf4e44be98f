"""registry/environment.py: the probes feed the choice.  fbgemm-ascend is simulated by a
PrivateUse1 kernel of an fbgemm op registered before torchrec_ascend is imported (what
fbgemm-ascend does on a real npu): that op must then choose ``fbgemm_ascend`` on npu, its calls on
(simulated) npu tensors must reach that kernel, and ops without one must stay on ours."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from torchrec_ascend.ops.registry import environment

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

_SIMULATED_ASCEND = textwrap.dedent("""
    import torch, fbgemm_gpu  # noqa: F401
    calls = []
    lib = torch.library.Library("fbgemm", "IMPL")

    def ascend_complete_cumsum(t):  # stands in for fbgemm-ascend's kernel
        calls.append(t.device.type)
        c = t.cpu()
        return torch.cat([c.new_zeros(1), c.cumsum(0).to(c.dtype)]).to(t.device)

    lib.impl("asynchronous_complete_cumsum", ascend_complete_cumsum, "PrivateUse1")

    import torchrec_ascend.ops as ops
    from torchrec_ascend.ops import registry
    got = {op: tuple(registry.choose(op, d)[0] for d in ("cpu", "cuda", "npu"))
           for op in ("asynchronous_complete_cumsum", "asynchronous_exclusive_cumsum",
                      "jagged_to_padded_dense_forward")}
    assert got == {
        "asynchronous_complete_cumsum": ("fbgemm", "reference", "fbgemm_ascend"),
        "asynchronous_exclusive_cumsum": ("fbgemm", "reference", "reference"),
        "jagged_to_padded_dense_forward": ("fbgemm", "reference", "reference"),
    }, got
    assert registry.choose("asynchronous_complete_cumsum", "npu")[1] == \\
        "fbgemm-ascend has a PrivateUse1 kernel"
    # ours did not replace fbgemm-ascend's kernel, and forcing still wins over it
    with ops.use_backend("reference", device="npu"):
        assert registry.choose("asynchronous_complete_cumsum", "npu")[0] == "reference"

    from torchrec_ascend.testing import simulated_npu
    if simulated_npu.available() and simulated_npu.enable():
        x = torch.tensor([3, 1, 2]).to("npu")
        out = torch.ops.torchrec_ascend.asynchronous_complete_cumsum(x)
        assert calls == ["npu"], calls
        assert out.device.type == "npu" and out.cpu().tolist() == [0, 3, 4, 6]
        torch.ops.fbgemm.asynchronous_complete_cumsum(x)  # TorchRec's call: straight to it
        assert calls == ["npu", "npu"], calls
        ex = torch.ops.torchrec_ascend.asynchronous_exclusive_cumsum(x)  # ours (reference)
        assert calls == ["npu", "npu"] and ex.cpu().tolist() == [0, 3, 4]
        print("SIMULATED-NPU")
    print("OK")
""")


def test_simulated_fbgemm_ascend_kernel_is_chosen_on_npu():
    pytest.importorskip("fbgemm_gpu")
    r = subprocess.run([sys.executable, "-c", _SIMULATED_ASCEND], cwd=REPO, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "OK" in r.stdout
    from torchrec_ascend.testing import simulated_npu
    from torchrec_ascend import device as _device
    if simulated_npu.available() and not _device.torch_npu_available():
        assert "SIMULATED-NPU" in r.stdout, "the npu part did not run"


def test_native_keys_of_reads_the_dispatcher():
    pytest.importorskip("fbgemm_gpu")
    keys = environment.native_keys_of("fbgemm::asynchronous_complete_cumsum")
    assert "CPU" in keys
    assert environment.native_keys_of("fbgemm::no_such_op_anywhere") == frozenset()
    assert environment.has_schema("torchrec_ascend::asynchronous_complete_cumsum")


def test_triton_on_cpu_only_when_interpreted(monkeypatch):
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        assert "cpu" not in environment.read_environment().triton_devices
        return
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "cpu" not in environment.read_environment().triton_devices
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "cpu" in environment.read_environment().triton_devices


def test_read_environment_reads_the_variable_and_the_extension(monkeypatch):
    from torchrec_ascend.ops import extension

    monkeypatch.setenv(environment.ENV_BACKEND, "invert_permute=reference")
    env = environment.read_environment()
    assert env.forcing == "invert_permute=reference"
    assert env.extension is extension.extension()
    if env.extension is not None:
        assert "invert_permute" in env.direct_ops
    assert environment.read_environment(extension=None).direct_ops == frozenset()
