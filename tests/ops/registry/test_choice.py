"""registry/choice.py (and the state that feeds it): the exact backend for every (device, installed
backends) case, forcing, the environment variable (read once, and again on reload_environment),
the per-call capability check (Limit) and the choice cache."""

from __future__ import annotations

import itertools

import pytest
import torch

import torchrec_ascend.ops as ops
from torchrec_ascend.ops import registry
from torchrec_ascend.ops.registry import Installed, Limit, OpSpec, candidates

_ident = lambda *a: a[0]  # noqa: E731


def _spec(**kw) -> OpSpec:
    """A spec that is never registered: candidates() is a pure function of spec and Installed."""
    base = dict(name="probe", schema="(Tensor x) -> Tensor", reference=_ident, fake=_ident,
                fbgemm=True, triton=_ident, cpu_kernel="probe_kernel")
    base.update(kw)
    return OpSpec(**base)


def _names(s, device, inst):
    return [b for b, _ in candidates(s, device, inst)]


# (device, Installed, the exact preference list) for an op that fbgemm, triton and csrc all have
FULL_OP_CASES = [
    # cpu: fbgemm's own kernel first; csrc before the reference; triton only when interpreted
    ("cpu", Installed(fbgemm_keys=frozenset({"CPU"}), cpu_kernel=True),
     ["fbgemm", "cpu_kernel", "reference"]),
    ("cpu", Installed(fbgemm_keys=frozenset({"CPU"}), fbgemm_cpu_replaced=True, cpu_kernel=True),
     ["cpu_kernel", "reference"]),
    ("cpu", Installed(fbgemm_keys=frozenset({"CPU"}), triton=True, cpu_kernel=True),
     ["fbgemm", "triton", "cpu_kernel", "reference"]),
    ("cpu", Installed(cpu_kernel=True), ["cpu_kernel", "reference"]),
    ("cpu", Installed(), ["reference"]),
    # fbgemm's CUDA / PrivateUse1 kernels do not serve cpu
    ("cpu", Installed(fbgemm_keys=frozenset({"CUDA", "PrivateUse1"})), ["reference"]),
    # cuda: fbgemm-gpu, then triton; never csrc
    ("cuda", Installed(fbgemm_keys=frozenset({"CPU", "CUDA"}), triton=True, cpu_kernel=True),
     ["fbgemm", "triton", "reference"]),
    ("cuda", Installed(fbgemm_keys=frozenset({"CPU"}), triton=True, cpu_kernel=True),
     ["triton", "reference"]),
    ("cuda", Installed(fbgemm_keys=frozenset({"CPU"}), cpu_kernel=True), ["reference"]),
    # npu: fbgemm-ascend's PrivateUse1 kernel, then triton-ascend, then the reference
    ("npu", Installed(fbgemm_keys=frozenset({"CPU", "PrivateUse1"}), triton=True, cpu_kernel=True),
     ["fbgemm_ascend", "triton", "reference"]),
    ("npu", Installed(fbgemm_keys=frozenset({"PrivateUse1"})), ["fbgemm_ascend", "reference"]),
    ("npu", Installed(fbgemm_keys=frozenset({"CPU", "CUDA"}), triton=True), ["triton", "reference"]),
    ("npu", Installed(fbgemm_keys=frozenset({"CPU", "CUDA"}), cpu_kernel=True), ["reference"]),
    # a replaced fbgemm CPU kernel does not affect the other devices
    ("npu", Installed(fbgemm_keys=frozenset({"PrivateUse1"}), fbgemm_cpu_replaced=True),
     ["fbgemm_ascend", "reference"]),
]


@pytest.mark.parametrize("device,inst,want", FULL_OP_CASES)
def test_exact_preference_per_device_and_installed_backends(device, inst, want):
    assert _names(_spec(), device, inst) == want


