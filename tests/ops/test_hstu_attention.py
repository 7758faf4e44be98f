"""torchrec_ascend::hstu_mha (fused jagged HSTU attention): every backend against an independent
float64 per-sequence oracle, forward and backward (q, k, v and both bias tables)."""

from __future__ import annotations

import math
from typing import Optional

import pytest
import torch
import torch.nn.functional as F

import torchrec_ascend.ops as ops
from torchrec_ascend.ops import extension as cpu, registry
from torchrec_ascend.ops.hstu import hstu_mha


# --------------------------------------------------------------------------- oracle


def _allowed(i: int, j: int, n: int, nt: int, c: int) -> bool:
    """The mask, written out in words (not Meta's id arithmetic)."""
    if i == j or j < c:                # self; contextual tokens are visible to everyone
        return True
    history_end = n - nt               # tokens [history_end, n) are targets
    if i < c or i >= history_end:      # contextual rows and targets see the whole history
        return j < history_end
    return j < i                       # causal


def _bucket(dt: int, nb: int) -> int:
    return min(max(int(math.floor(math.log(max(abs(dt), 1)) / 0.301)), 0), nb)


def oracle(q, k, v, offsets, alpha, max_seq_len, by_len, num_targets, c, pos_w, ts_w, ts):
    """float64, one sequence at a time, Python loops for mask and bias."""
    q, k, v = q.double(), k.double(), v.double()
    pos_w = pos_w.double() if pos_w is not None else None
    ts_w = ts_w.double() if ts_w is not None else None
    outs = []
    for b in range(offsets.numel() - 1):
        s0, s1 = int(offsets[b]), int(offsets[b + 1])
        n = s1 - s0
        nt = int(num_targets[b]) if num_targets is not None else 0
        if n == 0:
            continue
        mask = torch.tensor([[float(_allowed(i, j, n, nt, c)) for j in range(n)] for i in range(n)],
                            dtype=torch.float64)
        bias = torch.zeros(n, n, dtype=torch.float64)
        if pos_w is not None:
            bias = bias + pos_w[torch.tensor([[max_seq_len - 1 + j - i for j in range(n)] for i in range(n)])]
        if ts_w is not None:
            t = [int(x) for x in ts[s0:s1]]
            buckets = [[_bucket(t[min(i + 1, n - 1)] - t[j], ts_w.numel() - 1) for j in range(n)]
                       for i in range(n)]
            bias = bias + ts_w[torch.tensor(buckets)]
        norm = n if by_len else max_seq_len
        s = alpha * torch.einsum("ihd,jhd->hij", q[s0:s1], k[s0:s1]) + bias
        p = F.silu(s) / norm * mask
        outs.append(torch.einsum("hij,jhd->ihd", p, v[s0:s1]))
    if not outs:
        return q.new_zeros((0, q.shape[1], v.shape[2])) + 0 * q.sum()
    return torch.cat(outs)


# --------------------------------------------------------------------------- inputs


