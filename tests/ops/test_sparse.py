"""Training-path sparse ops (ops/sparse.py): every backend against fbgemm's CPU kernels (or a
float64 / Python-loop oracle where fbgemm has none), forward and backward, fake kernels, input
validation, and TorchRec's KeyedJaggedTensor running on our kernels.

Each op has one shared parity body ``_test_<op>(backend, ...)`` driven by thin hypothesis
wrappers, in the style of generative-recommenders' op tests.
"""

from __future__ import annotations

import functools

from typing import List, Optional

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchrec_ascend.ops as tops
from torchrec_ascend.ops import registry, sparse
from torchrec_ascend.ops.reference import sparse as ref

fbgemm_gpu = pytest.importorskip("fbgemm_gpu")
FB = torch.ops.fbgemm
OURS = torch.ops.torchrec_ascend
EXAMPLES = settings(max_examples=6, deadline=None)


def _backends(op: str) -> List[str]:
    """Our CPU backends of ``op`` (everything except fbgemm itself)."""
    return [b for b, _ in registry.available_backends(op, "cpu") if b != "fbgemm"]


def _run(op: str, backend: str, *args):
    with tops.use_backend(backend, ops=[op]):
        return getattr(OURS, op)(*args)


def _lengths(n: int, max_len: int, dtype=torch.int64, gen: Optional[torch.Generator] = None):
    """Ragged lengths in [0, max_len] that include 0, 1 and max_len whenever n >= 3."""
    x = torch.randint(0, max_len + 1, (n,), generator=gen)
    for i, v in enumerate((0, 1, max_len)[:n]):
        x[(i * 7) % n if n else 0] = v
    return x.to(dtype)


def _equal(got, want, name="out", exact=True):
    if isinstance(want, (list, tuple)):
        assert len(got) == len(want), name
        for i, (g, w) in enumerate(zip(got, want)):
            _equal(g, w, f"{name}[{i}]", exact)
        return
    if want is None:
        assert got is None, f"{name}: expected None"
        return
    assert got is not None, f"{name}: got None"
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
    if exact:
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)
    else:
        torch.testing.assert_close(got, want, msg=name)


BACKENDS = pytest.mark.parametrize("backend", ["reference", "cpu_kernel"])


def _need(op: str, backend: str) -> None:
    if backend not in _backends(op):
        pytest.skip(f"{op} has no {backend} backend here")


# --------------------------------------------------------------------------- cumsums


@BACKENDS
@pytest.mark.parametrize("op", ["asynchronous_complete_cumsum", "asynchronous_exclusive_cumsum",
                                "asynchronous_inclusive_cumsum"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("shape", [(0,), (1,), (37,), (3, 9), (2, 0)], ids=str)
def test_cumsums_match_fbgemm(backend, op, dtype, shape):
    _need(op, backend)
    if len(shape) == 2 and op != "asynchronous_complete_cumsum":
        pytest.skip("fbgemm's exclusive/inclusive cumsums are 1-D")
    g = torch.Generator().manual_seed(sum(shape) + len(shape))
    x = _lengths(int(torch.tensor(shape).prod()), 50, dtype, g).reshape(shape)
    _equal(_run(op, backend, x), getattr(FB, op)(x), op)


# --------------------------------------------------------------------------- permute 2D / 1D


def _loop_permute(permute, lengths2, values):
    """Python-loop oracle: the selected features' values back to back (autograd-friendly)."""
    b = lengths2.shape[1]
    offs = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths2.reshape(-1).long(), 0)])
    parts = []
    for t in permute.tolist():
        parts.append(values[int(offs[t * b]):int(offs[(t + 1) * b])])
    return torch.cat(parts) if parts else values[:0]


def _test_permute(op, backend, t_in, b, max_len, index_dtype, wdtype, perm_kind, seed):
    g = torch.Generator().manual_seed(seed)
    two_d = op == "permute_2D_sparse_data"
    lengths = _lengths(t_in * b, max_len, index_dtype, g)
    lengths = lengths.reshape(t_in, b) if two_d else lengths
    n = int(lengths.sum())
    t_out = t_in if two_d else lengths.numel()
    if perm_kind == "permutation":
        permute = torch.randperm(t_out, generator=g).to(torch.int32)
    else:  # subset with repeats
        permute = torch.randint(0, t_out, (max(t_out - 1, 1) + 1,), generator=g).to(torch.int32)
    values = torch.randint(-100, 100, (n,), generator=g).to(index_dtype)
    weights = None if wdtype is None else torch.rand(n, generator=g).to(wdtype)
    want = getattr(FB, op)(permute, lengths, values, weights)
    got = _run(op, backend, permute, lengths, values, weights)
    _equal(got, want, op)
    got_sum = _run(op, backend, permute, lengths, values, weights, int(want[0].sum()))
    _equal(got_sum, want, op + "(permuted_lengths_sum)")

    # backward: float values and weights, against autograd through the Python-loop oracle
    fv = torch.randn(n, dtype=torch.float64, generator=g, requires_grad=True)
    fw = torch.randn(n, dtype=torch.float64, generator=g, requires_grad=True)
    with tops.use_backend(backend, ops=[op]):
        _, pv, pw = getattr(OURS, op)(permute, lengths, fv, fw)
    l2 = lengths.reshape(lengths.shape[0], -1)
    ov, ow = _loop_permute(permute, l2, fv), _loop_permute(permute, l2, fw)
    torch.testing.assert_close(pv, ov.detach(), rtol=0, atol=0)
    gv, gw = torch.randn_like(pv), torch.randn_like(pw)
    mine = torch.autograd.grad((pv, pw), (fv, fw), (gv, gw), allow_unused=True)
    oracle = torch.autograd.grad((ov, ow), (fv, fw), (gv, gw), allow_unused=True)
    for m, o in zip(mine, oracle):
        torch.testing.assert_close(m if m is not None else torch.zeros_like(fv),
                                   o if o is not None else torch.zeros_like(fv))
    if perm_kind == "permutation" and two_d and n:
        # fbgemm's own autograd formula (valid for permutations) agrees too
        v32 = fv.detach().float().requires_grad_()
        _, fbv, _ = FB.permute_2D_sparse_data(permute, lengths, v32, None)
        (fb_grad,) = torch.autograd.grad(fbv, v32, gv.float())
        torch.testing.assert_close(mine[0].float(), fb_grad)