def test_every_installed_combination_follows_the_rule():
    """All 2^5 combinations on all devices: the list is exactly what the rule of DESIGN.md
    admits, in BACKENDS order (an independent restatement of the rule)."""
    s = _spec()
    for keys, replaced, triton, cpu in itertools.product(
            [frozenset(), frozenset({"CPU"}), frozenset({"CUDA"}), frozenset({"PrivateUse1"}),
             frozenset({"CPU", "CUDA", "PrivateUse1"})], [False, True], [False, True],
            [False, True]):
        inst = Installed(fbgemm_keys=keys, fbgemm_cpu_replaced=replaced, triton=triton,
                         cpu_kernel=cpu)
        for device in registry.DEVICES:
            want = []
            if device == "cpu" and "CPU" in keys and not replaced:
                want.append("fbgemm")
            if device == "cuda" and "CUDA" in keys:
                want.append("fbgemm")
            if device == "npu" and "PrivateUse1" in keys:
                want.append("fbgemm_ascend")
            if triton:
                want.append("triton")
            if device == "cpu" and cpu:
                want.append("cpu_kernel")
            want.append("reference")
            assert _names(s, device, inst) == want, (device, inst)


def test_what_a_spec_lacks_is_never_chosen():
    inst = Installed(fbgemm_keys=frozenset({"CPU", "CUDA", "PrivateUse1"}), triton=True,
                     cpu_kernel=True)
    bare = _spec(fbgemm=False, triton=None, cpu_kernel=None)
    for device in registry.DEVICES:
        assert _names(bare, device, inst) == ["reference"]
    assert _names(_spec(fbgemm=False), "cpu", inst) == ["triton", "cpu_kernel", "reference"]


def test_why_names_the_kernel_and_the_limit():
    s = _spec(limits={"cpu_kernel": Limit("one jagged dimension", lambda x: True)})
    why = dict(candidates(s, "cpu", Installed(cpu_kernel=True, direct=False)))
    assert why["cpu_kernel"].startswith("csrc kernel _C.probe_kernel")
    assert "covers one jagged dimension" in why["cpu_kernel"]
    assert why["reference"] == "torch-composite reference"
    direct = dict(candidates(_spec(), "cpu", Installed(cpu_kernel=True, direct=True)))
    assert "direct dispatcher kernel" in direct["cpu_kernel"]


def test_live_choices_on_this_machine():
    """The probes of this machine (fbgemm-gpu-cpu, the built csrc extension, no triton
    interpreter, no fbgemm-ascend): the exact default backend of named ops per device."""
    fbgemm_gpu = pytest.importorskip("fbgemm_gpu")  # noqa: F841
    if not ops.extension.available():
        pytest.skip("csrc extension not built")
    want = {
        # fbgemm has a CPU kernel: it wins on cpu
        "asynchronous_complete_cumsum": ("fbgemm", "reference", "reference"),
        "jagged_to_padded_dense_forward": ("fbgemm", "reference", "reference"),
        # fbgemm-gpu-cpu has no CPU kernel: csrc
        "keyed_jagged_index_select_dim1": ("cpu_kernel", "reference", "reference"),
        # Adam has no fbgemm CPU kernel; ours is torchrec_ascend:: only
        "split_embedding_backward_codegen_adam_unweighted_pt2_wrapper":
            ("cpu_kernel", "reference", "reference"),
        # no csrc kernel and no fbgemm op
        "split_embedding_codegen_lookup_function": ("reference", "reference", "reference"),
    }
    for op, per_device in want.items():
        got = tuple(registry.choose(op, d)[0] for d in ("cpu", "cuda", "npu"))
        assert got == per_device, op


# --------------------------------------------------------------------------- forcing


def test_force_for_one_op_leaves_the_others():
    name = "jagged_to_padded_dense_forward"
    with ops.use_backend("reference", ops=["asynchronous_complete_cumsum"], replace_fbgemm=True):
        assert registry.choose(name, "cpu")[0] == registry.available_backends(name, "cpu")[0][0]
        assert registry.choose("asynchronous_complete_cumsum", "cpu") == (
            "reference", "forced by use_backend()")