def _case(lengths, H=2, dqk=8, dv=6, max_seq_len=None, targets=False, c=0, pos=True, time=True,
          dtype=torch.float32, seed=0, unsorted=False):
    """Seeded inputs; ``targets``: True (random counts 0..3) or an explicit list; ``unsorted``:
    timestamps in random order (the kernels' general time-bucket path; sorted ones take the
    grouped path)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths, dtype=torch.int64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    T = int(offsets[-1])
    max_seq_len = max_seq_len or max(int(lengths.max()), 1)
    mk = lambda *s: (torch.randn(*s, generator=g) * 0.5).to(dtype)
    args = dict(
        q=mk(T, H, dqk), k=mk(T, H, dqk), v=mk(T, H, dv), offsets=offsets,
        max_seq_len=max_seq_len, alpha=0.7,
        num_targets=(torch.tensor(targets, dtype=torch.int64) if isinstance(targets, (list, tuple)) else
                     torch.minimum(torch.randint(0, 4, (len(lengths),), generator=g),
                                   (lengths - c).clamp(min=0)) if targets else None),
        contextual_seq_len=c,
        pos_w=mk(2 * max_seq_len - 1) if pos else None,
        ts_w=mk(9) if time else None,
        # heavy-tailed gaps so that many buckets (and the clamp at 8) are hit
        timestamps=(torch.exp(torch.rand(T, generator=g) * 12).long().cumsum(0) if time else None),
    )
    if unsorted and time:
        args["timestamps"] = args["timestamps"][torch.randperm(T, generator=g)]
    return args


def _run(args, normalization, backend):
    leaves = {n: args[n].clone().requires_grad_(True) for n in ("q", "k", "v", "pos_w", "ts_w")
              if args[n] is not None}
    kw = {**args, **leaves}
    with ops.use_backend(backend, ops=["hstu_mha", "hstu_mha_backward"], device="cpu"):
        out = hstu_mha(normalization=normalization, **kw)
        grad = torch.randn_like(out)
        out.backward(grad)
    return out, grad, leaves


def _oracle_of(args, leaves, grad, normalization):
    """The float64 oracle's output and leaves (with .grad) on the same values as ``leaves``."""
    ref_leaves = {n: t.detach().double().requires_grad_(True) for n, t in leaves.items()}
    full = {**args, **ref_leaves}
    expect = oracle(full["q"], full["k"], full["v"], args["offsets"], args["alpha"],
                    args["max_seq_len"], normalization == "seq_len", args["num_targets"],
                    args["contextual_seq_len"], full["pos_w"], full["ts_w"], args["timestamps"])
    expect.backward(grad.double())
    return expect, ref_leaves


def _check(backend, args, normalization="max_len", rtol=2e-4, atol=2e-5):
    out, grad, leaves = _run(args, normalization, backend)
    expect, ref_leaves = _oracle_of(args, leaves, grad, normalization)
    torch.testing.assert_close(out.double(), expect.detach(), rtol=rtol, atol=atol)
    for n, t in leaves.items():
        assert t.grad is not None, n
        torch.testing.assert_close(t.grad.double(), ref_leaves[n].grad, rtol=rtol, atol=atol,
                                   msg=lambda m, n=n: f"grad of {n}: {m}")


LENGTHS = [[5, 0, 1, 12, 3], [12], [0, 0, 2], [7, 12, 1, 9]]

# (lengths, max_seq_len, targets, contextual, normalization, pos, time)
CASES = [
    (LENGTHS[0], 12, False, 0, "max_len", True, True),
    (LENGTHS[0], 16, True, 0, "seq_len", True, True),
    (LENGTHS[3], 12, True, 2, "max_len", True, True),
    (LENGTHS[1], 12, False, 3, "seq_len", False, True),
    (LENGTHS[2], 4, False, 0, "max_len", True, False),
    (LENGTHS[3], 13, False, 0, "seq_len", False, False),
    # several 64-row tiles: diagonal tiles, contextual rows above the diagonal, targets
    ([150, 0, 1, 64, 65, 3], 150, True, 3, "max_len", True, True),
    # the ranker's candidates: 0, 1 and every token a target, with and without contextual rows
    ([6, 1, 0, 9, 4], 9, [0, 1, 0, 9, 1], 0, "max_len", True, True),
    ([6, 3, 9, 2], 12, [0, 1, 7, 0], 2, "seq_len", True, True),
]


def _backends():
    out = ["reference"]
    if cpu.kernel("hstu_mha_fwd") is not None:
        out.append("cpu_kernel")
    return out


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("case", range(len(CASES)))
def test_backend_matches_oracle_fwd_bwd(backend, case):
    lengths, msl, targets, c, norm, pos, time = CASES[case]
    args = _case(lengths, max_seq_len=msl, targets=targets, c=c, pos=pos, time=time, seed=case)
    _check(backend, args, norm)


@pytest.mark.parametrize("backend", _backends())
def test_float64_is_tight(backend):
    args = _case([6, 1, 0, 11], max_seq_len=11, targets=True, c=1, dtype=torch.float64, seed=7)
    _check(backend, args, "max_len", rtol=1e-10, atol=1e-12)


def test_triton_interpreted_matches_oracle(monkeypatch, reread):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    reread()
    if registry.spec("hstu_mha").triton is None:
        pytest.skip("no triton implementation")
    for case in (0, 2, 3):
        lengths, msl, targets, c, norm, pos, time = CASES[case]
        args = _case(lengths, max_seq_len=msl, targets=targets, c=c, pos=pos, time=time, seed=case)
        _check("triton", args, norm)