@BACKENDS
@EXAMPLES
@given(
    t_in=st.integers(1, 5), b=st.integers(0, 6), max_len=st.sampled_from([1, 3, 8]),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
    wdtype=st.sampled_from([None, torch.float32, torch.float16, torch.float64]),
    perm_kind=st.sampled_from(["permutation", "subset"]), seed=st.integers(0, 2**16),
)
def test_permute_2D_sparse_data(backend, t_in, b, max_len, index_dtype, wdtype, perm_kind, seed):
    _need("permute_2D_sparse_data", backend)
    _test_permute("permute_2D_sparse_data", backend, t_in, b, max_len, index_dtype, wdtype,
                  perm_kind, seed)


@BACKENDS
@EXAMPLES
@given(
    n=st.integers(1, 12), max_len=st.sampled_from([1, 4, 9]),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
    wdtype=st.sampled_from([None, torch.float32, torch.float64]),
    perm_kind=st.sampled_from(["permutation", "subset"]), seed=st.integers(0, 2**16),
)
def test_permute_1D_sparse_data(backend, n, max_len, index_dtype, wdtype, perm_kind, seed):
    _need("permute_1D_sparse_data", backend)
    _test_permute("permute_1D_sparse_data", backend, n, 1, max_len, index_dtype, wdtype,
                  perm_kind, seed)


@BACKENDS
def test_permute_2D_empty_batch(backend):
    _need("permute_2D_sparse_data", backend)
    lengths = torch.zeros(3, 0, dtype=torch.int64)
    permute = torch.tensor([2, 0, 1], dtype=torch.int32)
    values = torch.zeros(0, dtype=torch.int64)
    weights = torch.zeros(0)
    _equal(_run("permute_2D_sparse_data", backend, permute, lengths, values, weights),
           FB.permute_2D_sparse_data(permute, lengths, values, weights))


def test_permute_2D_gradcheck():
    lengths = torch.tensor([[2, 0, 1], [1, 3, 0]], dtype=torch.int32)
    permute = torch.tensor([1, 0, 1], dtype=torch.int32)
    v = torch.randn(7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, dtype=torch.float64, requires_grad=True)
    for backend in _backends("permute_2D_sparse_data"):
        with tops.use_backend(backend, ops=["permute_2D_sparse_data"]):
            assert torch.autograd.gradcheck(
                lambda v, w: OURS.permute_2D_sparse_data(permute, lengths, v, w)[1:], (v, w))


# --------------------------------------------------------------------------- block bucketize


@BACKENDS
def test_block_bucketize_large_ids(backend):
    """Ids around 2^52 and beyond (where the csrc kernel switches from its multiply-by-inverse
    quotient to an integer divide), odd block sizes, int64."""
    _need("block_bucketize_sparse_features", backend)
    big = [2**52 - 1, 2**52, 2**52 + 1, 2**62 + 12345, 3 * 2**51 + 7, 0, 1, 999_999_937]
    indices = torch.tensor(big * 2, dtype=torch.int64)
    block_sizes = torch.tensor([999_999_937, 2**50 + 3, 7], dtype=torch.int64)
    lengths = torch.tensor([3, 5, 0, 8, 0, 0], dtype=torch.int64)  # T=3, B=2
    args = (lengths, indices, True, True, block_sizes, 5, None)
    _equal(_run("block_bucketize_sparse_features", backend, *args),
           FB.block_bucketize_sparse_features(*args))


def _test_block_bucketize(backend, t, b, max_len, my_size, index_dtype, len_dtype, variant,
                          bucketize_pos, sequence, weighted, seed):
    g = torch.Generator().manual_seed(seed)
    block_sizes = torch.randint(1, 6, (t,), generator=g).to(index_dtype)
    kwargs = {}
    if variant == "vbe":
        bpf = torch.randint(0, b + 1, (t,), generator=g).to(len_dtype)
        bpf[0] = b
        lengths = _lengths(int(bpf.sum()), max_len, len_dtype, g)
        kwargs = dict(batch_size_per_feature=bpf, max_B=b)
    else:
        lengths = _lengths(t * b, max_len, len_dtype, g)
    n = int(lengths.sum())
    hi = int(block_sizes.max()) * my_size
    # in-range ids, ids past the last bucket, and negative ids (read unsigned, as fbgemm does)
    indices = torch.randint(-3, 2 * hi + 3, (n,), generator=g).to(index_dtype)
    weights = torch.rand(n, generator=g) if weighted else None
    if variant == "uneven":
        pos = []
        for _ in range(t):
            cuts = torch.sort(torch.randint(0, hi + 1, (my_size - 1,), generator=g)).values
            pos.append(torch.cat([torch.zeros(1, dtype=torch.int64), cuts,
                                  torch.tensor([hi])]).to(index_dtype))
        kwargs["block_bucketize_pos"] = pos
    elif variant == "total_num_blocks":
        kwargs["total_num_blocks"] = (my_size * torch.randint(1, 4, (t,), generator=g)).to(index_dtype)
    elif variant == "keep_orig":
        kwargs["keep_orig_idx"] = True
    elif variant == "keep_per_feature":
        kwargs["keep_orig_idx_per_feature"] = torch.rand(t, generator=g) < 0.5
    args = (lengths, indices, bucketize_pos, sequence, block_sizes, my_size, weights)
    want = FB.block_bucketize_sparse_features(*args, **kwargs)
    with tops.use_backend(backend, ops=["block_bucketize_sparse_features"]):
        got = OURS.block_bucketize_sparse_features(*args, **kwargs)
    _equal(got, want, f"block_bucketize[{variant}]")
    if sequence and n:
        # unbucketize_permute really maps every input id to its bucketed slot
        assert torch.equal(torch.sort(got[4].long()).values, torch.arange(n))