def test_nesting_innermost_first_and_restore():
    name = "jagged_to_padded_dense_forward"
    before = registry.choose(name, "cpu")
    with ops.use_backend("reference"):
        assert registry.choose(name, "cpu")[0] == "reference"
        with ops.use_backend("cpu_kernel", ops=[name]):
            assert registry.choose(name, "cpu")[0] == "cpu_kernel"
        assert registry.choose(name, "cpu")[0] == "reference"
    assert registry.choose(name, "cpu") == before


def test_device_restricted_force():
    name = "jagged_to_padded_dense_forward"
    with ops.use_backend("reference", device="npu"):
        assert registry.choose(name, "npu") == ("reference", "forced by use_backend()")
        assert registry.choose(name, "cpu")[1] != "forced by use_backend()"


def test_strict_when_ops_are_named():
    with ops.use_backend("triton", ops=["asynchronous_inclusive_cumsum"]):
        with pytest.raises(RuntimeError, match="forces backend 'triton'"):
            registry.choose("asynchronous_inclusive_cumsum", "cpu")


def test_lenient_for_all_ops(reread):
    # triton cannot run on cpu here: a force of every op falls back per op and says why
    reread(triton_devices=frozenset())
    op = "jagged_to_padded_dense_forward"
    first = registry.available_backends(op, "cpu")[0][0]
    with ops.use_backend("triton"):
        backend, why = registry.choose(op, "cpu")
        assert backend == first and "'triton' forced by use_backend() is unavailable" in why


def test_environment_variable(monkeypatch, reread):
    name = "jagged_to_padded_dense_forward"
    if "cpu_kernel" not in [b for b, _ in registry.available_backends(name, "cpu")]:
        pytest.skip("csrc extension not built")
    monkeypatch.setenv(registry.ENV_BACKEND, "reference")
    reread()
    assert registry.choose(name, "cpu") == ("reference", "forced by $TORCHREC_ASCEND_BACKEND")
    monkeypatch.setenv(registry.ENV_BACKEND, f"{name}=cpu_kernel")
    reread()
    assert registry.choose(name, "cpu")[0] == "cpu_kernel"
    assert registry.choose("asynchronous_complete_cumsum", "cpu")[0] == \
        registry.available_backends("asynchronous_complete_cumsum", "cpu")[0][0]
    monkeypatch.setenv(registry.ENV_BACKEND, f"{name}=triton")
    reread()
    with pytest.raises(RuntimeError, match="forces backend 'triton'"):
        registry.choose(name, "cpu")
    monkeypatch.setenv(registry.ENV_BACKEND, "bogus")
    reread()
    with pytest.raises(ValueError, match="bogus"):
        registry.choose(name, "cpu")


def test_environment_is_read_once(monkeypatch, reread):
    """A variable set after the registry read its environment changes nothing until
    reload_environment() reads it again."""
    name = "jagged_to_padded_dense_forward"
    monkeypatch.delenv(registry.ENV_BACKEND, raising=False)
    before = reread()
    assert before.forcing == ""
    default = registry.choose(name, "cpu")
    monkeypatch.setenv(registry.ENV_BACKEND, "reference")
    assert registry.choose(name, "cpu") == default and default[0] != "reference"
    assert reread().forcing == "reference"
    assert registry.choose(name, "cpu")[0] == "reference"


def test_use_backend_outranks_the_environment(monkeypatch, reread):
    name = "jagged_to_padded_dense_forward"
    monkeypatch.setenv(registry.ENV_BACKEND, "reference")
    reread()
    with ops.use_backend("cpu_kernel", ops=[name]):
        assert registry.choose(name, "cpu") == ("cpu_kernel", "forced by use_backend()")


# --------------------------------------------------------------------------- capability check


@pytest.fixture
def triton_on_cpu(reread):
    """Pretend Triton runs on cpu (the choice only; no Triton kernel is called)."""
    reread(triton_devices=frozenset(registry.DEVICES), forcing="")