def test_output_poison_and_fresh_inputs_each_call():
    # two calls with different random inputs must give different, finite outputs (no stale buffer)
    a = _case([4, 9], max_seq_len=9, seed=1)
    b = _case([4, 9], max_seq_len=9, seed=2)
    oa = hstu_mha(**a)
    ob = hstu_mha(**b)
    assert torch.isfinite(oa).all() and torch.isfinite(ob).all()
    assert not torch.allclose(oa, ob)


def test_default_cpu_backend_is_the_kernel_when_built():
    backend, _ = registry.choose("hstu_mha", "cpu")
    expected = "cpu_kernel" if cpu.kernel("hstu_mha_fwd") is not None else "reference"
    assert backend == expected
    assert registry.choose("hstu_mha_backward", "cpu")[0] == expected


def test_registered_as_torchrec_ascend_only():
    for name in ("hstu_mha", "hstu_mha_backward"):
        assert not registry.spec(name).fbgemm
        assert not hasattr(torch.ops.fbgemm, name) or name not in dir(torch.ops.fbgemm)


def test_opcheck():
    args = _case([3, 0, 5], max_seq_len=5, targets=True, seed=3)
    for t in ("q", "k", "v", "pos_w", "ts_w"):
        args[t] = args[t].requires_grad_(True)
    torch.library.opcheck(
        torch.ops.torchrec_ascend.hstu_mha.default,
        (args["q"], args["k"], args["v"], args["offsets"], 0.7, 5, False, args["num_targets"], 0,
         args["pos_w"], args["ts_w"], args["timestamps"]),
        test_utils=("test_schema", "test_faketensor", "test_autograd_registration"),
    )


@pytest.mark.parametrize("bad, match", [
    (dict(offsets=torch.tensor([0, 3, 2, 8])), "offsets: must be non-decreasing"),
    (dict(offsets=torch.tensor([0, 3, 7])), "offsets: last offset"),
    (dict(max_seq_len=4), "max_seq_len=4"),
    (dict(normalization="softmax"), "normalization"),
    (dict(num_targets=torch.tensor([0, 9])), "num_targets"),
    (dict(num_targets=torch.tensor([1])), "num_targets: expected 2"),
    (dict(pos_w=torch.zeros(3)), "pos_w: expected 15"),
    (dict(timestamps=None), "ts_w / timestamps"),
    (dict(timestamps=torch.zeros(8)), "timestamps: dtype"),
    (dict(contextual_seq_len=-1), "contextual_seq_len"),
    (dict(k=torch.zeros(8, 2, 7)), "k: shape"),
])
def test_bad_input_raises_value_error(bad, match):
    args = _case([3, 5], max_seq_len=8, seed=4)
    kw = {"normalization": "max_len", **args, **bad}
    with pytest.raises(ValueError, match=match):
        hstu_mha(**kw)


# --------------------------------------------------------------------------- csrc out-variants

from torchrec_ascend.ops.reference import hstu as ref  # noqa: E402

_needs_kernel = pytest.mark.skipif(cpu.kernel("hstu_mha_fwd_out") is None,
                                   reason="csrc extension not built")

# lengths (0, 1 and the max; several 64-row tiles), max_seq_len, targets, contextual, pos, time,
# normalization
OUT_CASES = [
    ([70, 0, 1, 130, 64, 3], 130, False, 0, False, False, "max_len"),
    ([70, 0, 1, 130, 64, 3], 130, True, 0, True, True, "seq_len"),
    ([130, 1, 0, 66], 130, True, 3, True, False, "max_len"),
    ([0, 1, 130, 9], 130, False, 2, False, True, "seq_len"),
]
POISONS = (float("nan"), 1.0e30)


def _positional(args, normalization):
    return (args["q"], args["k"], args["v"], args["offsets"], args["alpha"], args["max_seq_len"],
            normalization == "seq_len", args["num_targets"], args["contextual_seq_len"],
            args["pos_w"], args["ts_w"], args["timestamps"])


def _ref64(pos, grad):
    """Forward and (dq, dk, dv, d pos_w, d ts_w) of the padded reference in float64."""
    p64 = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in pos]
    return ref.hstu_mha(*p64), ref.hstu_mha_backward(grad.double(), *p64)


