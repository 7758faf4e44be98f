"""registry/dispatch.py and the state's dispatcher tables: what is registered (kernels per device
key, fbgemm's PrivateUse1 kernels, the fbgemm:: schemas on a torch-only machine), the csrc direct
kernels registered exactly while they are the choice, observe(), and the fallback when the
extension is missing."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torchrec_ascend.ops as ops
from torchrec_ascend.ops import registry

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _fbgemm_ops():
    return [s for s in registry.all_specs() if s.fbgemm]


def test_every_op_has_kernels_for_every_device_key():
    assert registry.all_specs(), "no op registered"
    for s in registry.all_specs():
        q = f"torchrec_ascend::{s.name}"
        for key in ("CPU", "CUDA", "PrivateUse1", "Meta"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(q, key), (q, key)


def test_fbgemm_ops_have_privateuse1_kernels_after_import():
    names = [s.name for s in _fbgemm_ops() if not s.decomposes_in_fbgemm]
    assert names
    for name in names:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"fbgemm::{name}", "PrivateUse1"), name


def test_fbgemm_keeps_its_own_cpu_kernels_by_default():
    # importing torchrec_ascend must not replace fbgemm's CPU kernels
    pytest.importorskip("fbgemm_gpu")
    for s in _fbgemm_ops():
        if "CPU" in registry.fbgemm_keys(s.name):
            assert registry.choose(s.name, "cpu")[0] == "fbgemm", s.name


def test_register_rejects_duplicates_half_autograd_and_foreign_limits():
    s = registry.spec("asynchronous_complete_cumsum")
    with pytest.raises(ValueError, match="already registered"):
        registry.register(s)
    bad = registry.OpSpec(name="_half_autograd_probe", schema="(Tensor x) -> Tensor",
                          reference=lambda x: x, fake=lambda x: x, backward=lambda c, g: g)
    with pytest.raises(ValueError, match="both backward and setup_context"):
        registry.register(bad)
    bad = registry.OpSpec(name="_limited_reference_probe", schema="(Tensor x) -> Tensor",
                          reference=lambda x: x, fake=lambda x: x,
                          limits={"reference": registry.Limit("nothing", lambda x: False)})
    with pytest.raises(ValueError, match="limits\\['reference'\\]"):
        registry.register(bad)
    assert "_half_autograd_probe" not in {s.name for s in registry.all_specs()}


_BLOCKER = textwrap.dedent(
    """
    import sys, importlib.abc
    class _Block(importlib.abc.MetaPathFinder):
        def __init__(self, names): self.names = names
        def find_spec(self, name, path=None, target=None):
            if any(name == n or name.startswith(n + '.') for n in self.names):
                raise ModuleNotFoundError(f'No module named {name!r} (blocked for the test)', name=name)
            return None
    sys.meta_path.insert(0, _Block(set(sys.argv[1].split(','))))
    """
)


def _run_blocked(blocked: str, body: str) -> subprocess.CompletedProcess:
    code = _BLOCKER + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code, blocked], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def test_ops_import_with_torch_alone():
    """No fbgemm_gpu, no torchrec: torchrec_ascend.ops imports, defines the fbgemm:: schemas
    itself, and the ops run (and differentiate) through them."""
    r = _run_blocked("fbgemm_gpu,torchrec,fbgemm_ascend", """
        import torch, torchrec_ascend.ops as ops
        from torchrec_ascend.ops import registry
        assert 'fbgemm_gpu' not in sys.modules and 'torchrec' not in sys.modules
        rows = ops.describe()
        assert all(r[2] != 'fbgemm' for r in rows), rows
        v = torch.randn(5, 2, requires_grad=True)
        off = torch.tensor([0, 2, 5])
        d = torch.ops.fbgemm.jagged_to_padded_dense_forward(v, [off], [3], 0.0)
        d.sum().backward()
        assert d.shape == (2, 3, 2) and v.grad.eq(1).all()
        assert torch._C._dispatch_has_kernel_for_dispatch_key(
            'fbgemm::jagged_to_padded_dense_forward', 'PrivateUse1')
        print('OK')
    """)
    assert r.returncode == 0, r.stderr
    assert "OK" in r.stdout
    assert "jagged_to_padded_dense_forward" in r.stdout


def test_missing_extension_warns_once_and_falls_back():
    r = _run_blocked("torchrec_ascend._C", """
        import warnings
        warnings.simplefilter('always')
        import torch
        with warnings.catch_warnings(record=True) as w:
            import torchrec_ascend.ops as ops
            from torchrec_ascend.ops import registry
            b1 = registry.choose('jagged_to_padded_dense_forward', 'cpu')
            with ops.use_backend('cpu_kernel'):
                b2 = registry.choose('jagged_to_padded_dense_forward', 'cpu')
        msgs = [str(x.message) for x in w if 'C++ CPU kernels unavailable' in str(x.message)]
        assert len(msgs) == 1, msgs
        assert '\\n' not in msgs[0]
        assert b2[0] != 'cpu_kernel', b2
        print('OK', b1[0], b2[0])
    """)
    assert r.returncode == 0, r.stderr
    assert "OK fbgemm fbgemm" in r.stdout


def test_missing_extension_falls_back_to_reference(reread):
    op = "jagged_to_padded_dense_forward"
    with ops.use_backend("cpu_kernel", ops=[op]):
        direct = registry.routes_direct(op)
        reread(extension=None)
        names = [b for b, _ in registry.available_backends(op, "cpu")]
        assert "cpu_kernel" not in names and names[-1] == "reference"
        assert not any(registry.routes_direct(s.name) for s in registry.all_specs())
    v = torch.randn(4, 3)
    off = torch.tensor([0, 1, 4])
    with ops.use_backend("cpu_kernel"):
        out = ops.jagged_to_padded_dense(v, off, 3)
    torch.testing.assert_close(out, torch.ops.fbgemm.jagged_to_padded_dense(v, [off], [3]))
    with ops.use_backend("cpu_kernel", ops=[op]):
        reread()
        assert registry.routes_direct(op) == direct


# --------------------------------------------------------------------------- direct kernels


def _direct_ops():
    """The ops that get a csrc direct kernel while cpu_kernel is their choice."""
    with ops.use_backend("cpu_kernel", device="cpu"):
        return sorted(s.name for s in registry.all_specs() if registry.routes_direct(s.name))


def _cpu_kernel_of(op: str) -> str:
    table = torch._C._dispatch_dump_table(f"torchrec_ascend::{op}")
    return next(line for line in table.splitlines() if line.startswith("CPU:"))


@pytest.fixture
def python_calls():
    """(op, device, backend) of every call a Python kernel of the registry serves (observe())."""
    calls = []
    with registry.observe(lambda op, device, backend: calls.append((op, device))):
        yield calls


def _kjt_select_args():
    lengths = torch.tensor([2, 0, 1, 3], dtype=torch.int64)
    offsets = torch.tensor([0, 2, 2, 3, 6], dtype=torch.int64)
    values = torch.arange(6, dtype=torch.float32)
    return values, lengths, offsets, torch.tensor([1]), 2


def test_direct_kernels_are_registered_exactly_while_chosen():
    from torchrec_ascend.ops import extension

    if not extension.available():
        pytest.skip("C++ extension not built")
    names = _direct_ops()
    # every training-path sparse op with a csrc kernel is served directly
    for op in ("asynchronous_complete_cumsum", "permute_2D_sparse_data", "permute_1D_sparse_data",
               "block_bucketize_sparse_features", "invert_permute", "expand_into_jagged_permute",
               "segment_sum_csr", "offsets_range", "bounds_check_indices"):
        assert op in names, op
    for op in names:
        # the dispatcher's CPU kernel is the csrc function (csrc/direct.h) exactly when the
        # registry's choice is cpu_kernel, else the registry's Python kernel
        chosen = registry.choose(op, "cpu")[0] == "cpu_kernel"
        assert registry.routes_direct(op) == chosen, op
        assert ("direct.h" in _cpu_kernel_of(op)) == chosen, (op, _cpu_kernel_of(op))
    with ops.use_backend("cpu_kernel", device="cpu"):
        assert all("direct.h" in _cpu_kernel_of(op) for op in names)
        why = dict(registry.available_backends(names[0], "cpu"))["cpu_kernel"]
        assert "direct dispatcher kernel" in why
    op = "asynchronous_complete_cumsum"
    if registry.choose(op, "cpu")[0] != "cpu_kernel":
        assert "direct.h" not in _cpu_kernel_of(op), "leaving use_backend kept the csrc kernel"


def test_direct_kernel_runs_without_python_by_default(python_calls):
    # fbgemm-gpu-cpu has no CPU kernel for keyed_jagged_index_select_dim1: csrc is the default
    op = "keyed_jagged_index_select_dim1"
    if not registry.routes_direct(op):
        pytest.skip("no direct default for this op here")
    values, lengths, offsets, sel, b = _kjt_select_args()
    out = torch.ops.torchrec_ascend.keyed_jagged_index_select_dim1(values, lengths, offsets, sel, b)
    assert python_calls == [], "the Python kernel ran"
    with ops.use_backend("reference", ops=[op]):
        ref = torch.ops.torchrec_ascend.keyed_jagged_index_select_dim1(values, lengths, offsets,
                                                                       sel, b)
    assert python_calls == [(op, "cpu")]
    for a, r in zip(out, ref):
        torch.testing.assert_close(a, r, rtol=0, atol=0)
    # a gradient to record takes the Python autograd formula; none to record stays in C++
    v = values.clone().requires_grad_()
    got = torch.ops.torchrec_ascend.keyed_jagged_index_select_dim1(v, lengths, offsets, sel, b)
    assert got[0].grad_fn is not None
    got[0].sum().backward()
    torch.testing.assert_close(v.grad, torch.tensor([0., 0., 0., 1., 1., 1.]))
    with torch.no_grad():
        got = torch.ops.torchrec_ascend.keyed_jagged_index_select_dim1(v, lengths, offsets, sel, b)
    assert got[0].grad_fn is None
    assert python_calls == [(op, "cpu")], "the csrc kernel did not serve the gradient-less calls"


def _spy_reference(monkeypatch, op: str) -> list:
    """Record the calls of ``op``'s reference implementation (the list is returned)."""
    s = registry.spec(op)
    calls = []
    real = s.reference

    def spy(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(s, "reference", spy)
    return calls


def test_forcing_reaches_the_direct_ops(python_calls, monkeypatch, reread):
    """use_backend and $TORCHREC_ASCEND_BACKEND (once read) pick the backend of a direct op;
    leaving use_backend gives the csrc kernel back."""
    op = "asynchronous_complete_cumsum"
    if op not in _direct_ops():
        pytest.skip("C++ extension not built")
    ref_calls = _spy_reference(monkeypatch, op)
    x = torch.tensor([3, 0, 2], dtype=torch.int64)
    want = torch.tensor([0, 3, 3, 5])
    call = torch.ops.torchrec_ascend.asynchronous_complete_cumsum
    with ops.use_backend("cpu_kernel", ops=[op]):
        assert registry.routes_direct(op)
        torch.testing.assert_close(call(x), want)
        assert not ref_calls and not python_calls
        with ops.use_backend("reference", ops=[op]):
            assert not registry.routes_direct(op)
            assert registry.choose(op, "cpu")[0] == "reference"
            torch.testing.assert_close(call(x), want)
            assert len(ref_calls) == 1 and python_calls == [(op, "cpu")]
        assert registry.routes_direct(op), "leaving use_backend did not restore the csrc kernel"
        torch.testing.assert_close(call(x), want)
        assert len(ref_calls) == 1 and len(python_calls) == 1
        # use_backend outranks the environment variable: the csrc kernel stays
        monkeypatch.setenv(registry.ENV_BACKEND, "reference")
        reread()
        assert registry.choose(op, "cpu")[0] == "cpu_kernel" and registry.routes_direct(op)
    # outside the block the variable decides: the Python kernel runs the reference
    assert registry.choose(op, "cpu")[0] == "reference" and not registry.routes_direct(op)
    torch.testing.assert_close(call(x), want)
    assert len(ref_calls) == 2 and len(python_calls) == 2


def test_environment_variable_reaches_direct_ops_when_read(python_calls, monkeypatch, reread):
    op = "keyed_jagged_index_select_dim1"
    if not registry.routes_direct(op):
        pytest.skip("no direct default for this op here")
    ref_calls = _spy_reference(monkeypatch, op)
    args = _kjt_select_args()
    call = torch.ops.torchrec_ascend.keyed_jagged_index_select_dim1
    want = call(*args)
    monkeypatch.setenv(registry.ENV_BACKEND, "reference")
    reread()
    assert registry.choose(op, "cpu")[0] == "reference" and not registry.routes_direct(op)
    for a, b in zip(call(*args), want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert len(ref_calls) == 1 and python_calls == [(op, "cpu")]
    monkeypatch.setenv(registry.ENV_BACKEND, f"{op}=cpu_kernel")
    reread()
    assert registry.routes_direct(op)
    call(*args)  # straight to the csrc kernel
    assert len(ref_calls) == 1 and len(python_calls) == 1


def test_direct_kernel_errors_and_replace_fbgemm(python_calls):
    op = "invert_permute"
    if op not in _direct_ops():
        pytest.skip("C++ extension not built")
    with ops.use_backend("cpu_kernel", ops=[op], replace_fbgemm=True):
        with pytest.raises(ValueError, match="permute"):
            torch.ops.torchrec_ascend.invert_permute(torch.tensor([0, 5]))
        assert not python_calls
        # torch.ops.fbgemm.<op> goes through the registry's Python kernel (which reports the call)
        got = torch.ops.fbgemm.invert_permute(torch.tensor([2, 0, 1]))
        assert python_calls == [(op, "cpu")]
    torch.testing.assert_close(got, torch.tensor([1, 2, 0]))


def test_observe_reports_the_backend_of_each_call():
    seen = []
    x = torch.tensor([3, 0, 2])
    with registry.observe(lambda *call: seen.append(call)):
        with ops.use_backend("reference", ops=["asynchronous_exclusive_cumsum"]):
            torch.ops.torchrec_ascend.asynchronous_exclusive_cumsum(x)
    torch.ops.torchrec_ascend.asynchronous_exclusive_cumsum(x)  # not observed any more
    assert seen == [("asynchronous_exclusive_cumsum", "cpu", "reference")]
