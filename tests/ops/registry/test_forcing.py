"""registry/forcing.py: use_backend's arguments, and replace_fbgemm putting our kernel in place of
fbgemm's CPU kernel for the block only."""

from __future__ import annotations

import pytest
import torch

import torchrec_ascend.ops as ops
from torchrec_ascend.ops import registry

pytest.importorskip("fbgemm_gpu")


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="backend='nope'"):
        with ops.use_backend("nope"):
            pass
    with pytest.raises(ValueError, match="ops: unknown op"):
        with ops.use_backend("reference", ops=["not_an_op"]):
            pass
    with pytest.raises(ValueError, match="device='tpu'"):
        with ops.use_backend("reference", device="tpu"):
            pass
    with pytest.raises(ValueError, match="replace_fbgemm"):
        with ops.use_backend("fbgemm", replace_fbgemm=True):
            pass


def test_replaced_set_is_exactly_the_fbgemm_cpu_ops_and_restored():
    native_cpu = sorted(s.name for s in registry.all_specs()
                        if s.fbgemm and "CPU" in registry.fbgemm_keys(s.name))
    assert native_cpu, "fbgemm_gpu loaded but no op with a native CPU kernel recorded"
    assert registry.replaced_fbgemm_ops() == []
    with ops.use_backend("reference", replace_fbgemm=True):
        assert registry.replaced_fbgemm_ops() == native_cpu
        for op in native_cpu:
            assert registry.choose(op, "cpu")[0] != "fbgemm", op
        with ops.use_backend("cpu_kernel", replace_fbgemm=True):  # nested: nothing twice
            assert registry.replaced_fbgemm_ops() == native_cpu
        assert registry.replaced_fbgemm_ops() == native_cpu
    assert registry.replaced_fbgemm_ops() == []
    op = native_cpu[0]
    assert registry.choose(op, "cpu")[0] == "fbgemm"


def test_replace_fbgemm_routes_fbgemm_calls_through_ours(monkeypatch):
    """torch.ops.fbgemm.<op> on CPU runs our implementation inside the block; afterwards
    fbgemm's own kernel is back (a spy on our reference counts the calls)."""
    calls = []
    s = registry.spec("jagged_to_padded_dense_forward")
    real = s.reference

    def spy(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(s, "reference", spy)
    values = torch.randn(7, 3)
    offsets = torch.tensor([0, 0, 1, 7])
    want = torch.ops.fbgemm.jagged_to_padded_dense(values, [offsets], [4])
    assert not calls
    with ops.use_backend("reference", replace_fbgemm=True):
        got = torch.ops.fbgemm.jagged_to_padded_dense(values, [offsets], [4])
    assert len(calls) == 1
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.ops.fbgemm.jagged_to_padded_dense(values, [offsets], [4])
    assert len(calls) == 1, "fbgemm's kernel was not restored"


def test_replace_only_the_named_ops():
    with ops.use_backend("reference", ops=["invert_permute"], replace_fbgemm=True):
        assert registry.replaced_fbgemm_ops() == ["invert_permute"]
        assert registry.choose("asynchronous_complete_cumsum", "cpu")[0] == "fbgemm"
    with ops.use_backend("reference", device="npu", replace_fbgemm=True):
        assert registry.replaced_fbgemm_ops() == []  # a force for npu leaves fbgemm's CPU kernels