def _poisoned_run(pos, grad, poison):
    """Run both out-variants on buffers filled with ``poison``; returns (out, grads)."""
    q, k, v, pos_w, ts_w = pos[0], pos[1], pos[2], pos[9], pos[10]
    out = torch.full((q.shape[0], q.shape[1], v.shape[2]), poison, dtype=q.dtype)
    cpu.kernel("hstu_mha_fwd_out")(out, *pos)
    grads = (torch.full_like(q, poison), torch.full_like(k, poison), torch.full_like(v, poison),
             torch.full((pos_w.numel() if pos_w is not None else 0,), poison, dtype=q.dtype),
             torch.full((ts_w.numel() if ts_w is not None else 0,), poison, dtype=q.dtype))
    cpu.kernel("hstu_mha_bwd_out")(*grads, grad, *pos)
    return out, grads


@_needs_kernel
@pytest.mark.parametrize("poison", POISONS, ids=("nan", "sentinel"))
@pytest.mark.parametrize("case", range(len(OUT_CASES)))
def test_cpu_kernel_out_variants_write_every_element(case, poison):
    """Outputs poisoned before the run (NaN, then a 1e30 sentinel): forward and backward must
    overwrite every element and equal the padded reference; fresh random inputs per check."""
    lengths, msl, targets, c, pos_b, time_b, norm = OUT_CASES[case]
    seed = 100 + 2 * case + int(math.isnan(poison))
    args = _case(lengths, H=2, dqk=8, dv=6, max_seq_len=msl, targets=targets, c=c, pos=pos_b,
                 time=time_b, seed=seed)
    pos = _positional(args, norm)
    grad = torch.randn(pos[0].shape[0], 2, 6, generator=torch.Generator().manual_seed(seed))
    out, grads = _poisoned_run(pos, grad, poison)
    want, want_grads = _ref64(pos, grad)
    torch.testing.assert_close(out.double(), want, rtol=2e-4, atol=2e-5)
    for name, g, w in zip(("dq", "dk", "dv", "d_pos_w", "d_ts_w"), grads, want_grads):
        assert g.shape == w.shape, name
        torch.testing.assert_close(g.double(), w, rtol=2e-4, atol=2e-5,
                                   msg=lambda m, name=name: f"{name}: {m}")


@_needs_kernel
@pytest.mark.parametrize("poison", POISONS, ids=("nan", "sentinel"))
def test_cpu_kernel_out_variants_zero_rows_outside_sequences(poison):
    """Rows before the first offset and after the last one belong to no sequence: their outputs
    and gradients are written as 0; the rows of the sequences equal the reference on the slice."""
    lengths, lead, tail = [5, 0, 1, 70], 3, 4
    args = _case([lead + sum(lengths) + tail], H=2, dqk=8, dv=6, max_seq_len=80, targets=False,
                 c=1, seed=7 + int(math.isnan(poison)))
    inner = torch.tensor([0] + lengths).cumsum(0)
    args["offsets"] = inner + lead
    args["max_seq_len"] = 70
    args["pos_w"] = args["pos_w"][: 2 * 70 - 1].contiguous()
    pos = _positional(args, "max_len")
    T = pos[0].shape[0]
    grad = torch.randn(T, 2, 6, generator=torch.Generator().manual_seed(9))
    out, grads = _poisoned_run(pos, grad, poison)
    rows = slice(lead, T - tail)
    sliced = list(pos)
    sliced[3] = inner
    for i in (0, 1, 2, 11):
        sliced[i] = pos[i][rows]
    want, want_grads = _ref64(sliced, grad[rows])
    torch.testing.assert_close(out[rows].double(), want, rtol=2e-4, atol=2e-5)
    for g, w in zip(grads[:3], want_grads[:3]):
        torch.testing.assert_close(g[rows].double(), w, rtol=2e-4, atol=2e-5)
    for g, w in zip(grads[3:], want_grads[3:]):
        torch.testing.assert_close(g.double(), w, rtol=2e-4, atol=2e-5)
    for t in (out,) + grads[:3]:
        assert bool((t[:lead] == 0).all()) and bool((t[T - tail:] == 0).all())