@BACKENDS
@EXAMPLES
@given(
    t=st.integers(1, 4), b=st.integers(0, 5), max_len=st.sampled_from([1, 4, 7]),
    my_size=st.integers(1, 4),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
    len_dtype=st.sampled_from([torch.int32, torch.int64]),
    variant=st.sampled_from(["even", "uneven", "total_num_blocks", "vbe", "keep_orig",
                             "keep_per_feature"]),
    bucketize_pos=st.booleans(), sequence=st.booleans(), weighted=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_block_bucketize_sparse_features(backend, t, b, max_len, my_size, index_dtype, len_dtype,
                                         variant, bucketize_pos, sequence, weighted, seed):
    _need("block_bucketize_sparse_features", backend)
    _test_block_bucketize(backend, t, b, max_len, my_size, index_dtype, len_dtype, variant,
                          bucketize_pos, sequence, weighted, seed)


@BACKENDS
@pytest.mark.parametrize("variant", ["even", "uneven", "total_num_blocks", "vbe"])
def test_block_bucketize_sequence_weights_every_variant(backend, variant):
    _need("block_bucketize_sparse_features", backend)
    for index_dtype in (torch.int32, torch.int64):
        _test_block_bucketize(backend, 3, 4, 6, 3, index_dtype, torch.int64, variant,
                              True, True, True, seed=7)


# --------------------------------------------------------------------------- small permutes


@BACKENDS
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("n", [0, 1, 17, 1000])
def test_invert_permute(backend, dtype, n):
    _need("invert_permute", backend)
    p = torch.randperm(n).to(dtype)
    got = _run("invert_permute", backend, p)
    _equal(got, FB.invert_permute(p))
    assert torch.equal(p[got.long()], torch.arange(n, dtype=dtype))


def test_describe_names_invert_permutes_measured_write_prefetch():
    """ops.describe(): on the csrc backend invert_permute's row says whether its writes are
    prefetched, the choice the kernel measured on this CPU (csrc/sparse.cpp prefetch_scatter_pays)."""
    _need("invert_permute", "cpu_kernel")
    from torchrec_ascend.ops import extension
    pays = extension.kernel("_prefetch_scatter_pays")()
    with tops.use_backend("cpu_kernel", ops=["invert_permute"]):
        why = {op: w for op, _, _, w in tops.registry.describe_rows(["cpu"])}["invert_permute"]
    want = "writes prefetched" if pays else "writes not prefetched"
    assert why.endswith(f"; {want} (measured on this CPU)"), why


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("n", [11, 101])
def test_invert_permute_names_the_first_entry_outside(dtype, n):
    """The csrc kernel tests four entries per step: an entry outside [0, n) is reported by its own
    position wherever it lies in a step (and in the tail), the first one when there are two.
    n=11: two steps of four, then a tail of three; n=101: the steps that prefetch the entries 32
    on (which may be the bad ones) come first."""
    _need("invert_permute", "cpu_kernel")
    for pos in range(n):
        for bad in (n, -1):
            p = torch.randperm(n, generator=torch.Generator().manual_seed(pos)).to(dtype)
            p[pos] = bad
            if pos + 2 < n:
                p[pos + 2] = n + 5  # a later bad entry: not the one reported
            with pytest.raises(ValueError, match=rf"permute: entry {pos} is {bad}, outside \[0, {n}\)"):
                _run("invert_permute", "cpu_kernel", p)


def _test_expand_into_jagged_permute(backend, t, max_len, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = _lengths(t, max_len, dtype, g)
    permute = torch.randperm(t, generator=g).to(dtype)
    in_off = ref.asynchronous_complete_cumsum(lengths)
    out_off = ref.asynchronous_complete_cumsum(lengths[permute.long()])
    size = int(out_off[-1])
    want = FB.expand_into_jagged_permute(permute, in_off, out_off, size)
    _equal(_run("expand_into_jagged_permute", backend, permute, in_off, out_off, size), want)


@BACKENDS
@EXAMPLES
@given(t=st.integers(1, 20), max_len=st.sampled_from([1, 5, 40]),
       dtype=st.sampled_from([torch.int32, torch.int64]), seed=st.integers(0, 2**16))
def test_expand_into_jagged_permute(backend, t, max_len, dtype, seed):
    _need("expand_into_jagged_permute", backend)
    _test_expand_into_jagged_permute(backend, t, max_len, dtype, seed)


def test_expand_into_jagged_permute_names_a_bad_entry():
    """A permute entry outside [0, T), an output_offset that decreases, starts below 0 or runs
    past output_size mid-way: a ValueError naming the argument (each segment is checked before
    it is written, so nothing is written outside the output)."""
    _need("expand_into_jagged_permute", "cpu_kernel")
    in_off = torch.tensor([0, 2, 5, 6])
    out_off = torch.tensor([0, 1, 3, 6])
    run = functools.partial(_run, "expand_into_jagged_permute", "cpu_kernel")
    for bad in (3, -1):
        with pytest.raises(ValueError, match=r"permute: entry 1 out of range"):
            run(torch.tensor([2, bad, 0]), in_off, out_off, 6)
    for off in ([0, 4, 3, 6], [-1, 1, 3, 6], [0, 9, 3, 6]):
        with pytest.raises(ValueError, match=r"output_offset: must start at >= 0 and not "
                                             r"decrease"):
            run(torch.tensor([2, 1, 0]), in_off, torch.tensor(off), 6)
    with pytest.raises(ValueError, match=r"output_size: is 7 but output_offset ends at 6"):
        run(torch.tensor([2, 1, 0]), in_off, out_off, 7)


@pytest.mark.parametrize("cap", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_iota_fills_match_fbgemm_on_every_vector_path(cap, dtype, isa_cap):
    """offsets_range and expand_into_jagged_permute write each segment's run of integers with
    aligned vector stores after a scalar head: segments of length 0, 1, up to 300, starting at
    every alignment, on the scalar (0), AVX2 (1) and AVX-512 (2) paths, equal fbgemm's."""
    _need("offsets_range", "cpu_kernel")
    g = torch.Generator().manual_seed(17 + cap)
    lengths = torch.cat([torch.tensor([0, 1, 300, 7, 8, 9, 31, 33, 0, 65]),
                         torch.randint(0, 120, (60,), generator=g)]).to(dtype)
    offsets = ref.asynchronous_exclusive_cumsum(lengths)
    size = int(lengths.sum())
    perm = torch.randperm(lengths.numel(), generator=g).to(dtype)
    out_off = ref.asynchronous_complete_cumsum(lengths[perm.long()])
    in_off = ref.asynchronous_complete_cumsum(lengths)
    isa_cap(cap)
    _equal(_run("offsets_range", "cpu_kernel", offsets, size), FB.offsets_range(offsets, size))
    _equal(_run("expand_into_jagged_permute", "cpu_kernel", perm, in_off, out_off, size),
           FB.expand_into_jagged_permute(perm, in_off, out_off, size))


@BACKENDS
@EXAMPLES
@given(n=st.integers(0, 30), max_len=st.sampled_from([1, 4, 16]),
       dtype=st.sampled_from([torch.int32, torch.int64]), seed=st.integers(0, 2**16))
def test_offsets_range(backend, n, max_len, dtype, seed):
    _need("offsets_range", backend)
    g = torch.Generator().manual_seed(seed)
    lengths = _lengths(n, max_len, dtype, g)
    offsets = ref.asynchronous_exclusive_cumsum(lengths)
    size = int(lengths.sum())
    want = FB.offsets_range(offsets, size)
    _equal(_run("offsets_range", backend, offsets, size), want)


# --------------------------------------------------------------------------- segment_sum_csr


@BACKENDS
@EXAMPLES
@given(n=st.integers(0, 12), batch_size=st.integers(1, 4), max_len=st.sampled_from([1, 3, 6]),
       dtype=st.sampled_from([torch.float32, torch.int64]),  # fbgemm has no float64 kernel
       csr_dtype=st.sampled_from([torch.int32, torch.int64]), seed=st.integers(0, 2**16))
def test_segment_sum_csr(backend, n, batch_size, max_len, dtype, csr_dtype, seed):
    _need("segment_sum_csr", backend)
    g = torch.Generator().manual_seed(seed)
    csr = ref.asynchronous_complete_cumsum(_lengths(n, max_len, csr_dtype, g))
    values = (torch.randn(int(csr[-1]) * batch_size + 2, generator=g) * 50).to(dtype)  # + tail
    want = FB.segment_sum_csr(batch_size, csr, values)
    got = _run("segment_sum_csr", backend, batch_size, csr, values)
    _equal(got, want, exact=False)
    # backward vs autograd through a Python loop of slices
    v = values.double().requires_grad_()
    with tops.use_backend(backend, ops=["segment_sum_csr"]):
        out = OURS.segment_sum_csr(batch_size, csr, v)
    loop = torch.stack([v[int(csr[i]) * batch_size:int(csr[i + 1]) * batch_size].sum()
                        for i in range(n)]) if n else v[:0]
    go = torch.randn(n, dtype=torch.float64, generator=g)
    (gm,) = torch.autograd.grad(out, v, go, allow_unused=True)
    (gl,) = torch.autograd.grad(loop, v, go, allow_unused=True)
    torch.testing.assert_close(gm if gm is not None else torch.zeros_like(v),
                               gl if gl is not None else torch.zeros_like(v))


def test_segment_sum_csr_gradcheck():
    csr = torch.tensor([0, 2, 2, 3], dtype=torch.int32)
    v = torch.randn(8, dtype=torch.float64, requires_grad=True)
    for backend in _backends("segment_sum_csr"):
        with tops.use_backend(backend, ops=["segment_sum_csr"]):
            assert torch.autograd.gradcheck(lambda v: OURS.segment_sum_csr(2, csr, v), (v,))


# --------------------------------------------------------------------------- keyed_jagged_index_select_dim1


def _loop_kjt_select(values, lengths, indices, batch_size, weights=None):
    """float64 Python-loop oracle (fbgemm has no CPU kernel for this op)."""
    k = lengths.numel() // batch_size
    offs = [0] + torch.cumsum(lengths.long(), 0).tolist()
    vals, lens, ws = [], [], []
    for key in range(k):
        for i in indices.tolist():
            j = key * batch_size + i
            vals.append(values[offs[j]:offs[j + 1]])
            if weights is not None:
                ws.append(weights[offs[j]:offs[j + 1]])
            lens.append(int(lengths[j]))
    out = [torch.cat(vals) if vals else values[:0], torch.tensor(lens, dtype=lengths.dtype)]
    if weights is not None:
        out.append(torch.cat(ws) if ws else weights[:0])
    return out


def _test_kjt_select(backend, keys, batch_size, max_len, n_sel, index_dtype, dtype, weighted, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = _lengths(keys * batch_size, max_len, index_dtype, g)
    offsets = ref.asynchronous_complete_cumsum(lengths)
    n = int(lengths.sum())
    indices = torch.randint(0, batch_size, (n_sel,), generator=g).to(index_dtype)
    values = torch.randn(n, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    weights = torch.rand(n, generator=g).to(dtype) if weighted else None
    with tops.use_backend(backend, ops=["keyed_jagged_index_select_dim1"]):
        got = OURS.keyed_jagged_index_select_dim1(values, lengths, offsets, indices, batch_size,
                                                  weights)
        got_sum = OURS.keyed_jagged_index_select_dim1(values, lengths, offsets, indices,
                                                      batch_size, weights, int(got[1].sum()))
    want = _loop_kjt_select(values, lengths, indices, batch_size, weights)
    _equal([x.detach() for x in got], [x.detach() for x in want], "kjt_select")
    _equal([x.detach() for x in got_sum], [x.detach() for x in want], "kjt_select(sum)")
    go = torch.randn(got[0].shape, generator=g, dtype=torch.float64).to(dtype)
    (gm,) = torch.autograd.grad(got[0], values, go, allow_unused=True)
    (gl,) = torch.autograd.grad(want[0], values, go, allow_unused=True)
    z = torch.zeros_like(values)
    gm, gl = (gm if gm is not None else z), (gl if gl is not None else z)
    if dtype in (torch.float16, torch.bfloat16):
        # a value selected k times sums k gradients in 16 bits, in an order each side picks
        bound = 4 * torch.finfo(dtype).eps * max(n_sel, 1) * float(go.abs().max()) if go.numel() else 0
        torch.testing.assert_close(gm.double(), gl.double(), atol=bound, rtol=0)
    else:
        torch.testing.assert_close(gm, gl)


@BACKENDS
@EXAMPLES
@given(keys=st.integers(1, 4), batch_size=st.integers(1, 6), max_len=st.sampled_from([1, 3, 9]),
       n_sel=st.integers(0, 8), index_dtype=st.sampled_from([torch.int32, torch.int64]),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]),
       weighted=st.booleans(), seed=st.integers(0, 2**16))
def test_keyed_jagged_index_select_dim1(backend, keys, batch_size, max_len, n_sel, index_dtype,
                                        dtype, weighted, seed):
    _need("keyed_jagged_index_select_dim1", backend)
    _test_kjt_select(backend, keys, batch_size, max_len, n_sel, index_dtype, dtype, weighted, seed)


def test_keyed_jagged_index_select_dim1_gradcheck():
    lengths = torch.tensor([2, 0, 1, 3, 1, 1], dtype=torch.int64)
    offsets = ref.asynchronous_complete_cumsum(lengths)
    indices = torch.tensor([2, 0, 2], dtype=torch.int64)
    v = torch.randn(8, dtype=torch.float64, requires_grad=True)
    for backend in _backends("keyed_jagged_index_select_dim1"):
        with tops.use_backend(backend, ops=["keyed_jagged_index_select_dim1"]):
            assert torch.autograd.gradcheck(
                lambda v: OURS.keyed_jagged_index_select_dim1(v, lengths, offsets, indices, 3)[0],
                (v,))


# --------------------------------------------------------------------------- permute_pooled_embs

POOLED = ["permute_pooled_embs", "permute_pooled_embs_auto_grad",
          "permute_pooled_embs_auto_grad_split", "permute_pooled_embs_split"]
POOLED_FBGEMM_NO_AUTOGRAD = ("permute_pooled_embs", "permute_pooled_embs_split")


def _pooled_args(b, dims, dtype, g):
    dims_t = torch.tensor(dims, dtype=torch.int64)
    offset_dim_list = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(dims_t, 0)])
    permute = torch.randperm(len(dims), generator=g)
    inv_permute = torch.argsort(permute)
    inv_offset = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(dims_t[permute], 0)])
    pooled = torch.randn(b, int(dims_t.sum()), generator=g).to(dtype)
    return pooled, offset_dim_list, permute, inv_offset, inv_permute