def test_limit_passes_a_call_it_does_not_cover_to_the_next_backend(triton_on_cpu):
    op = "jagged_to_padded_dense_forward"
    values = torch.randn(6, 2)
    one = [torch.tensor([0, 2, 6])]
    two = [torch.tensor([0, 1, 2]), torch.tensor([0, 4, 6])]
    half = values.to(torch.float64)
    names = [b for b, _ in registry.available_backends(op, "cpu")]
    after_triton = names[names.index("triton") + 1]
    with ops.use_backend("triton", ops=[op]):
        assert registry.choose(op, "cpu")[0] == "triton"
        assert registry.backend_for_call(op, "cpu", (values, one, [4], 0.0)) == "triton"
        assert registry.backend_for_call(op, "cpu", (values, two, [2, 4], 0.0)) == after_triton
        assert registry.backend_for_call(op, "cpu", (half, one, [4], 0.0)) == after_triton
        assert "covers one jagged dimension" in registry.choose(op, "cpu")[1]


def test_limit_is_visible_in_describe(triton_on_cpu):
    with ops.use_backend("triton", ops=["jagged_to_padded_dense_forward"]):
        rows = {(r[0], r[1]): r for r in ops.describe_rows(["cpu"])}
    row = rows[("jagged_to_padded_dense_forward", "cpu")]
    assert row[2] == "triton" and "one jagged dimension" in row[3]


def test_run_executes_the_backend_that_covers_the_call(triton_on_cpu, monkeypatch):
    """Forced triton (a spy in its place): a one-jagged-dim call runs it, a two-dim call runs
    the next backend and gives fbgemm's result."""
    op = "jagged_to_padded_dense_forward"
    s = registry.spec(op)
    calls = []

    def spy(values, offsets, max_lengths, padding_value=0.0):
        calls.append(len(offsets))
        return s.reference(values, offsets, max_lengths, padding_value)

    monkeypatch.setattr(s, "triton", spy)
    values = torch.randn(6, 2)
    one = [torch.tensor([0, 2, 6])]
    two = [torch.tensor([0, 1, 2]), torch.tensor([0, 4, 6])]
    call = torch.ops.torchrec_ascend.jagged_to_padded_dense_forward
    with ops.use_backend("triton", ops=[op]):
        got1 = call(values, one, [4], 0.0)
        got2 = call(values, two, [2, 4], 0.0)
    assert calls == [1]
    torch.testing.assert_close(got1, s.reference(values, one, [4], 0.0), rtol=0, atol=0)
    want2 = torch.zeros(2, 2, 4, 2)
    want2[0, 0, :4] = values[:4]
    want2[1, 0, :2] = values[4:]
    torch.testing.assert_close(got2, want2, rtol=0, atol=0)


# --------------------------------------------------------------------------- cache


def test_choice_cache_follows_forcing_and_environment(monkeypatch, reread):
    name = "jagged_to_padded_dense_forward"
    monkeypatch.delenv(registry.ENV_BACKEND, raising=False)
    reread()
    first = registry.choose(name, "cpu")
    assert registry.choose(name, "cpu") is first  # cached
    with ops.use_backend("reference", ops=[name]):
        assert registry.choose(name, "cpu")[0] == "reference"
    assert registry.choose(name, "cpu") == first
    monkeypatch.setenv(registry.ENV_BACKEND, f"{name}=reference")
    reread()
    assert registry.choose(name, "cpu")[0] == "reference"


def test_choice_cache_follows_the_reread_triton_probe(reread):
    op = "jagged_softmax_forward"
    reread(triton_devices=frozenset(), forcing="")
    assert registry.choose(op, "cuda")[0] == "reference"
    reread(triton_devices=frozenset({"cuda"}), forcing="")
    assert registry.choose(op, "cuda")[0] == "triton"
    assert registry.choose(op, "npu")[0] == "reference"