@_needs_kernel
def test_cpu_kernel_out_variants_half_precision():
    """fp16 outputs (computed in fp32, then copied into the caller's buffers), poisoned first."""
    args = _case([0, 1, 20, 7], max_seq_len=20, targets=True, c=1, dtype=torch.float16, seed=31)
    pos = _positional(args, "max_len")
    grad = torch.randn(pos[0].shape[0], 2, 6).half()
    out, grads = _poisoned_run(pos, grad, float("nan"))
    assert out.dtype == torch.float16 and all(g.dtype == torch.float16 for g in grads)
    want, want_grads = _ref64(pos, grad)
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-3)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g.double(), w, rtol=2e-2, atol=2e-2)


@_needs_kernel
@pytest.mark.parametrize("which, bad, match", [
    ("fwd", lambda t: t[:, :, :5], "out: shape"),
    ("fwd", lambda t: t.double(), "out: dtype"),
    ("fwd", lambda t: t.transpose(0, 1).contiguous().transpose(0, 1), "out: must be contiguous"),
    ("fwd", lambda t: t.to("meta"), "out: must be a CPU tensor"),
    ("bwd", lambda t: t[:-1], "dq: shape"),
    ("bwd", lambda t: t.double(), "dq: dtype"),
])
def test_cpu_kernel_out_variants_reject_bad_buffers(which, bad, match):
    args = _case([3, 5], max_seq_len=8, seed=4)
    pos = _positional(args, "max_len")
    q, k, v = pos[:3]
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2])
    if which == "fwd":
        with pytest.raises(ValueError, match=match):
            cpu.kernel("hstu_mha_fwd_out")(bad(out), *pos)
    else:
        grads = [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
                 torch.empty_like(pos[9]), torch.empty_like(pos[10])]
        grads[0] = bad(grads[0])
        with pytest.raises(ValueError, match=match):
            cpu.kernel("hstu_mha_bwd_out")(*grads, torch.zeros_like(out), *pos)
    # the table gradients must match their tables
    grads = [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty(3),
             torch.empty_like(pos[10])]
    with pytest.raises(ValueError, match="dpos: shape"):
        cpu.kernel("hstu_mha_bwd_out")(*grads, torch.zeros_like(out), *pos)


@_needs_kernel
def test_cpu_kernel_extreme_scores():
    """Scores far beyond the fp32 exp range (|alpha q.k| up to a few hundred): the vectorised SiLU
    (clamped polynomial exp, branch-free masking) stays finite and equals the reference."""
    args = _case([0, 1, 70, 33], H=2, dqk=8, dv=6, max_seq_len=70, targets=True, c=2, seed=41)
    args["q"] = args["q"] * 12
    args["k"] = args["k"] * 12
    pos = _positional(args, "max_len")
    grad = torch.randn(pos[0].shape[0], 2, 6, generator=torch.Generator().manual_seed(42))
    out, grads = _poisoned_run(pos, grad, float("nan"))
    want, want_grads = _ref64(pos, grad)
    assert float(want.abs().max()) > 1.0  # large scores really reached the output
    torch.testing.assert_close(out.double(), want, rtol=2e-4, atol=1e-4)
    for name, g, w in zip(("dq", "dk", "dv", "d_pos_w", "d_ts_w"), grads, want_grads):
        scale = max(float(w.abs().max()), 1.0)
        torch.testing.assert_close(g.double(), w, rtol=2e-4, atol=1e-4 * scale,
                                   msg=lambda m, name=name: f"{name}: {m}")


# --------------------------------------------------------------------------- every engine
#
# The csrc backend runs each dtype on a micro-kernel ("engine") it picks per CPU by timing
# (ops.hstu_engines.cpu_engine); every engine that runs on this CPU is forced here in turn.  Lengths cover
# 0, 1 and the max and several of the kernels' blocks (forward: 32 rows, 128-row bias blocks,
# 128-key segments; backward: 64 x 64 tiles).

from torchrec_ascend import device  # noqa: E402
from torchrec_ascend.ops import hstu_engines as hstu_ops  # noqa: E402

ENGINE_CASES = [
    # lengths, max_seq_len, targets, contextual, normalization, pos, time, unsorted timestamps
    ([300, 0, 129, 1, 128], 300, True, 3, "seq_len", True, True, False),
    ([257, 64, 1], 257, [0, 1, 1], 0, "max_len", True, True, False),
    ([200, 65, 0, 33], 200, False, 0, "max_len", True, True, True),
    ([130, 2, 70], 130, [1, 0, 5], 2, "max_len", False, True, True),
    ([257, 64], 257, False, 0, "max_len", False, False, False),
]