@BACKENDS
@pytest.mark.parametrize("op", POOLED)
@EXAMPLES
@given(b=st.integers(0, 5), dims=st.lists(st.integers(1, 9), min_size=1, max_size=6),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       seed=st.integers(0, 2**16))
def test_permute_pooled_embs(backend, op, b, dims, dtype, seed):
    _need(op, backend)
    g = torch.Generator().manual_seed(seed)
    args = _pooled_args(b, dims, dtype, g)
    want = getattr(FB, op)(*args)
    _equal(_run(op, backend, *args), want)
    if op in POOLED_FBGEMM_NO_AUTOGRAD or b == 0:
        return
    # backward against fbgemm's autograd (both variants have one on CPU)
    x = args[0].detach().requires_grad_()
    x2 = args[0].detach().requires_grad_()
    with tops.use_backend(backend, ops=[op]):
        out = getattr(OURS, op)(x, *args[1:])
    out2 = getattr(FB, op)(x2, *args[1:])
    go = torch.randn(out.shape, generator=g).to(dtype)
    (gm,) = torch.autograd.grad(out, x, go)
    (gf,) = torch.autograd.grad(out2, x2, go)
    _equal(gm, gf, f"{op} grad")


@pytest.mark.parametrize("op", POOLED)
def test_permute_pooled_embs_gradcheck(op):
    g = torch.Generator().manual_seed(3)
    pooled, *rest = _pooled_args(3, [2, 3, 1], torch.float64, g)
    pooled.requires_grad_()
    for backend in _backends(op):
        with tops.use_backend(backend, ops=[op]):
            assert torch.autograd.gradcheck(lambda x: getattr(OURS, op)(x, *rest), (pooled,))


