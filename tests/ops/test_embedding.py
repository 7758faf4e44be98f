"""Table-batched embedding lookup ops (torchrec_ascend.ops.embedding).

Oracles: fbgemm's own CPU kernels (same op names and schemas, called side by side), float64
explicit loops (sequence dense lookup, Adam, row-wise Adagrad weight decay / max_norm, weighted
MEAN backward, where fbgemm-cpu has no kernel or disagrees), torch autograd of those loops.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

import torchrec_ascend.ops as ops
from torchrec_ascend.ops import embedding as E
from torchrec_ascend.ops.reference import embedding as R

fbgemm_gpu = pytest.importorskip("fbgemm_gpu")
fb = torch.ops.fbgemm
HOST = 3


ta = torch.ops.torchrec_ascend


@pytest.fixture(autouse=True)
def _ours():
    """torchrec_ascend:: ops run our reference backend here (on CPU the registry otherwise picks
    fbgemm's kernel for ops fbgemm has); torch.ops.fbgemm.* calls stay fbgemm's."""
    with ops.use_backend("reference"):
        yield


# --------------------------------------------------------------------------- inputs


def _tbe(dims=(4, 8, 3), rows=(10, 7, 5), B=5, idx_dtype=torch.int64, w_dtype=torch.float32, max_L=4,
         weighted=False, shared=False):
    """Random TBE inputs; bag lengths include 0, 1 and max_L; duplicate rows are likely."""
    T = len(dims)
    if shared:  # feature 1 reads feature 0's table
        dims, rows = (dims[0], dims[0]) + tuple(dims[2:]), (rows[0], rows[0]) + tuple(rows[2:])
    sizes = [r * d for r, d in zip(rows, dims)]
    starts, pos = [], 0
    for t in range(T):
        starts.append(starts[0] if shared and t == 1 else pos)
        pos += 0 if shared and t == 1 else sizes[t]
    # fbgemm's convention: features of a shared table repeat hash_size_cumsum before the table's step
    steps = [0 if shared and t == 0 else rows[t] for t in range(T)]
    hs = [0] + torch.tensor(steps).cumsum(0).tolist()
    weights = torch.randn(pos).to(w_dtype)
    L = torch.randint(0, max_L + 1, (T * B,))
    L[0], L[1], L[2] = 0, 1, max_L
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(L, 0)]).to(idx_dtype)
    idx = torch.cat([torch.randint(0, rows[t], (int(L[t * B:(t + 1) * B].sum()),)) for t in range(T)])
    return dict(
        weights=weights,
        weights_offsets=torch.tensor(starts, dtype=torch.int64),
        D_offsets=torch.tensor([0] + list(torch.tensor(dims).cumsum(0)), dtype=torch.int32),
        hash_size_cumsum=torch.tensor(hs, dtype=torch.int64),
        indices=idx.to(idx_dtype),
        offsets=offsets,
        psw=torch.rand(idx.numel()) if weighted else None,
        dims=list(dims), B=B, T=T,
    )


def _e(dtype=torch.float32):
    return torch.empty(0, dtype=dtype)


def _placements(T):
    return torch.full((T,), HOST, dtype=torch.int32)


def _fwd_args(x, pm, weighted, output_dtype=0):
    T = x["T"]
    return (x["weights"], _e(x["weights"].dtype), _e(x["weights"].dtype), _e(x["weights"].dtype), _placements(T),
            x["weights_offsets"], x["D_offsets"], sum(x["dims"]), max(x["dims"]), x["hash_size_cumsum"],
            x["indices"], x["offsets"], pm, x["psw"] if weighted else None, _e(torch.int32), _e(torch.int32),
            False, output_dtype)


def _nobag_args(x, output_dtype=0):
    T = x["T"]
    return (x["weights"], _e(x["weights"].dtype), _e(x["weights"].dtype), _e(x["weights"].dtype), _placements(T),
            x["weights_offsets"], x["dims"][0], x["hash_size_cumsum"], x["indices"], x["offsets"], _e(torch.int32),
            _e(torch.int32), False, output_dtype)


def _loop_pooled(x, pm, weighted):
    """float64 explicit loop: out[b, D_t slice] = sum/mean of rows (times per-sample weights)."""
    w = x["weights"].double()
    off, idx = x["offsets"].tolist(), x["indices"].tolist()
    out = torch.zeros(x["B"], sum(x["dims"]), dtype=torch.float64)
    d0 = 0
    for t, D in enumerate(x["dims"]):
        for b in range(x["B"]):
            s, e = off[t * x["B"] + b], off[t * x["B"] + b + 1]
            for p in range(s, e):
                start = int(x["weights_offsets"][t]) + idx[p] * D
                f = float(x["psw"][p]) if weighted else 1.0
                if pm == R.MEAN:
                    f /= (e - s)
                out[b, d0:d0 + D] += f * w[start:start + D]
        d0 += D
    return out


# --------------------------------------------------------------------------- forward parity

BACKENDS = FWD_BACKENDS = pytest.mark.parametrize("backend", ["reference", "cpu_kernel"])
_DENSE = ("dense_embedding_codegen_lookup_function", "dense_embedding_codegen_lookup_backward")


def _forced(backend, *names):
    """Run ``names`` on ``backend`` (skip where one has none here, e.g. the csrc extension unbuilt)."""
    for name in names:
        if backend not in [b for b, _ in ops.registry.available_backends(name, "cpu")]:
            pytest.skip(f"{name} has no {backend} backend here")
    return ops.use_backend(backend, ops=list(names))


@pytest.mark.parametrize("pm", [R.SUM, R.MEAN])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("dims", [(4, 8, 3), (8, 8, 8), (72, 136, 64)], ids=["mixed_D", "one_D", "wide_D"])
@FWD_BACKENDS
def test_pooled_forward_matches_fbgemm(pm, weighted, idx_dtype, w_dtype, dims, backend):
    x = _tbe(dims=dims, idx_dtype=idx_dtype, w_dtype=w_dtype, weighted=weighted)
    name = f"split_embedding_codegen_forward_{'weighted' if weighted else 'unweighted'}_pt2_wrapper"
    for output_dtype in (0, 1):
        args = _fwd_args(x, pm, weighted, output_dtype)
        with _forced(backend, name):
            got = getattr(ta, name)(*args)
        want = getattr(fb, name)(*args)
        if weighted and pm == R.MEAN and output_dtype == 1:
            # fbgemm-cpu's fp16-output path skips the 1/L its fp32 path applies: compare with fp32
            want = getattr(fb, name)(*_fwd_args(x, pm, weighted, 0)).half()
        assert got.dtype == want.dtype and got.shape == want.shape
        tol = 1e-5 if output_dtype == 0 else 2e-3
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    if w_dtype == torch.float32:
        with _forced(backend, name):
            got = getattr(ta, name)(*_fwd_args(x, pm, weighted))
        torch.testing.assert_close(got.double(),
                                   _loop_pooled(x, pm, weighted), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.float16])
@FWD_BACKENDS
def test_nobag_forward_matches_fbgemm(idx_dtype, w_dtype, backend):
    x = _tbe(dims=(4, 4, 4), idx_dtype=idx_dtype, w_dtype=w_dtype)
    name = "split_embedding_nobag_codegen_forward_unweighted_pt2_wrapper"
    with _forced(backend, name):
        got = getattr(ta, name)(*_nobag_args(x))
    want = getattr(fb, name)(*_nobag_args(x))
    assert got.shape == (x["indices"].numel(), 4)
    torch.testing.assert_close(got, want)


def test_nobag_forward_large_output_on_huge_pages_matches_fbgemm():
    """An output over csrc's huge-page threshold (16 MiB: madvise before the first touch) is
    still every row right: N ~ 40k ids x D=128 fp32 ~ 20 MiB, rows of a dirtied heap."""
    torch.manual_seed(7)
    junk = torch.full((6 << 20,), float("nan"))  # freed below: the allocator may hand it back
    del junk
    x = _tbe(dims=(128, 128, 128), rows=(300, 200, 100), B=256, max_L=104)
    name = "split_embedding_nobag_codegen_forward_unweighted_pt2_wrapper"
    with _forced("cpu_kernel", name):
        got = getattr(ta, name)(*_nobag_args(x))
    assert got.numel() * got.element_size() >= 16 << 20, "case too small to test the huge-page path"
    torch.testing.assert_close(got, getattr(fb, name)(*_nobag_args(x)), rtol=0, atol=0)


@FWD_BACKENDS
def test_shared_table_forward_matches_fbgemm(backend):
    x = _tbe(shared=True, weighted=True)
    for name, weighted in (("split_embedding_codegen_forward_unweighted_pt2_wrapper", False),
                           ("split_embedding_codegen_forward_weighted_pt2_wrapper", True)):
        args = _fwd_args(x, R.SUM, weighted)
        with _forced(backend, name):
            got = getattr(ta, name)(*args)
        torch.testing.assert_close(got, getattr(fb, name)(*args))


@BACKENDS
def test_grad_indice_weights_matches_fbgemm(backend):
    x = _tbe(weighted=True, max_L=6)
    grad = torch.randn(x["B"], sum(x["dims"]))
    frg = torch.tensor([1, 0, 1])
    args = (grad, x["weights"], _e(), _e(), _e(), _placements(x["T"]), x["weights_offsets"], x["D_offsets"],
            max(x["dims"]), x["indices"], x["offsets"], _e(torch.int32), frg)
    name = "split_embedding_codegen_grad_indice_weights_pt2_wrapper"
    with _forced(backend, name):
        got = getattr(ta, name)(*args)
    torch.testing.assert_close(got, getattr(fb, name)(*args))


# --------------------------------------------------------------------------- fused optimizer steps


def _state_tensors(opt, x):
    """(states, offsets) laid out as TBE does: like the weights, or one float per row."""
    if opt == "sgd":
        return []
    if opt == "rowwise_adagrad":
        hs = x["hash_size_cumsum"]
        n = int(hs[-1])
        offs = hs[:-1].clone()
        return [(torch.rand(n), offs)]
    return [(torch.rand(x["weights"].numel()), x["weights_offsets"].clone())]


def _bwd_args(x, opt, variant, grad, weights, states, lr, hyper, stochastic_rounding=False):
    nobag = variant == "nobag"
    e, ei, p = _e(weights.dtype), _e(torch.int32), _placements(x["T"])
    head = [grad, weights, e, e, e, p, x["weights_offsets"]]
    if nobag:
        head += [x["dims"][0], x["hash_size_cumsum"], 0, x["indices"], x["offsets"]]
    else:
        head += [x["D_offsets"], max(x["dims"]), True, x["hash_size_cumsum"], 0, x["indices"], x["offsets"],
                 variant[1], x["psw"] if variant[0] == "weighted" else None]
    head += [ei, 0, 0, stochastic_rounding, 0, 0, False, True]
    for s, so in states:
        head += [s, _e(), _e(), p, so]
    return head + [lr] + hyper


_VARIANTS = [("unweighted", R.SUM), ("unweighted", R.MEAN), ("weighted", R.SUM), "nobag"]


@pytest.mark.parametrize("opt", ["sgd", "adagrad", "rowwise_adagrad"])
@pytest.mark.parametrize("variant", _VARIANTS, ids=["sum", "mean", "weighted_sum", "nobag"])
@pytest.mark.parametrize("pooled_dims", [(4, 8, 3), (8, 8, 8)], ids=["mixed_D", "one_D"])
@BACKENDS
def test_fused_backward_steps_match_fbgemm(opt, variant, pooled_dims, backend):
    nobag = variant == "nobag"
    if nobag and pooled_dims == (8, 8, 8):
        pytest.skip("sequence tables have one dim: covered once")
    dims = (4, 4, 4) if nobag else pooled_dims
    name = E.backward_op_name(opt, variant != "nobag" and variant[0] == "weighted", nobag)
    x0 = _tbe(dims=dims, weighted=not nobag and variant[0] == "weighted")
    w_fb, w_ta = x0["weights"].clone(), x0["weights"].clone()
    st_fb = _state_tensors(opt, x0)
    st_ta = [(s.clone(), o) for s, o in st_fb]
    hyper = {"sgd": [], "adagrad": [0.01], "rowwise_adagrad": [0.01, 0.0, 0, 0.0]}[opt]
    lr = torch.tensor(0.05)
    for step in range(3):
        x = _tbe(dims=dims, weighted=not nobag and variant[0] == "weighted")
        rows = x["indices"].numel() if nobag else x["B"]
        grad = torch.randn(rows, 4 if nobag else sum(x["dims"]))
        r_fb = getattr(fb, name)(*_bwd_args(x, opt, variant, grad, w_fb, st_fb, lr, hyper))
        with _forced(backend, name):
            r_ta = getattr(ta, name)(*_bwd_args(x, opt, variant, grad, w_ta, st_ta, lr, hyper))
        assert r_ta is not None and r_ta.numel() == 0
        # fbgemm's kernels update in place through raw pointers: the version counters autograd
        # checks stay as they were (TorchRec runs two forwards before their backwards)
        assert [w_ta._version] + [s._version for s, _ in st_ta] == \
            [w_fb._version] + [s._version for s, _ in st_fb]
        torch.testing.assert_close(w_ta, w_fb, rtol=1e-5, atol=1e-6, msg=f"weights after step {step}")
        for (a, _), (b, _) in zip(st_ta, st_fb):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"state after step {step}")
        assert not torch.equal(w_ta, x0["weights"])


@pytest.mark.parametrize("opt", ["sgd", "rowwise_adagrad"])
@pytest.mark.parametrize("variant", _VARIANTS[:3], ids=["sum", "mean", "weighted_sum"])
@pytest.mark.parametrize("case", ["wide", "one_row", "all_empty"])
@BACKENDS
def test_fused_backward_wide_rows_match_fbgemm(opt, variant, case, backend):
    """Dims 256 / 48 / 20 (the csrc sum's AVX-512 block of 256, blocks of 16 and a tail), bags of
    length 0, 1 and max; every index on row 0 of its table (one_row: one distinct row per table,
    hit by every bag); no index at all (all_empty: the step changes nothing)."""
    torch.manual_seed(17)
    weighted = variant[0] == "weighted"
    rows = (1, 1, 1) if case == "one_row" else (6, 5, 4)
    x = _tbe(dims=(256, 48, 20), rows=rows, B=6, max_L=9, weighted=weighted)
    if case == "all_empty":
        x["indices"] = x["indices"][:0]
        x["offsets"] = torch.zeros_like(x["offsets"])
        x["psw"] = x["psw"][:0] if weighted else None
    name = E.backward_op_name(opt, weighted, False)
    w0 = x["weights"].clone()
    w_fb, w_ta = w0.clone(), w0.clone()
    st_fb = _state_tensors(opt, x)
    st_ta = [(s.clone(), o) for s, o in st_fb]
    hyper = {"sgd": [], "rowwise_adagrad": [0.01, 0.0, 0, 0.0]}[opt]
    lr = torch.tensor(0.05)
    grad = torch.randn(x["B"], sum(x["dims"]))
    getattr(fb, name)(*_bwd_args(x, opt, variant, grad, w_fb, st_fb, lr, hyper))
    with _forced(backend, name):
        getattr(ta, name)(*_bwd_args(x, opt, variant, grad, w_ta, st_ta, lr, hyper))
    torch.testing.assert_close(w_ta, w_fb, rtol=1e-5, atol=1e-6)
    for (a, _), (b, _) in zip(st_ta, st_fb):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    if case == "all_empty":
        assert torch.equal(w_ta, w0)
    else:
        assert not torch.equal(w_ta, w0)


@BACKENDS
def test_fused_sgd_fp16_weights_match_fbgemm(backend):
    x = _tbe(w_dtype=torch.float16)
    w_fb, w_ta = x["weights"].clone(), x["weights"].clone()
    grad = torch.randn(x["B"], sum(x["dims"]))
    name = E.backward_op_name("sgd", False, False)
    lr = torch.tensor(0.5)
    variant = ("unweighted", R.SUM)
    getattr(fb, name)(*_bwd_args(x, "sgd", variant, grad, w_fb, [], lr, []))
    with _forced(backend, name):
        getattr(ta, name)(*_bwd_args(x, "sgd", variant, grad, w_ta, [], lr, []))
    torch.testing.assert_close(w_ta, w_fb, rtol=1e-3, atol=1e-3)


# --------------------------------------------------------------------------- formulas fbgemm-cpu lacks


def _loop_row_grads(x, grad, pm, weighted):
    """float64 {flat row start: summed gradient} of a pooled lookup, by explicit loops."""
    out = {}
    off, idx = x["offsets"].tolist(), x["indices"].tolist()
    d0 = 0
    for t, D in enumerate(x["dims"]):
        for b in range(x["B"]):
            s, e = off[t * x["B"] + b], off[t * x["B"] + b + 1]
            for p in range(s, e):
                f = float(x["psw"][p]) if weighted else 1.0
                if pm == R.MEAN:
                    f /= (e - s)
                key = (int(x["weights_offsets"][t]) + idx[p] * D, D)
                out[key] = out.get(key, 0) + f * grad[b, d0:d0 + D].double()
        d0 += D
    return out


@BACKENDS
def test_weighted_mean_backward_is_the_gradient_of_the_forward(backend):
    # fbgemm-cpu's backward drops the 1/L of weighted MEAN that its forward applies; ours keeps it
    x = _tbe(weighted=True)
    w = x["weights"].clone()
    out = E.split_embedding_lookup(w, x["weights_offsets"], x["D_offsets"], x["indices"], x["offsets"], "sgd",
                                   1.0, pooling_mode="mean", per_sample_weights=x["psw"])
    grad = torch.randn_like(out)
    with _forced(backend, E.backward_op_name("sgd", True, False)):
        out.backward(grad)
    want = x["weights"].double().clone()
    for (start, D), g in _loop_row_grads(x, grad, R.MEAN, True).items():
        want[start:start + D] -= g
    torch.testing.assert_close(w.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode,max_norm", [(1, 0.0), (2, 0.0), (0, 0.5)])
@BACKENDS
def test_rowwise_adagrad_weight_decay_and_max_norm_formula(mode, max_norm, backend):
    x = _tbe()
    w = x["weights"].clone()
    (m, mo), = _state_tensors("rowwise_adagrad", x)
    m0 = m.clone()
    lr, eps, wd = 0.1, 1e-2, 0.3
    out = E.split_embedding_lookup(w, x["weights_offsets"], x["D_offsets"], x["indices"], x["offsets"],
                                   "rowwise_adagrad", lr, [m], [mo], eps=eps, weight_decay=wd,
                                   weight_decay_mode=mode, max_norm=max_norm)
    grad = torch.randn_like(out)
    with _forced(backend, E.backward_op_name("rowwise_adagrad", False, False)):
        out.backward(grad)
    want_w, want_m = x["weights"].double().clone(), m0.double().clone()
    for (start, D), g in _loop_row_grads(x, grad, R.SUM, False).items():
        t = int(torch.searchsorted(x["weights_offsets"], torch.tensor(start), right=True)) - 1
        row = (start - int(x["weights_offsets"][t])) // D
        mpos = int(mo[t]) + row
        w0 = want_w[start:start + D].clone()
        ge = g + wd * w0 if mode == 1 else g
        want_m[mpos] += float((ge * ge).sum()) / D
        mult = lr / (math.sqrt(float(want_m[mpos])) + eps)
        corr = 1 - mult * wd if mode == 1 else (1 - lr * wd if mode == 2 else 1.0)
        new = corr * w0 - mult * g
        if max_norm > 0 and float(new.norm()) > max_norm:
            new = new * (max_norm / float(new.norm()))
        want_w[start:start + D] = new
    torch.testing.assert_close(m.double(), want_m, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.double(), want_w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", ["sum", "nobag"])
@BACKENDS
def test_adam_steps_match_float64_formula(variant, backend):
    nobag = variant == "nobag"
    dims = (4, 4, 4) if nobag else (4, 8, 3)
    x0 = _tbe(dims=dims)
    w = x0["weights"].clone()
    m1, m2 = torch.zeros_like(w), torch.zeros_like(w)
    want_w, want_m1, want_m2 = w.double().clone(), m1.double().clone(), m2.double().clone()
    lr, eps, b1, b2, wd = 0.01, 1e-8, 0.9, 0.99, 0.01
    for it in range(1, 4):
        x = _tbe(dims=dims)
        out = E.split_embedding_lookup(w, x["weights_offsets"], x["D_offsets"], x["indices"], x["offsets"], "adam",
                                       lr, [m1, m2], [x["weights_offsets"]] * 2, pooling_mode="none" if nobag
                                       else "sum", eps=eps, beta1=b1, beta2=b2, weight_decay=wd, iter=it)
        grad = torch.randn_like(out)
        with _forced(backend, E.backward_op_name("adam", False, nobag)):
            out.backward(grad)
        if nobag:
            rg = {}
            for p, i in enumerate(x["indices"].tolist()):
                t = int(torch.searchsorted(x["offsets"][x["B"]::x["B"]], torch.tensor(p), right=True))
                key = (int(x["weights_offsets"][t]) + i * 4, 4)
                rg[key] = rg.get(key, 0) + grad[p].double()
        else:
            rg = _loop_row_grads(x, grad, R.SUM, False)
        for (start, D), g in rg.items():
            sl = slice(start, start + D)
            want_m1[sl] = b1 * want_m1[sl] + (1 - b1) * g
            want_m2[sl] = b2 * want_m2[sl] + (1 - b2) * g * g
            upd = want_m1[sl] / (1 - b1 ** it) / ((want_m2[sl] / (1 - b2 ** it)).sqrt() + eps) + wd * want_w[sl]
            want_w[sl] -= lr * upd
        torch.testing.assert_close(m1.double(), want_m1, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(m2.double(), want_m2, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(w.double(), want_w, rtol=1e-5, atol=1e-5)


def test_lookup_op_adagrad_matches_fbgemm_backward_and_clips():
    x = _tbe(weighted=True)
    w_ta, w_fb = x["weights"].clone(), x["weights"].clone()
    (m_ta, mo), = _state_tensors("adagrad", x)
    m_fb = m_ta.clone()
    psw = x["psw"].clone().requires_grad_()
    out = E.split_embedding_lookup(w_ta, x["weights_offsets"], x["D_offsets"], x["indices"], x["offsets"],
                                   "adagrad", 0.1, [m_ta], [mo], per_sample_weights=psw, eps=1e-3,
                                   gradient_clipping=True, max_gradient=0.5)
    torch.testing.assert_close(out, fb.split_embedding_codegen_forward_weighted_pt2_wrapper(
        *_fwd_args(x, R.SUM, True)))
    grad = torch.randn_like(out)
    out.backward(grad)
    clipped = grad.clamp(-0.5, 0.5)
    fb.split_embedding_backward_codegen_adagrad_weighted_pt2_wrapper(
        *_bwd_args(x, "adagrad", ("weighted", R.SUM), clipped, w_fb, [(m_fb, mo)], torch.tensor(0.1), [1e-3]))
    torch.testing.assert_close(w_ta, w_fb)
    torch.testing.assert_close(m_ta, m_fb)
    want_gpsw = fb.split_embedding_codegen_grad_indice_weights_cpu(
        clipped, x["weights"], x["weights_offsets"], x["D_offsets"], x["indices"], x["offsets"], torch.ones(3))
    torch.testing.assert_close(psw.grad, want_gpsw)


def _tbe_two_forwards_then_backwards(optimizer):
    """fbgemm's TBE module (CPU, host weights): two forwards, then their two backwards (what
    TorchRec's ``test_optimizer_load_state_dict`` does); the weights afterwards."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        EmbeddingLocation,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    torch.manual_seed(0)
    specs = [(10, 4, EmbeddingLocation.HOST, ComputeDevice.CPU),
             (7, 8, EmbeddingLocation.HOST, ComputeDevice.CPU)]
    tbe = SplitTableBatchedEmbeddingBagsCodegen(specs, optimizer=optimizer, learning_rate=0.1, eps=1e-3)
    indices = torch.tensor([1, 2, 2, 9, 0, 3, 6, 6, 1])
    offsets = torch.tensor([0, 2, 4, 7, 9])  # T=2 features x B=2
    first, second = tbe(indices, offsets), tbe(indices, offsets)
    first.sum().backward()
    (second * torch.arange(second.numel()).reshape(second.shape)).sum().backward()
    return [w.detach().clone() for w in tbe.split_embedding_weights()]


@pytest.mark.parametrize("optimizer", ["EXACT_ROWWISE_ADAGRAD", "EXACT_ADAGRAD", "EXACT_SGD"])
def test_fbgemm_tbe_two_forwards_before_backwards_on_ours(optimizer):
    # the fused update must not bump the saved weights' version counter (fbgemm's lookup
    # autograd saves them): the second backward would raise "modified by an inplace operation"
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    opt = getattr(EmbOptimType, optimizer)
    want = _tbe_two_forwards_then_backwards(opt)
    with ops.use_backend("reference", replace_fbgemm=True):
        got = _tbe_two_forwards_then_backwards(opt)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- dense (data parallel)


@pytest.mark.parametrize("w_dtype", [torch.float64, torch.float32])
@BACKENDS
def test_dense_sequence_lookup_matches_float64_loop(w_dtype, backend):
    # fbgemm-gpu-cpu 1.8.0 pools here; the right answer is one row per index
    x = _tbe(dims=(4, 4, 4), max_L=6)
    w = x["weights"].to(w_dtype).requires_grad_()
    with _forced(backend, *_DENSE):
        out = E.dense_embedding_lookup(w, x["weights_offsets"], x["D_offsets"], x["indices"], x["offsets"], "none")
    assert out.shape == (x["indices"].numel(), 4)
    rows = []
    for p, i in enumerate(x["indices"].tolist()):
        t = int(torch.searchsorted(x["offsets"][x["B"]::x["B"]], torch.tensor(p), right=True))
        start = int(x["weights_offsets"][t]) + i * 4
        rows.append(w[start:start + 4])
    want = torch.stack(rows)
    torch.testing.assert_close(out, want)
    grad = torch.randn_like(out)
    with _forced(backend, *_DENSE):
        (g_ours,) = torch.autograd.grad(out, w, grad)
    (g_want,) = torch.autograd.grad(want.double(), w, grad.double())
    torch.testing.assert_close(g_ours.double(), g_want.double(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pm", [R.SUM, R.MEAN])
@pytest.mark.parametrize("weighted", [False, True])
@BACKENDS
def test_dense_pooled_lookup_matches_fbgemm_and_grads(pm, weighted, backend):
    x = _tbe(weighted=weighted, max_L=6)
    if weighted and pm == R.MEAN:
        pytest.skip("fbgemm-cpu's weighted MEAN backward omits 1/L (covered by the float64 test)")
    args = lambda w, iw: (w, x["weights_offsets"], x["D_offsets"], sum(x["dims"]), max(x["dims"]),  # noqa: E731
                          x["hash_size_cumsum"], 0, x["indices"], x["offsets"], pm, iw, None)
    w1, w2 = x["weights"].clone().requires_grad_(), x["weights"].clone().requires_grad_()
    iw1 = x["psw"].clone().requires_grad_() if weighted else None
    iw2 = x["psw"].clone().requires_grad_() if weighted else None
    with _forced(backend, *_DENSE):
        o1 = ta.dense_embedding_codegen_lookup_function(*args(w1, iw1))
    o2 = fb.dense_embedding_codegen_lookup_function(*args(w2, iw2))
    torch.testing.assert_close(o1, o2)
    grad = torch.randn_like(o1)
    if not weighted:  # an optimizer step between forward and backward (semi-sync pipeline)
        with torch.no_grad():
            w1.mul_(2.0)
    with _forced(backend, *_DENSE):
        o1.backward(grad)
    o2.backward(grad)
    torch.testing.assert_close(w1.grad, w2.grad)
    if weighted:
        torch.testing.assert_close(iw1.grad, iw2.grad)


@BACKENDS
def test_dense_replaces_fbgemm_kernel_with_autograd(backend):
    x = _tbe(dims=(4, 4, 4))
    w = x["weights"].clone().requires_grad_()
    _forced(backend, *_DENSE)  # skips where the backend is missing
    with ops.use_backend(backend, ops=list(_DENSE), replace_fbgemm=True):
        out = fb.dense_embedding_codegen_lookup_function(
            w, x["weights_offsets"], x["D_offsets"], 12, 4, x["hash_size_cumsum"], 0, x["indices"], x["offsets"],
            R.NONE, None, None)
    assert out.shape == (x["indices"].numel(), 4)
    grad = torch.randn_like(out)
    out_values = out.detach().clone()
    with torch.no_grad():  # an optimizer step between forward and backward (semi-sync pipeline)
        w.add_(1.0)
    out.backward(grad)
    want_out, want_grad = torch.zeros_like(out), torch.zeros_like(w)
    for p, i in enumerate(x["indices"].tolist()):  # float64-free loop: rows copied, grads summed per row
        t = int(torch.searchsorted(x["offsets"][x["B"]::x["B"]], torch.tensor(p), right=True))
        start = int(x["weights_offsets"][t]) + i * 4
        want_out[p] = x["weights"][start:start + 4]
        want_grad[start:start + 4] += grad[p]
    torch.testing.assert_close(out_values, want_out)
    torch.testing.assert_close(w.grad, want_grad)


# --------------------------------------------------------------------------- fake kernels


def test_opcheck_fake_kernels():
    x = _tbe(weighted=True)
    xs = _tbe(dims=(4, 4, 4))
    checks = [
        (ta.split_embedding_codegen_forward_unweighted_pt2_wrapper, _fwd_args(x, R.SUM, False)),
        (ta.split_embedding_codegen_forward_weighted_pt2_wrapper, _fwd_args(x, R.MEAN, True)),
        (ta.split_embedding_nobag_codegen_forward_unweighted_pt2_wrapper, _nobag_args(xs)),
        (ta.dense_embedding_codegen_lookup_function,
         (xs["weights"], xs["weights_offsets"], xs["D_offsets"], 12, 4, xs["hash_size_cumsum"], 0, xs["indices"],
          xs["offsets"], R.NONE, None, None)),
    ]
    grad = torch.randn(x["B"], sum(x["dims"]))
    checks.append((ta.split_embedding_backward_codegen_rowwise_adagrad_weighted_pt2_wrapper,
                   tuple(_bwd_args(x, "rowwise_adagrad", ("weighted", R.SUM), grad, x["weights"].clone(),
                                   _state_tensors("rowwise_adagrad", x), torch.tensor(0.1), [1e-3, 0.0, 0, 0.0]))))
    for pm, iw in ((R.SUM, x["psw"]), (R.NONE, None)):
        xx = x if pm == R.SUM else xs
        rows = xx["B"] if pm == R.SUM else xx["indices"].numel()
        checks.append((ta.dense_embedding_codegen_lookup_backward,
                       (torch.randn(rows, sum(xx["dims"]) if pm == R.SUM else 4), xx["weights"],
                        xx["weights_offsets"], xx["D_offsets"], max(xx["dims"]), xx["indices"], xx["offsets"], pm, iw,
                        None)))
    for op, args in checks:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


# --------------------------------------------------------------------------- bad input


def _api(x, **over):
    kw = dict(weights=x["weights"], weights_offsets=x["weights_offsets"], D_offsets=x["D_offsets"],
              indices=x["indices"], offsets=x["offsets"])
    kw.update(over)
    return E.split_embedding_forward(**kw)


def test_bad_input_errors_name_argument_and_rule():
    x = _tbe()
    off = x["offsets"]
    with pytest.raises(ValueError, match="offsets: must start at 0"):
        _api(x, offsets=off + 1)
    dec = off.clone()
    dec[3], dec[4] = dec[4] + 1, dec[3]
    with pytest.raises(ValueError, match="offsets: must be non-decreasing"):
        _api(x, offsets=torch.cat([off[:3], torch.tensor([off[5] + 1, 0]), off[5:]]))
    with pytest.raises(ValueError, match="offsets: last offset .* exceeds"):
        _api(x, offsets=torch.cat([off[:-1], off[-1:] + 5]))
    with pytest.raises(ValueError, match="offsets: has .* entries; must be T \\* B \\+ 1"):
        _api(x, offsets=off[:-1])
    bad = x["indices"].clone()
    bad[0] = 100
    with pytest.raises(ValueError, match=r"indices: indices\[0\]=100 is out of range"):
        _api(x, indices=bad)
    bad[0] = -1
    with pytest.raises(ValueError, match="indices: .* out of range"):
        _api(x, indices=bad)
    with pytest.raises(ValueError, match="indices: dtype float32"):
        _api(x, indices=x["indices"].float())
    with pytest.raises(ValueError, match="weights_offsets: dtype int32"):
        _api(x, weights_offsets=x["weights_offsets"].int())
    with pytest.raises(ValueError, match="per_sample_weights: has"):
        _api(x, per_sample_weights=torch.rand(x["indices"].numel() + 1))
    with pytest.raises(ValueError, match="indices: on device meta"):
        _api(x, indices=x["indices"].to("meta"))
    with pytest.raises(ValueError, match="pooling_mode"):
        _api(x, pooling_mode="max")
    with pytest.raises(ValueError, match="pooling_mode none .* one dim"):
        _api(x, pooling_mode="none")
    with pytest.raises(ValueError, match="optimizer"):
        E.split_embedding_lookup(x["weights"], x["weights_offsets"], x["D_offsets"], x["indices"], x["offsets"],
                                 "lamb", 0.1)
    with pytest.raises(ValueError, match="states: optimizer 'adagrad' needs 1"):
        E.split_embedding_lookup(x["weights"], x["weights_offsets"], x["D_offsets"], x["indices"], x["offsets"],
                                 "adagrad", 0.1)


def test_ours_is_what_runs_in_these_tests():
    # the autouse fixture must route torchrec_ascend:: ops to our reference, not fbgemm's kernel
    from torchrec_ascend.ops import registry

    for s in registry.all_specs():
        if "embedding" in s.name:
            assert registry.choose(s.name, "cpu")[0] == "reference", s.name


# --------------------------------------------------------------------------- TorchRec, forced backend


def _torchrec_train(kind, sharding, optim, steps=3, seed=0):
    """Build a tiny sharded EBC/EC (DMP on the current 1-process group), train ``steps`` steps.
    Returns (losses, {table: weights}, [optimizer state tensors])."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig
    from torchrec import KeyedJaggedTensor
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.modules.embedding_configs import PoolingType
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    import torch.distributed as dist

    torch.manual_seed(seed)
    if kind == "ebc":
        m = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name="t0", embedding_dim=4, num_embeddings=11, feature_names=["f0"]),
            EmbeddingBagConfig(name="t1", embedding_dim=8, num_embeddings=7, feature_names=["f1"],
                               pooling=PoolingType.MEAN)], device=torch.device("meta"))
        sharder = EmbeddingBagCollectionSharder()
    else:
        m = EmbeddingCollection(tables=[
            EmbeddingConfig(name="t0", embedding_dim=4, num_embeddings=11, feature_names=["f0"]),
            EmbeddingConfig(name="t1", embedding_dim=4, num_embeddings=7, feature_names=["f1"])],
            device=torch.device("meta"))
        sharder = EmbeddingCollectionSharder()
    if sharding == "table_wise":
        apply_optimizer_in_backward(optim[0], m.parameters(), dict(optim[1]))  # it adds keys
        kernel = EmbeddingComputeKernel.FUSED.value
    else:
        kernel = EmbeddingComputeKernel.DENSE.value
    cons = {t: ParameterConstraints(sharding_types=[sharding], compute_kernels=[kernel]) for t in ("t0", "t1")}
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"), constraints=cons
                                    ).collective_plan(m, [sharder], dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(m, device=torch.device("cpu"), plan=plan, sharders=[sharder])
    dense_opt = torch.optim.SGD([p for p in dmp.parameters() if p.requires_grad], lr=0.1) \
        if sharding == "data_parallel" else None

    gen = torch.Generator().manual_seed(seed + 1)
    losses = []
    for _ in range(steps):
        lengths = torch.randint(0, 4, (6,), generator=gen)
        lengths[0] = 0
        n0 = int(lengths[:3].sum())
        values = torch.cat([torch.randint(0, 11, (n0,), generator=gen),
                            torch.randint(0, 7, (int(lengths.sum()) - n0,), generator=gen)])
        kjt = KeyedJaggedTensor(keys=["f0", "f1"], values=values, lengths=lengths)
        out = dmp(kjt)
        if kind == "ebc":
            vals = out.values()
            loss = (vals * torch.randn(vals.shape, generator=gen)).sum()
        else:
            loss = sum((out[f].values() * torch.randn(out[f].values().shape, generator=gen)).sum()
                       for f in ("f0", "f1"))
        loss.backward()
        if dense_opt is not None:
            dense_opt.step()
            dense_opt.zero_grad()
        losses.append(float(loss))
    weights, states = {}, []
    for k, v in dmp.state_dict().items():
        t = v.local_shards()[0].tensor if hasattr(v, "local_shards") else v
        weights[k] = t.detach().clone()
    if sharding == "table_wise":
        for _, st in sorted(dmp.fused_optimizer.state_dict()["state"].items()):
            for _, v in sorted(st.items()):
                t = v.local_shards()[0].tensor if hasattr(v, "local_shards") else v
                if isinstance(t, torch.Tensor):
                    states.append(t.detach().clone())
    return losses, weights, states


@pytest.fixture(scope="module")
def _process_group(tmp_path_factory):
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _optims():
    from torchrec.optim import RowWiseAdagrad

    return {
        "sgd": (torch.optim.SGD, {"lr": 0.1}),
        "adagrad": (torch.optim.Adagrad, {"lr": 0.1, "eps": 1e-8}),
        "rowwise_adagrad": (RowWiseAdagrad, {"lr": 0.1, "eps": 1e-8}),
    }


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ebc", "ec"])
@pytest.mark.parametrize("opt", ["sgd", "adagrad", "rowwise_adagrad"])
def test_torchrec_fused_training_same_with_our_kernels(_process_group, kind, opt, monkeypatch):
    """TorchRec FUSED table-wise training, 3 steps: fbgemm's CPU kernels vs ours forced in their
    place (every fbgemm op we register, replace_fbgemm=True).  Tolerance: 1e-5 (fp32, sums in a
    different order)."""
    optim = _optims()[opt]
    calls = []
    real_row_grads = R.row_grads
    monkeypatch.setattr(R, "row_grads", lambda *a, **k: calls.append(1) or real_row_grads(*a, **k))
    l_fb, w_fb, s_fb = _torchrec_train(kind, "table_wise", optim)
    assert not calls, "fbgemm's run must not touch our kernels"
    with ops.use_backend("reference", replace_fbgemm=True):
        l_ta, w_ta, s_ta = _torchrec_train(kind, "table_wise", optim)
    assert len(calls) >= 3, "our fused backward did not run under replace_fbgemm"
    assert len(w_fb) == 2 and len(s_fb) == (0 if opt == "sgd" else 2)
    torch.testing.assert_close(torch.tensor(l_ta), torch.tensor(l_fb), rtol=1e-5, atol=1e-5)
    for k in w_fb:
        torch.testing.assert_close(w_ta[k], w_fb[k], rtol=1e-5, atol=1e-5, msg=k)
    for a, b in zip(s_ta, s_fb):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # the training really moved the tables
    _, w0, _ = _torchrec_train(kind, "table_wise", optim, steps=0)
    assert any(not torch.equal(w0[k], w_fb[k]) for k in w_fb)


@pytest.mark.slow
def test_torchrec_data_parallel_embedding_collection_works_with_ours(_process_group):
    """DATA_PARALLEL EmbeddingCollection: fbgemm-gpu-cpu 1.8.0's dense lookup pools sequence
    tables and TorchRec fails; with ours it trains like a float64 per-index lookup + SGD."""
    _, w0, _ = _torchrec_train("ec", "data_parallel", None, steps=0)
    with ops.use_backend("reference", ops=["dense_embedding_codegen_lookup_function"], replace_fbgemm=True):
        losses, w1, _ = _torchrec_train("ec", "data_parallel", None, steps=1)
    # replay the one step by hand: loss = sum_f <rows of f's ids, c_f>, grad of row = sum of its c
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(0, 4, (6,), generator=gen)
    lengths[0] = 0
    n0 = int(lengths[:3].sum())
    values = torch.cat([torch.randint(0, 11, (n0,), generator=gen),
                        torch.randint(0, 7, (int(lengths.sum()) - n0,), generator=gen)])
    k0, k1 = sorted(w0)
    tables = {"f0": w0[k0].double(), "f1": w0[k1].double()}
    ids = {"f0": values[:n0], "f1": values[n0:]}
    loss, want = 0.0, {f: t.clone() for f, t in tables.items()}
    for f in ("f0", "f1"):
        c = torch.randn((ids[f].numel(), 4), generator=gen).double()
        loss += float((tables[f][ids[f]] * c).sum())
        want[f].index_add_(0, ids[f], -0.1 * c)
    assert losses[0] == pytest.approx(loss, rel=1e-5, abs=1e-5)
    torch.testing.assert_close(w1[k0].double(), want["f0"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w1[k1].double(), want["f1"], rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- vector paths


_ISA_CAPS = pytest.mark.parametrize("cap", [2, 1], ids=["avx512", "avx2"])


@_ISA_CAPS
@pytest.mark.parametrize("llc,far", [(0, 1), (0, 0), (1 << 40, -1)], ids=["memory", "memory-near-only", "llc"])
@pytest.mark.parametrize("pm,weighted", [(R.SUM, False), (R.SUM, True), (R.MEAN, False)],
                         ids=["sum", "weighted_sum", "mean"])
def test_pooled_forward_vector_paths_match_scalar_path(cap, llc, far, pm, weighted, isa_cap, llc_bytes,
                                                       far_prefetch):
    """The forward's AVX-512 / AVX2 sums against the scalar loop, with weights in memory (no LLC)
    on both prefetch paths (two-stage: rows far ahead into L2, near ahead into L1, across bag ends;
    and the L1 stage alone, which far_prefetch_pays picks where the far stage costs) and in the
    LLC (a 1 TiB one: the L1 stage only), on dims 256 / 48 / 20 / 272 / 136 (every AVX2 block
    width: 128 and 120 (weighted), 64, 32, 16 and 8 columns, and a tail; AVX-512: a 256-block plus
    blocks of 16 plus a tail) and ragged bags of length 0, 1 and max (40 > the 32-row prefetch
    distance)."""
    torch.manual_seed(23)
    llc_bytes(llc)
    far_prefetch(far)
    x = _tbe(dims=(256, 48, 20, 272, 136), rows=(50, 40, 30, 20, 25), B=7, max_L=40,
             weighted=weighted)
    name = "split_embedding_codegen_forward_weighted_pt2_wrapper" if weighted else \
        "split_embedding_codegen_forward_unweighted_pt2_wrapper"
    with _forced("cpu_kernel", name):
        isa_cap(0)
        want = getattr(ta, name)(*_fwd_args(x, pm, weighted))
        isa_cap(cap)
        got = getattr(ta, name)(*_fwd_args(x, pm, weighted))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.double(), _loop_pooled(x, pm, weighted), rtol=1e-4, atol=1e-4,
                               check_dtype=False)


@pytest.mark.parametrize("cap", [2, 1, 0], ids=["avx512", "avx2", "scalar"])
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
def test_pooled_forward_names_an_index_outside_the_weights(cap, idx_dtype, isa_cap):
    """An index whose row lies outside the weights (the last table's row count, -1, or a huge
    one) raises a ValueError naming its position and value wherever it lies: the AVX2 check of a
    bag takes four indices per step, so positions 0, 5, 8, 13 and the tail 18 of a 19-index bag of
    the last table are each tried."""
    name = "split_embedding_codegen_forward_unweighted_pt2_wrapper"
    torch.manual_seed(5)
    rows = (9, 11, 7)
    x = _tbe(dims=(16, 16, 16), rows=rows, B=2, idx_dtype=idx_dtype)
    L = torch.tensor([2, 1, 3, 0, 19, 1])  # bag 4 (table 2, sample 0) holds 19 indices
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), L.cumsum(0)]).to(idx_dtype)
    idx = torch.cat([torch.randint(0, rows[t], (int(L[2 * t:2 * t + 2].sum()),)) for t in range(3)])
    x.update(offsets=offsets, indices=idx.to(idx_dtype))
    isa_cap(cap)
    with _forced("cpu_kernel", name):
        torch.testing.assert_close(getattr(ta, name)(*_fwd_args(x, R.SUM, False)).double(),
                                   _loop_pooled(x, R.SUM, False), rtol=1e-5, atol=1e-5)
        for at in (0, 5, 8, 13, 18):
            for bad in (rows[2], -1, 2**31 - 1):
                x["indices"] = idx.clone().to(idx_dtype)
                pos = 6 + at  # bag 4 starts after bags of 2, 1, 3 and 0 indices
                x["indices"][pos] = bad
                with pytest.raises(ValueError, match=rf"indices\[{pos}\]={bad} addresses a row outside"):
                    getattr(ta, name)(*_fwd_args(x, R.SUM, False))


@_ISA_CAPS
@pytest.mark.parametrize("variant", _VARIANTS[:3], ids=["sum", "mean", "weighted_sum"])
@pytest.mark.parametrize("opt,mode", [("sgd", 0), ("rowwise_adagrad", 0), ("rowwise_adagrad", 2)],
                         ids=["sgd", "rowwise_adagrad", "rowwise_adagrad_decoupled_decay"])
def test_fused_row_kernels_match_scalar_path(cap, variant, opt, mode, isa_cap):
    """The SGD and RowWiseAdagrad backwards' fused AVX-512 row kernels (D a multiple of 16 up to
    256: the gradient summed and applied in registers, squared too for RowWiseAdagrad) and the
    AVX2 sum + update, against the scalar path, over three steps: dims 256 / 48 / 20 (20 is never
    fused), bag lengths 0, 1 and max, duplicate rows (rows hit by many bags), RowWiseAdagrad with
    and without decoupled weight decay."""
    torch.manual_seed(29)
    weighted = variant[0] == "weighted"
    name = E.backward_op_name(opt, weighted, False)
    x = _tbe(dims=(256, 48, 20), rows=(30, 12, 9), B=8, max_L=40, weighted=weighted)
    hyper = [] if opt == "sgd" else [0.01, 0.1 if mode else 0.0, mode, 0.0]
    lr = torch.tensor(0.05)
    st0 = _state_tensors(opt, x)
    results = []
    for c in (0, cap):
        w = x["weights"].clone()
        st = [(s.clone(), o) for s, o in st0]
        isa_cap(c)
        with _forced("cpu_kernel", name):
            for step in range(3):
                torch.manual_seed(100 + step)
                grad = torch.randn(x["B"], sum(x["dims"]))
                getattr(ta, name)(*_bwd_args(x, opt, variant, grad, w, st, lr, hyper))
        results.append((w, [s for s, _ in st]))
    (w_s, st_s), (w_v, st_v) = results
    assert not torch.equal(w_s, x["weights"])
    torch.testing.assert_close(w_v, w_s, rtol=1e-5, atol=1e-6)
    for a, b in zip(st_v, st_s):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("far,want", [(1, "rows prefetched into L2 and L1"), (0, "rows prefetched into L1 only")])
def test_describe_names_the_pooled_forwards_prefetch_path(far, want, far_prefetch):
    """ops.describe(): on the csrc backend the pooled forwards' and the dense lookup's rows say
    which prefetch path weights past the LLC take (measured per CPU; here forced both ways with
    _set_far_prefetch); the nobag forward's row and the reference backend's say nothing of it."""
    names = ["split_embedding_codegen_forward_unweighted_pt2_wrapper",
             "split_embedding_codegen_forward_weighted_pt2_wrapper",
             "dense_embedding_codegen_lookup_function",
             "split_embedding_nobag_codegen_forward_unweighted_pt2_wrapper"]
    far_prefetch(far)
    with _forced("cpu_kernel", *names):
        rows = {op: why for op, dev, _, why in ops.registry.describe_rows(["cpu"]) if op in names}
    for op in names[:3]:
        assert rows[op].endswith(f"weights past the LLC: {want} (measured on this CPU)"), rows[op]
    assert "prefetched" not in rows[names[3]]
    with _forced("reference", *names):
        rows = {op: why for op, dev, _, why in ops.registry.describe_rows(["cpu"]) if op in names}
    assert not any("prefetched" in why for why in rows.values())