def _engines(dtype):
    return hstu_ops.cpu_engines(dtype) if cpu.kernel("hstu_engines") is not None else []


@pytest.fixture(params=[1, 2], ids=("1thread", "2threads"))
def threads(request):
    """torch's (= OpenMP's) thread count for the test: on one thread every backward task holds a
    whole sequence; on several a long one is cut into key ranges whose dQ partials are added up
    at the end, and the forward's query rows too (csrc/hstu_driver.h: row_tasks, DqSplit)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.fixture
def engine():
    """force(dtype, name): run the csrc attention of dtype on engine `name`; the backend's own
    choice is restored (measured again on next use) afterwards."""
    forced = []

    def force(dtype, name):
        hstu_ops.set_cpu_engine(dtype, name)
        forced.append(dtype)

    yield force
    for dtype in forced:
        hstu_ops.set_cpu_engine(dtype, None)


def _check_bf16(args, normalization):
    """bf16 output and gradients vs the float64 oracle on the same (bf16-rounded) inputs.

    The GEMM operands are bf16 (P and dS rounded once, unit roundoff u = 2^-8 relative) with fp32
    accumulation, the SiLU stage evaluates exp and 1/x to bf16 accuracy (|rel err| < 5e-4), and
    outputs are rounded to bf16: errors of a few u relative to the output's scale; the tolerance
    is 3e-2 of each tensor's largest magnitude (plus 3e-2 relative), far below what a wrong mask,
    bias or missing tile gives (O(1) of the scale)."""
    out, grad, leaves = _run(args, normalization, "cpu_kernel")
    assert out.dtype == torch.bfloat16
    expect, ref_leaves = _oracle_of(args, leaves, grad, normalization)
    pairs = [("out", out, expect.detach())] + [
        (f"grad of {n}", t.grad, ref_leaves[n].grad) for n, t in leaves.items()]
    for name, got, want in pairs:
        assert got is not None and got.dtype == torch.bfloat16, name
        scale = float(want.abs().max()) if want.numel() else 0.0
        torch.testing.assert_close(got.double(), want, rtol=3e-2, atol=3e-2 * scale + 1e-6,
                                   msg=lambda m, name=name: f"{name}: {m}")


@_needs_kernel
@pytest.mark.parametrize("name", _engines(torch.float32))
@pytest.mark.parametrize("case", range(len(ENGINE_CASES)))
def test_cpu_float32_engines_match_float64_oracle(name, case, engine, threads):
    lengths, msl, targets, c, norm, pos, time, unsorted = ENGINE_CASES[case]
    engine(torch.float32, name)
    args = _case(lengths, H=2, dqk=16, dv=8, max_seq_len=msl, targets=targets, c=c, pos=pos, time=time,
                 seed=50 + case, unsorted=unsorted)
    _check("cpu_kernel", args, norm)


@_needs_kernel
@pytest.mark.parametrize("name", _engines(torch.bfloat16))
@pytest.mark.parametrize("case", range(len(ENGINE_CASES)))
def test_cpu_bfloat16_engines_match_float64_oracle(name, case, engine, threads):
    lengths, msl, targets, c, norm, pos, time, unsorted = ENGINE_CASES[case]
    engine(torch.bfloat16, name)
    args = _case(lengths, H=2, dqk=16, dv=8, max_seq_len=msl, targets=targets, c=c, pos=pos, time=time,
                 dtype=torch.bfloat16, seed=70 + case, unsorted=unsorted)
    _check_bf16(args, norm)


@_needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_engines_at_the_papers_head_dim(dtype, engine, threads):
    """d = 64 (the kernels' full tiles, no padding of the head dimension), 4 heads."""
    args = _case([190, 64, 1], H=4, dqk=64, dv=64, max_seq_len=190, targets=[0, 1, 0], c=0,
                 dtype=dtype, seed=91)
    for name in _engines(dtype):
        engine(dtype, name)
        if dtype == torch.float32:
            _check("cpu_kernel", args, "max_len", rtol=5e-4, atol=5e-5)
        else:
            _check_bf16(args, "max_len")


def _bucket_threshold(k: int) -> int:
    """The smallest x >= 1 whose time bucket (before the clamp) is at least k."""
    x = max(1, math.ceil(math.exp(0.301 * k)))
    while x > 1 and math.floor(math.log(x - 1) / 0.301) >= k:
        x -= 1
    while math.floor(math.log(x) / 0.301) < k:
        x += 1
    return x


@_needs_kernel
@pytest.mark.parametrize("name", _engines(torch.float32))
def test_cpu_float32_engines_time_buckets_across_the_int64_range(name, engine):
    """129 time buckets (the paper's table): gaps at every other bucket boundary and one below it
    (the vector engines compute the bucket's log in fp32 and must redo lanes near a boundary),
    and gaps from 2^52 (past a double's exact integers) to 2^62 (past the last bucket), in random
    order; the float64 oracle buckets each gap exactly."""
    g = torch.Generator().manual_seed(77)
    edges = [_bucket_threshold(k) for k in range(2, 129, 7)]
    first = [0] + edges + [x - 1 for x in edges]  # gaps x - 0 on and just below the boundaries
    wide = (torch.rand(40, generator=g, dtype=torch.float64) * 10 + 52).exp2()
    wide = [int(v) * (1 if i % 2 else -1) for i, v in enumerate(wide.tolist())]
    lengths = [len(first), len(wide)]
    args = _case(lengths, H=2, dqk=16, dv=8, max_seq_len=max(lengths), seed=78)
    args["ts_w"] = torch.randn(129, generator=g) * 0.5
    ts = torch.tensor(first + wide, dtype=torch.int64)
    perm = torch.cat([torch.randperm(len(first), generator=g), len(first) + torch.randperm(len(wide), generator=g)])
    args["timestamps"] = ts[perm]
    engine(torch.float32, name)
    _check("cpu_kernel", args, "max_len")


@_needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lengths,targets,c", [
    ([150, 150, 150], False, 0),
    ([400, 30, 0, 20, 1], False, 0),
    ([333, 5, 260, 64], [0, 1, 9, 0], 0),
    ([300, 7, 129], [4, 0, 2], 3),
], ids=("equal", "long-cut-short-whole", "targets", "targets-and-context"))
@pytest.mark.parametrize("nthreads", [2, 3])
def test_cpu_engines_with_sequences_cut_over_keys_on_several_threads(dtype, lengths, targets, c, nthreads, engine):
    """4 heads, 2 and 3 threads (csrc/hstu_driver.h row_tasks): the work is laid out in parts of
    equal cost (parts per thread x threads: the AVX2 engine 1, the others 4), and a sequence in
    which a part boundary falls is cut there into key ranges (the backward) or query rows (the
    forward): the middle one of three equal ones, the long one into two or three (the later
    ranges starting past query 0), the short ones whole.  Each key range sums its own dQ partial,
    added up at the end; the bias tables' gradients are summed over the tasks.  With targets and a
    contextual prefix the first query block that sees a key range moves (or, with the prefix,
    stays at 0)."""
    before = torch.get_num_threads()
    torch.set_num_threads(nthreads)
    try:
        args = _case(lengths, H=4, dqk=16, dv=8, max_seq_len=max(lengths), targets=targets, c=c,
                     dtype=dtype, seed=93)
        for name in _engines(dtype):
            engine(dtype, name)
            if dtype == torch.float32:
                _check("cpu_kernel", args, "max_len")
            else:
                _check_bf16(args, "max_len")
    finally:
        torch.set_num_threads(before)