# --------------------------------------------------------------------------- bounds_check_indices


def _bounds_case(t, b, max_len, index_dtype, corrupt, vbe, g):
    rows = torch.randint(1, 12, (t,), generator=g).to(torch.int64)
    if vbe:
        bs = torch.randint(0, b + 1, (t,), generator=g)
        b_offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(bs, 0)]).int()
        total_b = int(bs.sum())
    else:
        b_offsets, total_b = None, t * b
    lengths = _lengths(total_b, max_len, torch.int64, g)
    offsets = ref.asynchronous_complete_cumsum(lengths)
    n = int(lengths.sum())
    indices = torch.randint(0, 12, (n,), generator=g)
    if corrupt:
        indices = torch.where(torch.rand(n, generator=g) < 0.2, -1 - 2 * indices, indices)
        indices = torch.where(torch.rand(n, generator=g) < 0.2, indices + 40, indices)
        noise = torch.randint(-3, 4, offsets.shape, generator=g)
        offsets = torch.where(torch.rand(offsets.shape, generator=g) < 0.3, offsets + noise, offsets)
    else:
        table = torch.repeat_interleave(
            torch.repeat_interleave(torch.arange(t), torch.tensor(
                [total_b // t] * t) if not vbe else (b_offsets[1:] - b_offsets[:-1]).long()),
            lengths)
        indices = torch.remainder(indices, rows[table])
    return rows, indices.to(index_dtype), offsets.to(index_dtype), b_offsets


def _test_bounds_check(backend, mode, t, b, max_len, index_dtype, corrupt, vbe, weighted, seed):
    g = torch.Generator().manual_seed(seed)
    rows, indices, offsets, b_offsets = _bounds_case(t, b, max_len, index_dtype, corrupt, vbe, g)
    weights = torch.rand(indices.numel(), generator=g) if weighted else None
    max_b = b if vbe else -1
    mine = [indices.clone(), offsets.clone(), torch.full((1,), 77, dtype=torch.int64)]
    theirs = [indices.clone(), offsets.clone(), torch.full((1,), 77, dtype=torch.int64)]
    fb_mode = {4: 2, 5: 1, 6: 0}.get(mode, mode)  # fbgemm's CPU kernel has no V2 path
    fb_err = ours_err = None
    try:
        FB.bounds_check_indices(rows, theirs[0], theirs[1], fb_mode, theirs[2], weights,
                                b_offsets, max_b)
    except RuntimeError as e:
        fb_err = e
    try:
        _run("bounds_check_indices", backend, rows, mine[0], mine[1], mode, mine[2], weights,
             b_offsets, max_b)
    except ValueError as e:
        ours_err = e
    assert (fb_err is None) == (ours_err is None), (fb_err, ours_err)
    _equal(mine, theirs, f"bounds_check mode {mode}")
    if not corrupt:
        assert torch.equal(mine[0], indices) and torch.equal(mine[1], offsets)


@BACKENDS
@EXAMPLES
@given(mode=st.integers(0, 6), t=st.integers(1, 3), b=st.integers(0, 4),
       max_len=st.sampled_from([1, 3, 6]), index_dtype=st.sampled_from([torch.int32, torch.int64]),
       corrupt=st.booleans(), vbe=st.booleans(), weighted=st.booleans(),
       seed=st.integers(0, 2**16))
def test_bounds_check_indices(backend, mode, t, b, max_len, index_dtype, corrupt, vbe, weighted,
                              seed):
    _need("bounds_check_indices", backend)
    _test_bounds_check(backend, mode, t, b, max_len, index_dtype, corrupt, vbe, weighted, seed)


@BACKENDS
@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_bounds_check_indices_every_mode_corrupt(backend, mode):
    _need("bounds_check_indices", backend)
    for seed in range(4):
        _test_bounds_check(backend, mode, 3, 4, 5, torch.int64, True, seed % 2 == 1, True, seed)


def test_bounds_check_warning_counts_and_mutates_in_place():
    rows = torch.tensor([4, 2], dtype=torch.int64)
    indices = torch.tensor([0, 5, 3, -1, 1, 2, -4])
    offsets = torch.tensor([0, 2, 4, 6, 9])  # last offset is past the 7 indices
    warning = torch.full((1,), 5, dtype=torch.int64)
    sparse.bounds_check_indices(rows, indices, offsets, sparse.BoundsCheckMode.WARNING, warning)
    # last offset fixed (1), idx 5 >= 4 (1), idx 2 >= 2 in table 1 (1), -4 (1); -1 is pruned
    assert warning.tolist() == [4]
    assert offsets.tolist() == [0, 2, 4, 6, 7]
    assert indices.tolist() == [0, 0, 3, -1, 1, 0, 0]
    with pytest.raises(ValueError, match="indices"):
        sparse.bounds_check_indices(rows, torch.tensor([0, 5]), torch.tensor([0, 1, 2]),
                                    sparse.BoundsCheckMode.FATAL, warning)


# --------------------------------------------------------------------------- fake kernels


def _opcheck_cases():
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([[2, 0, 1], [1, 3, 0]], dtype=torch.int64)
    values = torch.arange(7, dtype=torch.int64)
    w = torch.rand(7, generator=g)
    p32 = torch.tensor([1, 0], dtype=torch.int32)
    l1 = torch.tensor([2, 0, 3], dtype=torch.int64)
    off = ref.asynchronous_complete_cumsum(l1)
    pooled, *prest = _pooled_args(2, [2, 3], torch.float32, g)
    kl = torch.tensor([2, 0, 1, 3], dtype=torch.int64)
    return [
        ("permute_2D_sparse_data", (p32, lengths, values.float().requires_grad_(), w, 7)),
        ("permute_1D_sparse_data", (torch.tensor([2, 0], dtype=torch.int32), l1,
                                    torch.rand(5, requires_grad=True), None, 5)),
        ("block_bucketize_sparse_features", (l1, torch.tensor([0, 7, 3, 9, 1]), True, True,
                                             torch.tensor([4]), 3, torch.rand(5))),
        ("invert_permute", (torch.tensor([2, 0, 1]),)),
        ("expand_into_jagged_permute", (torch.tensor([2, 0, 1]), off,
                                        ref.asynchronous_complete_cumsum(l1[[2, 0, 1]]), 5)),
        ("bounds_check_indices", (torch.tensor([4, 3]), torch.tensor([0, 5, 1, 2]),
                                  torch.tensor([0, 1, 2, 3, 4]), 2, torch.zeros(1, dtype=torch.int64))),
        ("segment_sum_csr", (2, torch.tensor([0, 1, 3], dtype=torch.int32),
                             torch.rand(6, requires_grad=True))),
        ("keyed_jagged_index_select_dim1", (torch.rand(6, requires_grad=True), kl,
                                            ref.asynchronous_complete_cumsum(kl),
                                            torch.tensor([1, 0, 1]), 2, None, 9)),
        ("offsets_range", (torch.tensor([0, 2, 2]), 5)),
    ] + [(op, (pooled.clone().requires_grad_(), *prest)) for op in POOLED]


@pytest.mark.parametrize("op,args", _opcheck_cases(), ids=lambda x: x if isinstance(x, str) else "")
def test_opcheck(op, args):
    overload = getattr(OURS, op).default
    if op in _MIXED_OUTPUTS:
        # opcheck's AOT harness sums every output into one float: it cannot backprop through
        # integer outputs, so check autograd registration here and AOT dispatch without grads
        torch.library.opcheck(overload, args, test_utils=(
            "test_schema", "test_autograd_registration", "test_faketensor"))
        args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    torch.library.opcheck(overload, args)


_MIXED_OUTPUTS = {"permute_2D_sparse_data", "permute_1D_sparse_data",
                  "keyed_jagged_index_select_dim1"}


# --------------------------------------------------------------------------- validation


def _bad(fn, match, *args, **kwargs):
    with pytest.raises(ValueError, match=match):
        fn(*args, **kwargs)


def test_public_entry_points_match_fbgemm():
    g = torch.Generator().manual_seed(1)
    lengths = _lengths(12, 5, torch.int64, g).reshape(3, 4)
    values = torch.arange(int(lengths.sum()))
    p = torch.tensor([2, 0, 1], dtype=torch.int32)
    _equal(sparse.permute_2D_sparse_data(p, lengths, values),
           FB.permute_2D_sparse_data(p, lengths, values))
    _equal(tops.permute_1D_sparse_data(p, lengths[0].clone()[:3], values[:int(lengths[0, :3].sum())]),
           FB.permute_1D_sparse_data(p, lengths[0].clone()[:3], values[:int(lengths[0, :3].sum())]))
    pooled, *rest = _pooled_args(2, [2, 3, 1], torch.float32, g)
    _equal(tops.permute_pooled_embs_auto_grad_split(pooled, *rest),
           FB.permute_pooled_embs_auto_grad_split(pooled, *rest))
    off = ref.asynchronous_exclusive_cumsum(lengths.reshape(-1))
    _equal(tops.offsets_range(off, int(lengths.sum())), FB.offsets_range(off, int(lengths.sum())))


def test_validation_errors():
    p = torch.tensor([1, 0], dtype=torch.int32)
    lengths = torch.tensor([[1, 2], [0, 3]])
    values = torch.arange(6)
    f2 = sparse.permute_2D_sparse_data
    _bad(f2, "permute: dtype int64", p.long(), lengths, values)
    _bad(f2, "lengths: must be non-negative", p, torch.tensor([[1, -2], [0, 7]]), values)
    _bad(f2, "lengths: sums to 5", p, torch.tensor([[1, 1], [0, 3]]), values)
    _bad(f2, r"permute: permute\[0\]=2 is outside \[0, 2\)", torch.tensor([2, 0], dtype=torch.int32),
         lengths, values)
    _bad(f2, "weights: has 5 entries", p, lengths, values, torch.rand(5))
    _bad(f2, "permuted_lengths_sum", p, lengths, values, None, 4)
    if torch.device("meta") is not None:
        _bad(f2, "on device meta", p, lengths, values.to("meta"))
    bb = sparse.block_bucketize_sparse_features
    bl = torch.tensor([1, 2, 0, 1])
    bi = torch.tensor([0, 5, 9, 3])
    _bad(bb, "lengths: sums to 5", torch.tensor([1, 2, 0, 2]), bi, False, False, torch.tensor([4, 4]), 2)
    _bad(bb, "block_sizes: dtype int32", bl, bi, False, False, torch.tensor([4, 4], dtype=torch.int32), 2)
    _bad(bb, "my_size: must be >= 1", bl, bi, False, False, torch.tensor([4, 4]), 0)
    _bad(bb, "not a multiple", torch.tensor([1, 2, 1]), bi, False, False, torch.tensor([4, 4]), 2)
    _bad(bb, r"block_bucketize_pos\[0\]: must start at 0", bl, bi, False, False,
         torch.tensor([4, 4]), 2, block_bucketize_pos=[torch.tensor([1, 4, 8])] * 2)
    _bad(bb, "non-decreasing", bl, bi, False, False, torch.tensor([4, 4]), 2,
         block_bucketize_pos=[torch.tensor([0, 9, 8])] * 2)
    _bad(bb, "total_num_blocks", bl, bi, False, False, torch.tensor([4, 4]), 2,
         total_num_blocks=torch.tensor([3, 4]))
    _bad(sparse.invert_permute, "must be a permutation", torch.tensor([0, 0, 2]))
    _bad(sparse.invert_permute, "outside", torch.tensor([0, 3, 1]))
    ex = sparse.expand_into_jagged_permute
    _bad(ex, "input_offset: must start at 0", torch.tensor([1, 0]), torch.tensor([1, 2, 3]),
         torch.tensor([0, 1, 2]), 2)
    _bad(ex, "output_offset: must be non-decreasing", torch.tensor([1, 0]), torch.tensor([0, 2, 3]),
         torch.tensor([0, 2, 1]), 1)
    _bad(ex, "differs from", torch.tensor([1, 0]), torch.tensor([0, 2, 3], dtype=torch.int32),
         torch.tensor([0, 1, 3]), 3)
    _bad(ex, "output_size", torch.tensor([1, 0]), torch.tensor([0, 2, 3]), torch.tensor([0, 1, 3]), 4)
    bc = sparse.bounds_check_indices
    w = torch.zeros(1, dtype=torch.int64)
    _bad(bc, "offsets: dtype int32 differs", torch.tensor([4]), torch.tensor([0, 1]),
         torch.tensor([0, 2], dtype=torch.int32), 0, w)
    _bad(bc, "bounds_check_mode", torch.tensor([4]), torch.tensor([0, 1]), torch.tensor([0, 2]), 9, w)
    _bad(bc, "rows_per_table: dtype int32", torch.tensor([4], dtype=torch.int32),
         torch.tensor([0, 1]), torch.tensor([0, 2]), 0, w)
    _bad(bc, "not B", torch.tensor([4, 4]), torch.tensor([0, 1]), torch.tensor([0, 1, 1, 2, 2, 2]), 0, w)
    _bad(bc, r"indices\[1\]=4", torch.tensor([4]), torch.tensor([0, 4]), torch.tensor([0, 2]), 0, w)
    _bad(bc, "offsets: bag 0", torch.tensor([4]), torch.tensor([0, 1]), torch.tensor([1, 0, 2]), 0, w)
    _bad(bc, "last offset 3", torch.tensor([4]), torch.tensor([0, 1]), torch.tensor([0, 3]), 0, w)
    ss = sparse.segment_sum_csr
    _bad(ss, "csr_seg: must start at 0", 2, torch.tensor([1, 2]), torch.rand(4))
    _bad(ss, "exceeds the 4 values", 2, torch.tensor([0, 3]), torch.rand(4))
    ks = sparse.keyed_jagged_index_select_dim1
    kl = torch.tensor([1, 2, 0, 1])
    ko = ref.asynchronous_complete_cumsum(kl)
    kv = torch.rand(4)
    _bad(ks, r"indices: indices\[0\]=2 is outside \[0, 2\)", kv, kl, ko, torch.tensor([2]), 2)
    _bad(ks, "batch_size: 3 must be > 0 and divide", kv, kl, ko, torch.tensor([0]), 3)
    _bad(ks, "complete cumsum of lengths", kv, kl, torch.tensor([0, 2, 3, 3, 4]), torch.tensor([0]), 2)
    _bad(ks, "offsets: last offset 5 exceeds", kv, kl, torch.tensor([0, 1, 3, 3, 5]), torch.tensor([0]), 2)
    _bad(ks, "offsets: must be non-decreasing", kv, torch.tensor([1, 3, -1, 1]),
         torch.tensor([0, 1, 4, 3, 4]), torch.tensor([0]), 2)
    _bad(sparse.offsets_range, "offsets: must start at 0", torch.tensor([1, 3]), 5)
    _bad(sparse.offsets_range, "last offset 6 exceeds", torch.tensor([0, 6]), 5)
    pooled, *rest = _pooled_args(2, [2, 3], torch.float32, torch.Generator().manual_seed(0))
    pp = sparse.permute_pooled_embs
    _bad(pp, "inv_permute_list: must be the inverse", pooled, rest[0], rest[1], rest[2],
         torch.tensor([0, 0]))
    _bad(pp, "offset_dim_list: ends at 5 but pooled_embs has 4", pooled[:, :4], *rest)
    _bad(pp, "permute_list: dtype int32", pooled, rest[0], rest[1].int(), rest[2], rest[3])


def test_validate_false_skips_value_checks():
    # a negative length passes the structural checks without validate (no value reads)
    p = torch.tensor([0], dtype=torch.int32)
    got = sparse.permute_1D_sparse_data(p, torch.tensor([2]), torch.arange(2), validate=False)
    assert got[1].tolist() == [0, 1]


# --------------------------------------------------------------------------- TorchRec KJT


def _kjt_ops(kjt_mod):
    KJT = kjt_mod.KeyedJaggedTensor
    g = torch.Generator().manual_seed(5)
    keys = ["f0", "f1", "f2", "f3"]
    lengths = _lengths(len(keys) * 5, 6, torch.int64, g)
    values = torch.randint(0, 1000, (int(lengths.sum()),), generator=g)
    weights = torch.rand(int(lengths.sum()), generator=g)
    kjt = KJT.from_lengths_sync(keys=keys, values=values, lengths=lengths, weights=weights)
    out = {}
    p = kjt.permute([3, 1, 0, 2, 1])
    out["permute"] = (p.values(), p.lengths(), p.weights(), p.offsets())
    for i, part in enumerate(kjt.split([1, 2, 1])):
        out[f"split{i}"] = (part.values(), part.lengths(), part.weights())
    for k, jt in kjt.to_dict().items():
        out[f"dict_{k}"] = (jt.values(), jt.lengths(), jt.weights())
    out["offsets"] = (KJT.from_lengths_sync(keys=keys, values=values, lengths=lengths).offsets(),)
    return out


def test_torchrec_kjt_on_our_kernels():
    kjt_mod = pytest.importorskip("torchrec.sparse.jagged_tensor")
    want = _kjt_ops(kjt_mod)
    with tops.use_backend("reference", replace_fbgemm=True):
        got = _kjt_ops(kjt_mod)
    assert got.keys() == want.keys()
    for k in want:
        _equal(got[k], want[k], k)


# --------------------------------------------------------------------------- docs/ops.md


def _gen_ops():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[2] / "docs" / "gen_ops.py"
    spec_ = importlib.util.spec_from_file_location("gen_ops", path)
    gen = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(gen)
    return gen


def test_docs_coverage_table_is_generated():
    """docs/ops.md's coverage table is what docs/gen_ops.py builds from the registry today."""
    gen = _gen_ops()
    assert gen.documented_coverage() == gen.coverage_markdown().strip(), \
        "docs/ops.md coverage table is stale: run python docs/gen_ops.py"


def test_docs_benchmark_table_is_the_committed_run():
    """docs/ops.md's benchmark tables are benchmarks/results/ops_<cpu kind>.json's (a full
    benchmark run rewrites its kind's file and the tables; a stale table would misreport the
    ratios)."""
    gen = _gen_ops()
    bench = gen.benchmark_markdown()
    assert bench is not None, "no benchmarks/results/ops_<cpu kind>.json"
    assert gen.documented_benchmark() == bench.strip(), \
        "docs/ops.md benchmark table is stale: run python docs/gen_ops.py"
