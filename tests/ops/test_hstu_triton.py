"""Triton HSTU attention kernels (ops/triton/hstu.py) under ``TRITON_INTERPRET=1`` on CPU tensors:
forward and backward (dq, dk, dv, d pos_w, d ts_w) against the padded reference evaluated in
float64, ragged lengths with 0, 1 and the max, several tiles per sequence, targets, contextual
prefix, both normalisations; poisoned output buffers, fresh inputs per check; exact time buckets;
the registry's choice on cuda/npu; the GPU benchmark's interpreter smoke mode.

bf16 is not checked here: triton 3.9's interpreter gets ``tl.dot`` on bf16 operands wrong (a bare
16x16 bf16 dot kernel is off by ~1e10), so bf16 is covered by the GPU benchmark's correctness
stage (benchmarks/gpu/hstu_attention.py) on a real device instead."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

import torchrec_ascend.ops as ops  # noqa: E402
from torchrec_ascend.ops import registry  # noqa: E402
from torchrec_ascend.ops.hstu import hstu_mha  # noqa: E402
from torchrec_ascend.ops.reference import hstu as ref  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def th():
    """The kernel module, imported (or re-imported) with TRITON_INTERPRET=1 so its kernels are
    interpreted; the variable is unset again after this module's tests."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        from triton.runtime.interpreter import InterpretedFunction

        mod = importlib.import_module("torchrec_ascend.ops.triton.hstu")
        if not isinstance(mod._q_tile_kernel, InterpretedFunction):
            mod = importlib.reload(mod)
        yield mod


# --------------------------------------------------------------------------- inputs and oracle


def _case(lengths, *, msl, num_targets=None, ctx=0, by_len=False, pos=True, time=True, dv=16,
          H=2, d=16, dtype=torch.float32, seed=0, num_buckets=10):
    """Fresh random inputs (the op's positional arguments) for one configuration."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths, dtype=torch.int64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    T = int(offsets[-1])
    mk = lambda *s: (torch.randn(*s, generator=g) * 0.6).to(dtype)
    nt = torch.tensor(num_targets, dtype=torch.int64) if num_targets is not None else None
    ts = torch.exp(torch.rand(T, generator=g) * 14).long().cumsum(0) if time else None
    return [mk(T, H, d), mk(T, H, d), mk(T, H, dv), offsets, 0.37, msl, by_len, nt, ctx,
            mk(2 * msl - 1) if pos else None, mk(num_buckets + 1) if time else None, ts]


def _f64(args):
    return [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]


def _oracle(args, grad):
    """Forward and gradients of the padded reference, in float64."""
    a64 = _f64(args)
    out = ref.hstu_mha(*a64)
    grads = ref.hstu_mha_backward(grad.double(), *a64)
    return out, grads


def _close(got, want, what, rtol=1e-4, atol=2e-5):
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol,
                               msg=lambda m: f"{what}: {m}")


NAMES = ("dq", "dk", "dv", "d_pos_w", "d_ts_w")

# lengths, max_seq_len, num_targets, contextual, norm_by_len, pos, time, dv
CASES = [
    ([5, 0, 37], 37, None, 0, False, True, True, 16),
    ([1, 37, 12], 40, [1, 4, 0], 0, True, True, True, 16),
    # a whole sequence of targets (n - c + 1 - nt < 0) and a padded value dim
    ([37, 20, 1], 37, [5, 20, 0], 3, False, True, True, 8),
    ([0, 33], 33, None, 5, True, False, True, 16),
    ([17, 1, 0], 17, [2, 1, 0], 0, False, False, False, 16),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_kernels_match_reference_fwd_bwd(th, case):
    lengths, msl, nt, ctx, by_len, pos, time, dv = CASES[case]
    args = _case(lengths, msl=msl, num_targets=nt, ctx=ctx, by_len=by_len, pos=pos, time=time,
                 dv=dv, seed=case)
    T, H = args[0].shape[:2]
    # poisoned buffers (NaN, or a 1e30 sentinel that a partial overwrite would leave visible):
    # every element the kernels own must be written
    poison = float("nan") if case % 2 == 0 else 1.0e30
    out = torch.full((T, H, dv), poison)
    got = th.hstu_mha_fwd(*args, out=out, block_m=16, block_n=16)
    assert got is out
    grad = torch.randn(T, H, dv)
    bufs = (torch.full_like(args[0], poison), torch.full_like(args[1], poison),
            torch.full_like(args[2], poison))
    grads = th.hstu_mha_bwd(grad, *args, outs=bufs, block_m=16, block_n=16)
    want, want_grads = _oracle(args, grad)
    _close(got, want, "out")
    for name, g, w in zip(NAMES, grads, want_grads):
        assert g.shape == w.shape, name
        _close(g, w, name)
    # the grad of an absent table is empty; of a present one, really exercised
    assert (grads[3].numel() > 0) == pos and (grads[4].numel() > 0) == time


def test_through_the_op_and_autograd(th, monkeypatch, reread):
    """The public entry + registry + autograd run the Triton kernels (default tiles) on cpu."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    reread()
    args = _case([9, 1, 40], msl=40, num_targets=[2, 0, 3], ctx=2, seed=11)
    q, k, v, offsets, alpha, msl, by_len, nt, ctx, pos_w, ts_w, ts = args
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, pos_w, ts_w)]
    with ops.use_backend("triton", ops=["hstu_mha", "hstu_mha_backward"], device="cpu"):
        assert registry.choose("hstu_mha", "cpu")[0] == "triton"
        assert registry.choose("hstu_mha_backward", "cpu")[0] == "triton"
        out = hstu_mha(leaves[0], leaves[1], leaves[2], offsets, max_seq_len=msl, alpha=alpha,
                       normalization="max_len", num_targets=nt, contextual_seq_len=ctx,
                       pos_w=leaves[3], ts_w=leaves[4], timestamps=ts)
        grad = torch.randn_like(out)
        out.backward(grad)
    want, want_grads = _oracle(args, grad)
    _close(out.detach(), want, "out")
    for name, leaf, w in zip(NAMES, leaves, want_grads):
        _close(leaf.grad, w, name)