@_needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("poison", POISONS, ids=("nan", "sentinel"))
def test_cpu_engines_write_every_element(dtype, poison, engine):
    """Every engine overwrites outputs poisoned before the run (NaN, a 1e30 sentinel)."""
    lengths, msl = [70, 0, 1, 130, 64, 3], 130
    args = _case(lengths, H=2, dqk=16, dv=8, max_seq_len=msl, targets=True, c=1, dtype=dtype,
                 seed=200 + int(math.isnan(poison)))
    pos = _positional(args, "max_len")
    grad = torch.randn(pos[0].shape[0], 2, 8, generator=torch.Generator().manual_seed(5)).to(dtype)
    want, want_grads = _ref64(pos, grad)
    tol = dict(rtol=2e-4, atol=2e-5) if dtype == torch.float32 else None
    for name in _engines(dtype):
        engine(dtype, name)
        out, grads = _poisoned_run(pos, grad, poison)
        for label, g, w in zip(("out", "dq", "dk", "dv", "d_pos_w", "d_ts_w"), (out,) + grads, (want,) + want_grads):
            assert bool(torch.isfinite(g).all()), f"{name}: {label} keeps poison"
            t = tol or dict(rtol=3e-2, atol=3e-2 * max(float(w.abs().max()), 1e-6))
            torch.testing.assert_close(g.double(), w, **t, msg=lambda m, n=name, lb=label: f"{n}, {lb}: {m}")


@_needs_kernel
@pytest.mark.parametrize("cap", [0, 1])
def test_engines_below_avx512_fall_back_to_avx2_or_blas(cap, isa_cap, engine):
    """With the vector ISA capped below AVX-512 (csrc/isa.h) the AVX-512 / AMX engines do not
    run: fp32 takes the AVX2 engine (cap AVX2, on a CPU with AVX2 + FMA) or BLAS (scalar cap),
    bf16 is widened to it; both still match the oracle."""
    isa_cap(cap)
    fp32 = ["avx2_fp32", "blas"] if cap == 1 and {"avx2", "fma"} <= device.cpu_flags() else ["blas"]
    assert _engines(torch.float32) == fp32
    assert _engines(torch.bfloat16) == ["fp32"]
    hstu_ops.set_cpu_engine(torch.float32, None)
    hstu_ops.set_cpu_engine(torch.bfloat16, None)
    try:
        assert hstu_ops.cpu_engine(torch.float32)[0] in fp32
        assert hstu_ops.cpu_engine(torch.bfloat16)[0] == "fp32"
        args = _case([70, 1, 0, 9], max_seq_len=70, targets=True, c=1, seed=13)
        _check("cpu_kernel", args, "max_len")
        args = _case([70, 1, 9], max_seq_len=70, dtype=torch.bfloat16, seed=14)
        _check_bf16(args, "max_len")
    finally:
        isa_cap(2)
        hstu_ops.set_cpu_engine(torch.float32, None)
        hstu_ops.set_cpu_engine(torch.bfloat16, None)


@_needs_kernel
def test_cpu_engine_choice_is_measured_and_reported():
    """The backend picks each dtype's engine once, by timing the candidates on this CPU, and
    says why; forcing an engine that does not exist (or not here) is a one-line error."""
    for dtype in (torch.float32, torch.bfloat16):
        hstu_ops.set_cpu_engine(dtype, None)
        name, why = hstu_ops.cpu_engine(dtype)
        assert name in _engines(dtype)
        if len(_engines(dtype)) > 1:
            assert why.startswith("measured fwd+bwd ms:") and all(e in why for e in _engines(dtype))
        assert hstu_ops.cpu_engine(dtype) == (name, why)  # made once
    with pytest.raises(ValueError, match="not an engine"):
        hstu_ops.set_cpu_engine(torch.float32, "amx_bf16")
    with pytest.raises(ValueError, match="dtype"):
        hstu_ops.cpu_engine(torch.float16)


@_needs_kernel
def test_describe_names_each_dtypes_engine_on_the_cpu_kernel_rows():
    """ops.describe(): where the csrc backend serves the HSTU ops on the CPU, the row names the
    engine each dtype runs (the forced one after set_cpu_engine); other rows say nothing of it."""
    try:
        hstu_ops.set_cpu_engine(torch.float32, "blas")
        with ops.use_backend("cpu_kernel"):
            rows = {(op, dev): (b, why) for op, dev, b, why in registry.describe_rows()
                    if op.startswith("hstu_mha")}
        want = ("engines: float32 blas, bfloat16 "
                + hstu_ops.cpu_engine(torch.bfloat16)[0])
        for op in ("hstu_mha", "hstu_mha_backward"):
            backend, why = rows[(op, "cpu")]
            assert backend == "cpu_kernel" and why.endswith(want), why
        with ops.use_backend("reference"):
            rows = registry.describe_rows(["cpu"])
        assert not any("engines" in why for op, _, _, why in rows if op.startswith("hstu_mha"))
    finally:
        hstu_ops.set_cpu_engine(torch.float32, None)