def test_fresh_inputs_give_their_own_results(th):
    """Same shapes, new random values: results follow the inputs (nothing cached between calls)."""
    outs = []
    for seed in (21, 22):
        args = _case([12, 3], msl=12, seed=seed)
        got = th.hstu_mha_fwd(*args)
        _close(got, _oracle(args, torch.zeros_like(got))[0], f"out (seed {seed})")
        outs.append(got)
    assert not torch.allclose(outs[0], outs[1])


def test_float64_is_tight(th):
    args = _case([19, 1, 0], msl=20, num_targets=[3, 1, 0], ctx=2, by_len=True, dtype=torch.float64,
                 seed=5)
    grad = torch.randn(args[0].shape[0], 2, 16, dtype=torch.float64)
    got = th.hstu_mha_fwd(*args, block_m=16, block_n=16)
    grads = th.hstu_mha_bwd(grad, *args, block_m=16, block_n=16)
    want, want_grads = _oracle(args, grad)
    _close(got, want, "out", rtol=1e-10, atol=1e-12)
    for name, g, w in zip(NAMES, grads, want_grads):
        _close(g, w, name, rtol=1e-10, atol=1e-12)


def test_float16_inputs(th):
    args = _case([14, 1], msl=14, num_targets=[2, 0], dtype=torch.float16, seed=6)
    grad = torch.randn(args[0].shape[0], 2, 16).half()
    got = th.hstu_mha_fwd(*args)
    grads = th.hstu_mha_bwd(grad, *args)
    assert got.dtype == torch.float16 and all(g.dtype == torch.float16 for g in grads)
    want, want_grads = _oracle(args, grad)
    _close(got, want, "out", rtol=2e-2, atol=2e-3)
    for name, g, w in zip(NAMES, grads, want_grads):
        _close(g, w, name, rtol=2e-2, atol=2e-2)


def test_empty_batch_and_no_rows(th):
    for lengths in ([0, 0], []):
        args = _case(lengths or [0], msl=4, seed=8)
        if not lengths:
            args[3] = torch.zeros(1, dtype=torch.int64)
        out = th.hstu_mha_fwd(*args)
        assert out.shape == (0, 2, 16)
        dq, dk, dv, dpos, dts = th.hstu_mha_bwd(torch.zeros(0, 2, 16), *args)
        assert dq.shape == (0, 2, 16) and dpos.shape == (7,) and bool((dpos == 0).all())
        assert dts.shape == (11,) and bool((dts == 0).all())


# --------------------------------------------------------------------------- time buckets


def test_time_bucket_thresholds_are_the_reference_boundaries(th):
    nb = 128
    thr = th.time_bucket_thresholds(nb, torch.device("cpu"))
    assert thr.shape == (nb + 2,) and thr[0] == 0 and thr[-1] == 2 ** 63 - 1
    inner = thr[1:-1]
    assert bool((inner[1:] >= inner[:-1]).all())
    ks = torch.arange(1, nb + 1)
    assert bool((ref.time_buckets(inner, nb) >= ks).all())      # thr[k] reaches bucket k ...
    assert bool((ref.time_buckets(inner - 1, nb) < ks).all())   # ... and thr[k] - 1 does not


def test_kernel_buckets_exact_at_every_boundary(th):
    """Timestamps whose differences to the first token are exactly thr[k] and thr[k] - 1: a bucket
    off by one anywhere changes the output by >= silu'(.) * 0.5 / N (ts_w steps by 0.5).  All 128
    buckets: past ~2**24 an fp32 log alone cannot tell thr[k] - 1 from thr[k]."""
    nb = 128
    thr = th.time_bucket_thresholds(nb, torch.device("cpu"))[1:-1]
    gaps = torch.stack([thr - 1, thr], 1).flatten()
    ts = torch.cat([torch.zeros(2, dtype=torch.int64), gaps])  # ts[i + 1] - ts[0] = gaps[i - 1]
    n = ts.numel()
    args = _case([n], msl=n, pos=False, num_buckets=nb, seed=9)
    args[10] = torch.arange(nb + 1, dtype=torch.float32) * 0.5
    args[11] = ts
    got = th.hstu_mha_fwd(*args)
    _close(got, _oracle(args, torch.zeros_like(got))[0], "out", rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- registry, benchmark


def test_registry_picks_triton_on_cuda_and_npu(reread):
    for name in ("hstu_mha", "hstu_mha_backward"):
        assert registry.spec(name).triton is not None
    # as on a machine with a GPU / with triton-ascend: triton usable there, not on plain cpu
    reread(triton_devices=frozenset({"cuda", "npu"}), forcing="")
    rows = {(op, dev): (backend, why) for op, dev, backend, why in registry.describe_rows()
            if op in ("hstu_mha", "hstu_mha_backward")}
    for op in ("hstu_mha", "hstu_mha_backward"):
        assert rows[(op, "cuda")] == ("triton", "triton kernel")
        assert rows[(op, "npu")] == ("triton", "triton kernel")
        assert rows[(op, "cpu")][0] in ("cpu_kernel", "reference")


def test_gpu_benchmark_interpret_smoke():
    """benchmarks/gpu/hstu_attention.py --interpret-smoke: its correctness stage on CPU tensors."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=REPO)
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "gpu", "hstu_attention.py"),
         "--interpret-smoke"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "correctness: PASS" in proc.stdout
