"""Jagged op family (ops/jagged.py): every backend against fbgemm-gpu-cpu, forward and backward,
with one and with 2-4 jagged dimensions.

One shared parity body, :func:`check_parity`, runs every op of the family: it builds fresh random
inputs (ragged lengths that include 0, 1 and the max, empty batches, truncation below and padding
above the longest sequence), runs fbgemm's CPU kernels with their own autograd as the oracle, then
runs ours three ways with the backend forced -- ``torch.ops.torchrec_ascend.<op>``,
``torch.ops.fbgemm.<op>`` with fbgemm's CPU kernels replaced by ours (how TorchRec reaches us),
and the validating public entry point -- and compares outputs and gradients.  Thin hypothesis
wrappers drive it per op (generative-recommenders style); ``test_jagged_triton.py`` reuses it
for the Triton backend.  Besides: float64 ``gradcheck``, ``torch.library.opcheck`` of every
fake kernel, and the ValueErrors of the public entry points.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchrec_ascend.ops as tops
from torchrec_ascend.ops import jagged, registry

fbgemm_gpu = pytest.importorskip("fbgemm_gpu")
FB = torch.ops.fbgemm
OURS = torch.ops.torchrec_ascend
EXAMPLES = settings(max_examples=4, deadline=None)
FLOATS = (torch.float32, torch.bfloat16, torch.float16)


# --------------------------------------------------------------------------- inputs


@dataclasses.dataclass
class Jag:
    """One random jagged batch shape: ``lengths [B]`` and the padded length ``N`` under test."""

    lengths: torch.Tensor  # int64
    n: int  # max_L / max_lengths / dense N: below, at or above the longest sequence
    dtype: torch.dtype
    index_dtype: torch.dtype
    width: int
    g: torch.Generator

    @property
    def b(self) -> int:
        return self.lengths.numel()

    @property
    def t(self) -> int:
        return int(self.lengths.sum())

    @property
    def offsets(self) -> torch.Tensor:
        out = torch.zeros(self.b + 1, dtype=torch.int64)
        torch.cumsum(self.lengths, 0, out=out[1:])
        return out.to(self.index_dtype)

    def rand(self, *shape: int, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        return torch.randn(shape, generator=self.g, dtype=torch.float64).to(dtype or self.dtype)


def make_lengths(b: int, max_len: int, g: torch.Generator) -> torch.Tensor:
    """Ragged lengths in ``[0, max_len]`` containing 0, 1 and ``max_len`` whenever ``b >= 3``."""
    x = torch.randint(0, max_len + 1, (b,), generator=g)
    for i, v in enumerate((0, 1, max_len)[:b]):
        x[(i * 5) % b] = v
    return x


def make_jag(b: int, max_len: int, pad: str, dtype: torch.dtype, index_dtype: torch.dtype,
             width: int, seed: int) -> Jag:
    """``pad``: ``"short"`` (N below the longest: truncation), ``"exact"``, ``"long"``."""
    g = torch.Generator().manual_seed(seed)
    lengths = make_lengths(b, max_len, g)
    n = {"short": max(max_len - 2, 0), "exact": max_len, "long": max_len + 2}[pad]
    return Jag(lengths, n, dtype, index_dtype, width, g)


# --------------------------------------------------------------------------- the op table


@dataclasses.dataclass(frozen=True)
class Case:
    """One public op of the family.

    build: fresh random arguments (in fbgemm's argument order) for a :class:`Jag`.
    grad_at: positions of the differentiable arguments.
    fbgemm_fn: the oracle, built from fbgemm ops whose own autograd is sound (default: the fbgemm
        op of the same name); used for forward and backward.
    keep: boolean mask over the jagged rows where fbgemm's result is defined (rows outside it
        are compared against 0, our documented value).
    exact: outputs are copies of inputs (no arithmetic): compare bit for bit.
    empty_ok: fbgemm accepts an empty batch.
    """

    op: str
    build: Callable[[Jag], tuple]
    grad_at: Tuple[int, ...]
    fbgemm_fn: Optional[Callable] = None
    keep: Optional[Callable[[Jag], torch.Tensor]] = None
    exact: bool = False
    empty_ok: bool = True

    def oracle(self) -> Callable:
        return self.fbgemm_fn or getattr(FB, self.op)


def _rows_within(j: Jag) -> torch.Tensor:
    """Jagged rows whose position inside their sequence is ``< N``."""
    pos = torch.cat([torch.arange(int(n)) for n in j.lengths]) if j.b else torch.zeros(0)
    return (pos < j.n).reshape(-1)


def _stacked_lengths(j: Jag) -> torch.Tensor:
    return torch.stack([j.lengths, j.lengths.flip(0)]).to(j.index_dtype)


def _stacked_oracle(values, lengths, offset_per_key, max_lengths_per_key, padding_value=0):
    # fbgemm's stacked op has no autograd on CPU: per key through jagged_to_padded_dense
    out = []
    for k in range(lengths.shape[0]):
        off = torch.zeros(lengths.shape[1] + 1, dtype=lengths.dtype)
        torch.cumsum(lengths[k], 0, out=off[1:])
        out.append(FB.jagged_to_padded_dense(
            values[offset_per_key[k]:offset_per_key[k + 1]], [off], [max_lengths_per_key[k]],
            float(padding_value)))
    return out


def _jdd_oracle(x, offsets, y0, y1):
    # fbgemm's own backward rejects y_0 / y_1 of different N: compose two fbgemm ops instead
    out, offs = FB.jagged_dense_elementwise_add_jagged_output(x, offsets, y0)
    return out + FB.dense_to_jagged(y1, offsets, x.shape[0])[0], offs


CASES: Dict[str, Case] = {c.op: c for c in [
    Case("jagged_to_padded_dense",
         lambda j: (j.rand(j.t, j.width), [j.offsets], [j.n], -1.5), (0,), exact=True),
    Case("dense_to_jagged",
         lambda j: (j.rand(j.b, j.n, j.width), [j.offsets], j.t), (0,), exact=True),
    Case("jagged_1d_to_dense",
         lambda j: (j.rand(j.t), j.offsets, max(j.n, 1), 7), (0,), exact=True),  # fbgemm: N > 0
    Case("jagged_2d_to_dense",
         lambda j: (j.rand(j.t, j.width), j.offsets, max(j.n, 1)), (0,), exact=True),
    Case("stacked_jagged_2d_to_dense",
         lambda j: (j.rand(2 * j.t, j.width), _stacked_lengths(j), [0, j.t, 2 * j.t],
                    [j.n, j.n + 1], 3), (0,), fbgemm_fn=_stacked_oracle, exact=True),
    Case("jagged_dense_elementwise_add",
         lambda j: (j.rand(j.t, j.width), [j.offsets], j.rand(j.b, j.n, j.width)), (0, 2),
         # fbgemm registers no autograd for it (torch warns "silently incorrect")
         fbgemm_fn=lambda x, off, y: FB.jagged_to_padded_dense(x, off, [y.shape[1]]) + y),
    Case("jagged_dense_elementwise_add_jagged_output",
         lambda j: (j.rand(j.t, j.width), [j.offsets], j.rand(j.b, j.n, j.width)), (0, 2)),
    Case("jagged_dense_elementwise_mul",
         lambda j: (j.rand(j.t, j.width), [j.offsets], j.rand(j.b, j.n, j.width)), (0, 2),
         # fbgemm's backward kernel has no bfloat16: multiply by y gathered to the jagged rows
         fbgemm_fn=lambda x, off, y: (x * FB.dense_to_jagged(y, off, x.shape[0])[0], off)),
    Case("jagged_dense_dense_elementwise_add_jagged_output",
         lambda j: (j.rand(j.t, j.width), [j.offsets], j.rand(j.b, j.n, j.width),
                    j.rand(j.b, j.n + 1, j.width)), (0, 2, 3), fbgemm_fn=_jdd_oracle),
    Case("jagged_softmax",
         lambda j: (j.rand(j.t, j.width), j.offsets, j.n), (0,), keep=_rows_within),
    Case("jagged_jagged_bmm",
         lambda j: (j.rand(j.t, j.width), j.rand(j.t, j.width + 1), j.offsets, j.n), (0, 1)),
    Case("jagged_dense_bmm",
         lambda j: (j.rand(j.t, j.width), j.offsets, j.rand(j.b, j.width, j.width + 2), j.n),
         (0, 2)),
    Case("batched_dense_vec_jagged_2d_mul",  # H = 2 heads of D = width
         lambda j: (j.rand(2 * j.b, j.n), j.rand(j.t, 2 * j.width), j.offsets), (0, 1)),
    Case("jagged_index_select",
         lambda j: (j.rand(j.t, j.width), j.lengths.to(j.index_dtype),
                    torch.randint(0, max(j.b, 1), (j.b + 2,), generator=j.g).to(j.index_dtype)
                    [: j.b + 2 if j.b else 0]), (0,), exact=True, empty_ok=False),
    Case("jagged_slice",  # fbgemm: 1-D values, int64 lengths and starts only
         lambda j: (j.rand(j.t), j.lengths,
                    (torch.rand(j.b, generator=j.g) * (j.lengths + 1)).floor().long(),
                    max(j.n - 1, 0)), (0,), exact=True),
]}


# --------------------------------------------------------------------------- running


def family_backends(backend: str) -> List[str]:
    """The family's ops that ``backend`` can run on cpu here."""
    return [o for o in jagged.OP_NAMES
            if backend in [b for b, _ in registry.available_backends(o, "cpu")]]


@contextlib.contextmanager
def forced(backend: str, replace_fbgemm: bool = False) -> Iterator[None]:
    """The whole family on ``backend`` where it has the op, on the reference elsewhere; with
    ``replace_fbgemm`` fbgemm's own CPU kernels are replaced by ours too."""
    with tops.use_backend("reference", ops=jagged.OP_NAMES, device="cpu",
                          replace_fbgemm=replace_fbgemm):
        with tops.use_backend(backend, ops=family_backends(backend), device="cpu"):
            yield


def flat(out) -> List[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in flat(o)]


def poison(like: Sequence[torch.Tensor]) -> None:
    """Fill freed memory of the outputs' sizes with NaN: the allocator hands those blocks to the
    next allocations, so an output slot a kernel forgets to write shows up as NaN."""
    junk = [torch.full((max(t.numel(), 1) * t.element_size() // 4 + 16,), float("nan"))
            for t in like]
    del junk  # freed at once (reference counting)


def fwd_bwd(fn: Callable, args: tuple, grad_at: Tuple[int, ...], seed: int,
            like: Optional[Sequence[torch.Tensor]] = None):
    """(outputs, grads of the ``grad_at`` arguments) for fixed upstream gradients."""
    args = tuple(a.detach().clone().requires_grad_() if i in grad_at else a
                 for i, a in enumerate(args))
    if like is not None:
        poison(like)
    outs = flat(fn(*args))
    diff = [o for o in outs if o.requires_grad]
    g = torch.Generator().manual_seed(seed)
    ups = [torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype) for o in diff]
    inputs = [args[i] for i in grad_at]
    grads = torch.autograd.grad(diff, inputs, ups, allow_unused=True) if diff else [None] * len(inputs)
    grads = [torch.zeros_like(x) if gr is None else gr for gr, x in zip(grads, inputs)]
    return [o.detach() for o in outs], grads


def tolerance(dtype: torch.dtype, exact: bool) -> dict:
    if exact:
        return dict(rtol=0, atol=0)
    return {torch.float64: dict(rtol=1e-9, atol=1e-10), torch.float32: dict(rtol=1e-4, atol=1e-5),
            torch.bfloat16: dict(rtol=4e-2, atol=4e-2),
            torch.float16: dict(rtol=1e-2, atol=1e-2)}[dtype]


def assert_same(got: torch.Tensor, want: torch.Tensor, name: str, tol: dict,
                keep: Optional[torch.Tensor] = None) -> None:
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
    if keep is not None and got.is_floating_point() and got.shape[:1] == keep.shape:
        assert bool((got[~keep] == 0).all()), f"{name}: rows past max_L must be 0"
        got, want = got[keep], want[keep]
    if got.is_floating_point():
        assert bool(torch.isfinite(got).all()), f"{name}: non-finite values (unwritten slots?)"
    torch.testing.assert_close(got, want, msg=lambda m: f"{name}: {m}", **tol)


def check_parity(op: str, backend: str, j: Jag, seed: int = 0) -> None:
    """The shared body: ``op`` on ``backend`` against fbgemm's CPU kernels, forward + backward."""
    case = CASES[op]
    if not family_backends(backend):
        pytest.skip(f"no jagged op has a {backend} backend here")
    if j.b == 0 and not case.empty_ok:
        j.lengths = torch.tensor([0, 2])
    args = case.build(j)
    want, want_g = fwd_bwd(case.oracle(), args, case.grad_at, seed)
    keep = case.keep(j) if case.keep is not None else None
    tol = tolerance(j.dtype, case.exact)
    runs = {
        "torchrec_ascend": (lambda: getattr(OURS, op), False),
        "fbgemm-replaced": (case.oracle, True),
    }
    for how, (fn, replace) in runs.items():
        with forced(backend, replace_fbgemm=replace):
            got, got_g = fwd_bwd(fn(), args, case.grad_at, seed, like=want)
        for i, (a, b) in enumerate(zip(got, want)):
            assert_same(a, b, f"{op}[{backend}, {how}] out{i}", tol, keep)
        assert len(got) == len(want), f"{op}: {len(got)} outputs, fbgemm has {len(want)}"
        for i, a, b in zip(case.grad_at, got_g, want_g):
            # gradients: sums over rows, so never bit-exact in half precision
            gtol = tolerance(j.dtype, case.exact and j.dtype == torch.float32)
            assert_same(a, b, f"{op}[{backend}, {how}] grad arg{i}", gtol, keep)
    # the validating public entry point (same argument order as fbgemm), forward
    with forced(backend):
        pub = flat(getattr(jagged, op)(*args))
    for i, (a, b) in enumerate(zip(pub, want)):
        assert_same(a, b, f"{op}[{backend}, public] out{i}", tol, keep)
    # fbgemm's native op (no oracle substitution) agrees on the forward too
    if case.fbgemm_fn is not None:
        native = flat(getattr(FB, op)(*args))
        for i, (a, b) in enumerate(zip(native, want)):
            assert_same(a, b, f"{op} fbgemm native vs oracle out{i}", tol, keep)


# --------------------------------------------------------------------------- parity tests


def jag_strategy(dtypes=FLOATS):
    return st.builds(
        make_jag, b=st.integers(0, 6), max_len=st.sampled_from([1, 4, 9]),
        pad=st.sampled_from(["short", "exact", "long"]), dtype=st.sampled_from(dtypes),
        index_dtype=st.sampled_from([torch.int64, torch.int32]), width=st.sampled_from([1, 3]),
        seed=st.integers(0, 2**16))


BACKENDS = ["reference", "cpu_kernel"]


@pytest.mark.parametrize("op", list(CASES))
@pytest.mark.parametrize("backend", BACKENDS)
@EXAMPLES
@given(j=jag_strategy())
def test_parity_with_fbgemm(op, backend, j):
    check_parity(op, backend, j)


@pytest.mark.parametrize("op", list(CASES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_parity_edge_shapes(op, backend):
    # deterministic corners: empty batch, all-empty sequences, one long sequence, N = 0
    for lengths, n in (([], 3), ([0, 0, 0], 2), ([1], 1), ([0, 5, 1], 5), ([2, 3], 0)):
        j = Jag(torch.tensor(lengths, dtype=torch.int64), n, torch.float32, torch.int64, 3,
                torch.Generator().manual_seed(len(lengths) + n))
        check_parity(op, backend, j)


def test_every_fbgemm_jagged_op_is_covered():
    public = {o for o in jagged.OP_NAMES if not o.endswith(("_forward", "_backward"))}
    assert public == set(CASES), "a jagged op without a parity case (or a stale case)"
    assert set(jagged.__all__) == set(CASES)


# --------------------------------------------------------------------------- gradcheck (float64)


@pytest.mark.parametrize("op", list(CASES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_gradcheck_float64(op, backend):
    if not family_backends(backend):
        pytest.skip(f"no jagged op has a {backend} backend here")
    case = CASES[op]
    j = Jag(torch.tensor([2, 0, 3, 1]), 2, torch.float64, torch.int64, 2,
            torch.Generator().manual_seed(3))
    args = case.build(j)

    def fn(*diff):
        full = list(args)
        for i, d in zip(case.grad_at, diff):
            full[i] = d
        return tuple(o for o in flat(getattr(OURS, op)(*full)) if o.is_floating_point())

    inputs = tuple(args[i].detach().clone().requires_grad_() for i in case.grad_at)
    with forced(backend):
        assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7)


# --------------------------------------------------------------------------- fake kernels


def _opcheck_cases() -> List[Tuple[str, tuple]]:
    # N = 3 = the longest: fbgemm's softmax leaves rows past max_L unset (eager != traced)
    j = Jag(torch.tensor([2, 0, 3, 1]), 3, torch.float32, torch.int64, 3,
            torch.Generator().manual_seed(4))
    off, t, b = j.offsets, j.t, j.b
    x, dense = j.rand(t, 3), j.rand(b, 2, 3)
    out = [(op, c.build(j)) for op, c in CASES.items()]
    out += [
        ("jagged_to_padded_dense_forward", (x, [off], [2], 0.5)),
        ("jagged_to_padded_dense_backward", (dense, [off], t)),
        ("dense_to_jagged_forward", (dense, [off], t)),
        ("stacked_jagged_2d_to_dense_forward", CASES["stacked_jagged_2d_to_dense"].build(j)),
        ("stacked_jagged_2d_to_dense_backward",
         (b, 3, 2 * t, [dense, j.rand(b, 3, 3)], [off, off.clone()], [0, t, 2 * t])),
        ("jagged_dense_elementwise_mul_forward", (x, [off], dense)),
        ("jagged_dense_elementwise_mul_backward", (x, [off], dense, j.rand(t, 3))),
        ("jagged_dense_dense_elementwise_add_jagged_output_forward",
         (x, [off], dense, j.rand(b, 4, 3))),
        ("jagged_softmax_forward", (x, off, 3)),  # fbgemm: rows past max_L unset
        ("jagged_softmax_backward", (x, j.rand(t, 3), off, 3)),  # fbgemm: rows past max_L unset
        ("jagged_jagged_bmm_forward", (x, j.rand(t, 4), off, 2)),
        ("jagged_dense_bmm_forward", (x, off, j.rand(b, 3, 5), 2)),
        ("batched_dense_vec_jagged_2d_mul_forward", (j.rand(2 * b, 2), j.rand(t, 4), off)),
        ("batched_dense_vec_jagged_2d_mul_backward",
         (j.rand(2 * b, 2), j.rand(2 * b, 2), j.rand(t, 4), off)),
    ]
    return out


_DATA_DEPENDENT = {"jagged_index_select", "jagged_slice"}  # output rows read from lengths


@pytest.mark.parametrize("op,args", _opcheck_cases(), ids=lambda x: x if isinstance(x, str) else "")
def test_opcheck(op, args):
    case = CASES.get(op)
    grad_at = case.grad_at if case is not None else ()
    args = tuple(a.requires_grad_() if i in grad_at else a for i, a in enumerate(args))
    overload = getattr(OURS, op).default
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    if op not in _DATA_DEPENDENT:
        utils += ("test_aot_dispatch_dynamic",)
    torch.library.opcheck(overload, args, test_utils=utils)


def test_opcheck_covers_every_op():
    assert {op for op, _ in _opcheck_cases()} == set(jagged.OP_NAMES)


@pytest.mark.parametrize("op,args", [c for c in _opcheck_cases() if c[0] in
                                     ("jagged_jagged_bmm_forward", "jagged_dense_bmm_forward",
                                      "jagged_to_padded_dense_forward", "dense_to_jagged_forward",
                                      "jagged_softmax_forward")],
                         ids=lambda x: x if isinstance(x, str) else "")
def test_fbgemm_fake_kernels_agree_with_our_cpu_kernels(op, args):
    # fbgemm's meta kernels describe what our replacement CPU kernels return
    with forced("cpu_kernel" if family_backends("cpu_kernel") else "reference", replace_fbgemm=True):
        torch.library.opcheck(getattr(FB, op).default, args,
                              test_utils=("test_schema", "test_faketensor"))


# --------------------------------------------------------------------------- J >= 2 jagged dims


@dataclasses.dataclass
class MultiJag:
    """A jagged tensor with ``len(offsets)`` jagged dimensions and the dense dims under test."""

    offsets: List[torch.Tensor]
    dims: List[int]
    dtype: torch.dtype
    width: int
    g: torch.Generator

    @property
    def b(self) -> int:
        return self.offsets[0].numel() - 1

    @property
    def t(self) -> int:
        return int(self.offsets[-1][-1])

    def rand(self, *shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=self.g, dtype=torch.float64).to(self.dtype)

    def dense(self, extra: int = 0) -> torch.Tensor:
        return self.rand(self.b, *[n + extra for n in self.dims], self.width)


def make_multi_jag(b: int, num_dims: int, max_len: int, pads: Tuple[str, ...],
                   dtype: torch.dtype, index_dtype: torch.dtype, width: int, seed: int) -> MultiJag:
    """Ragged lengths (with 0, 1 and max_len) on every level; dim ``d`` padded per ``pads[d]``."""
    g = torch.Generator().manual_seed(seed)
    offsets, entries = [], b
    for _ in range(num_dims):
        lengths = make_lengths(entries, max_len, g)
        off = torch.zeros(entries + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=off[1:])
        offsets.append(off.to(index_dtype))
        entries = int(off[-1])
    dims = [{"short": max(max_len - 1, 0), "exact": max_len, "long": max_len + 1}[p]
            for p in pads[:num_dims]]
    return MultiJag(offsets, dims, dtype, width, g)


def loop_to_dense(values: torch.Tensor, offsets: Sequence[torch.Tensor], dims: Sequence[int],
                  pad: float) -> torch.Tensor:
    """Independent float64 oracle: walk the offsets for every dense coordinate (Python loops)."""
    b = offsets[0].numel() - 1
    out = torch.full((b, *dims, values.shape[1]), pad, dtype=torch.float64)
    offs = [o.tolist() for o in offsets]
    for coord in itertools.product(range(b), *[range(n) for n in dims]):
        p, ok = coord[0], True
        for d, j in enumerate(coord[1:]):
            if j >= offs[d][p + 1] - offs[d][p]:
                ok = False
                break
            p = offs[d][p] + j
        if ok:
            out[coord] = values[p].double()
    return out


MULTI_CASES: Dict[str, Tuple[Callable[[MultiJag], tuple], Tuple[int, ...]]] = {
    "jagged_to_padded_dense": (lambda m: (m.rand(m.t, m.width), m.offsets, m.dims, -2.0), (0,)),
    "dense_to_jagged": (lambda m: (m.dense(), m.offsets, m.t), (0,)),
    "jagged_dense_elementwise_add": (lambda m: (m.rand(m.t, m.width), m.offsets, m.dense()), (0, 2)),
    "jagged_dense_elementwise_add_jagged_output":
        (lambda m: (m.rand(m.t, m.width), m.offsets, m.dense()), (0, 2)),
    "jagged_dense_elementwise_mul": (lambda m: (m.rand(m.t, m.width), m.offsets, m.dense()), (0, 2)),
    "jagged_dense_dense_elementwise_add_jagged_output":
        (lambda m: (m.rand(m.t, m.width), m.offsets, m.dense(), m.dense()), (0, 2, 3)),
}

_MULTI_ORACLE = {  # fbgemm registers no autograd for the dense-output add
    "jagged_dense_elementwise_add":
        lambda x, off, y: FB.jagged_to_padded_dense(x, off, list(y.shape[1:-1])) + y,
}


def multi_strategy(dtypes=(torch.float32, torch.float16)):
    return st.builds(
        make_multi_jag, b=st.integers(0, 4), num_dims=st.integers(2, 4),
        max_len=st.sampled_from([1, 2, 3]),
        pads=st.tuples(*[st.sampled_from(["short", "exact", "long"])] * 4),
        dtype=st.sampled_from(dtypes), index_dtype=st.sampled_from([torch.int64, torch.int32]),
        width=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))


def check_multi_parity(op: str, backend: str, m: MultiJag) -> None:
    """``op`` with J >= 2 jagged dims on ``backend``: outputs and gradients against fbgemm's CPU
    kernels (which take any number), through our op and through fbgemm's replaced kernels."""
    build, grad_at = MULTI_CASES[op]
    args = build(m)
    oracle = _MULTI_ORACLE.get(op, getattr(FB, op))
    want, want_g = fwd_bwd(oracle, args, grad_at, 0)
    tol = tolerance(m.dtype, op in ("jagged_to_padded_dense", "dense_to_jagged"))
    for how, fn, replace in (("torchrec_ascend", getattr(OURS, op), False),
                             ("fbgemm-replaced", oracle, True)):
        with forced(backend, replace_fbgemm=replace):
            got, got_g = fwd_bwd(fn, args, grad_at, 0, like=want)
        assert len(got) == len(want)
        for i, (a, b) in enumerate(zip(got, want)):
            assert_same(a, b, f"{op}[{backend}, {how}, J={len(m.offsets)}] out{i}", tol)
        for i, a, b in zip(grad_at, got_g, want_g):
            assert_same(a, b, f"{op}[{backend}, {how}, J={len(m.offsets)}] grad arg{i}",
                        tolerance(m.dtype, False))
    with forced(backend):  # the validating public entry point, forward
        pub = flat(getattr(jagged, op)(*args))
    for i, (a, b) in enumerate(zip(pub, want)):
        assert_same(a, b, f"{op}[{backend}, public, J={len(m.offsets)}] out{i}", tol)


@pytest.mark.parametrize("op", list(MULTI_CASES))
@pytest.mark.parametrize("backend", BACKENDS)
@EXAMPLES
@given(m=multi_strategy())
def test_multi_jagged_dims_match_fbgemm(op, backend, m):
    check_multi_parity(op, backend, m)


@pytest.mark.parametrize("backend", BACKENDS)
def test_multi_jagged_dims_match_a_python_loop(backend):
    """Against an oracle that does not share fbgemm's code: every coordinate walked by hand,
    including outer slots past a segment (whole padded sub-blocks) and an empty innermost level."""
    for seed, num_dims in ((0, 2), (1, 3), (2, 4), (3, 2)):
        m = make_multi_jag(3, num_dims, 2, ("long", "short", "exact", "long"), torch.float64,
                           torch.int64, 2, seed)
        values = m.rand(m.t, m.width)
        want = loop_to_dense(values, m.offsets, m.dims, -1.0)
        with forced(backend):
            got = OURS.jagged_to_padded_dense_forward(values, m.offsets, m.dims, -1.0)
            back = OURS.dense_to_jagged_forward(want, m.offsets, m.t)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        # dense -> jagged: every row the dense form holds comes back, truncated rows are zero
        held = loop_to_dense(torch.arange(m.t, dtype=torch.float64)[:, None].expand(m.t, 2),
                             m.offsets, m.dims, -1.0)[..., 0].reshape(-1)
        rows = held[held >= 0].long()
        torch.testing.assert_close(back[rows], values[rows], rtol=0, atol=0)
        mask = torch.ones(m.t, dtype=torch.bool)
        mask[rows] = False
        assert bool((back[mask] == 0).all())


@pytest.mark.parametrize("op", list(MULTI_CASES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_multi_jagged_dims_gradcheck_float64(op, backend):
    m = make_multi_jag(2, 3, 2, ("long", "short", "exact"), torch.float64, torch.int64, 2, 5)
    build, grad_at = MULTI_CASES[op]
    args = build(m)

    def fn(*diff):
        full = list(args)
        for i, d in zip(grad_at, diff):
            full[i] = d
        return tuple(o for o in flat(getattr(OURS, op)(*full)) if o.is_floating_point())

    inputs = tuple(args[i].detach().clone().requires_grad_() for i in grad_at)
    with forced(backend):
        assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7)


def _multi_opcheck_cases() -> List[Tuple[str, tuple]]:
    m = make_multi_jag(3, 3, 2, ("long", "short", "exact"), torch.float32, torch.int64, 2, 6)
    x, dense = m.rand(m.t, 2), m.dense()
    out = [(op, build(m)) for op, (build, _) in MULTI_CASES.items()]
    out += [
        ("jagged_to_padded_dense_forward", (x, m.offsets, m.dims, 0.5)),
        ("jagged_to_padded_dense_backward", (dense, m.offsets, m.t)),
        ("dense_to_jagged_forward", (dense, m.offsets, m.t)),
        ("jagged_dense_elementwise_mul_forward", (x, m.offsets, dense)),
        ("jagged_dense_elementwise_mul_backward", (x, m.offsets, dense, m.rand(m.t, 2))),
        ("jagged_dense_dense_elementwise_add_jagged_output_forward",
         (x, m.offsets, dense, m.dense(1))),
    ]
    return out


@pytest.mark.parametrize("op,args", _multi_opcheck_cases(),
                         ids=lambda x: x if isinstance(x, str) else "")
def test_multi_jagged_dims_opcheck(op, args):
    """Fake kernels, autograd registration and dynamic-shape tracing with J = 3 (the meta /
    dynamic-shape variants fbgemm has)."""
    grad_at = MULTI_CASES[op][1] if op in MULTI_CASES else ()
    args = tuple(a.requires_grad_() if i in grad_at else a for i, a in enumerate(args))
    torch.library.opcheck(getattr(OURS, op).default, args,
                          test_utils=("test_schema", "test_autograd_registration",
                                      "test_faketensor", "test_aot_dispatch_dynamic"))


# --------------------------------------------------------------------------- bad input


def _bad_cases():
    x, off = torch.rand(5, 2), torch.tensor([0, 2, 5])
    y = torch.rand(2, 3, 2)
    lengths = torch.tensor([2, 3])
    meta = torch.rand(5, 2, device="meta")
    return [
        (jagged.jagged_to_padded_dense, (x, torch.tensor([1, 2, 5]), 3), "offsets: must start at 0"),
        (jagged.jagged_to_padded_dense, (x, torch.tensor([0, 3, 2]), 3),
         r"offsets: must be non-decreasing, but offsets\[2\]=2 < offsets\[1\]=3"),
        (jagged.jagged_to_padded_dense, (x, torch.tensor([0, 2, 9]), 3),
         "offsets: last offset 9 exceeds the 5 values"),
        (jagged.jagged_to_padded_dense, (x, off.float(), 3), "offsets: dtype float32 not in"),
        (jagged.jagged_to_padded_dense, (meta, off, 3), "offsets: on device cpu, but values is on meta"),
        (jagged.jagged_to_padded_dense, (x, off, -1), r"max_lengths\[0\]: must be >= 0"),
        (jagged.jagged_to_padded_dense, (x, [off, torch.arange(6)], 3),
         "max_lengths: expected 2 entries"),
        (jagged.jagged_to_padded_dense, (x, [off, torch.tensor([0, 1, 2])], [2, 2]),
         r"offsets\[1\]: needs offsets\[0\]\[-1\] \+ 1 = 6 entries"),
        (jagged.jagged_to_padded_dense, (x, [off, torch.tensor([0, 1, 2], dtype=torch.int32)],
                                         [2, 2]), r"offsets\[1\]: dtype int32 differs"),
        (jagged.dense_to_jagged, (y, off, -1), "total_L: must be >= 0"),
        (jagged.dense_to_jagged, (y, torch.tensor([0, 2, 1])), "offsets: must be non-decreasing"),
        (jagged.dense_to_jagged, (y, torch.tensor([0, 5])), "offsets: has 1 sequences but dense has"),
        (jagged.jagged_1d_to_dense, (x, off, 3), "values: expected a 1-D tensor"),
        (jagged.jagged_2d_to_dense, (x, torch.tensor([0, 6, 5]), 3), "offsets: must be non-decreasing"),
        (jagged.stacked_jagged_2d_to_dense, (x, torch.tensor([[2, -1], [3, 1]]), [0, 1, 5], [2, 3]),
         "lengths: must be non-negative"),
        (jagged.stacked_jagged_2d_to_dense, (x, torch.tensor([[1, 1], [1, 1]]), [0, 2, 5], [2, 3]),
         "lengths: per-key sums"),
        (jagged.stacked_jagged_2d_to_dense, (x, torch.tensor([[1, 1], [1, 2]]), [1, 2, 5], [2, 3]),
         "offset_per_key: must start at 0"),
        (jagged.jagged_dense_elementwise_add, (x, off, y.double()), "y: dtype float64 differs"),
        (jagged.jagged_dense_elementwise_add, (x, off, torch.rand(3, 3, 2)), "y: expected shape"),
        (jagged.jagged_dense_elementwise_add_jagged_output, (x, torch.tensor([0, 2, 4]), y),
         r"x_offsets: last offset 4 must equal the number of rows of x_values \(5\)"),
        (jagged.jagged_dense_elementwise_mul, (x.int(), off, y), "y: dtype float32 differs"),
        (jagged.jagged_dense_dense_elementwise_add_jagged_output, (x, off, y, y[:1]), "y_1: expected"),
        (jagged.jagged_softmax, (x, torch.tensor([1, 2, 5]), 3), "x_offsets: must start at 0"),
        (jagged.jagged_softmax, (x, off, -2), "max_L: must be >= 0"),
        (jagged.jagged_softmax, (x[:, 0], off, 3), "values: expected a 2-D tensor"),
        (jagged.jagged_jagged_bmm, (x, torch.rand(4, 3), off, 3), "y_values: has 4 rows"),
        (jagged.jagged_jagged_bmm, (x, torch.rand(5, 3).half(), off, 3), "y_values: dtype float16"),
        (jagged.jagged_jagged_bmm, (x, meta, off, 3), "y_values: on device meta"),
        (jagged.jagged_dense_bmm, (x, off, torch.rand(2, 3, 4), 3), "y: expected shape"),
        (jagged.jagged_dense_bmm, (x, torch.tensor([0, 3, 2]), torch.rand(2, 2, 4), 3),
         "x_offsets: must be non-decreasing"),
        (jagged.batched_dense_vec_jagged_2d_mul, (torch.rand(3, 3), x, off), "v: rows"),
        (jagged.batched_dense_vec_jagged_2d_mul, (torch.rand(6, 3), torch.rand(5, 4), off),
         "a_values: width 4 must be a multiple of the H=3"),
        (jagged.jagged_index_select, (x, torch.tensor([-1, 6]), torch.tensor([0])),
         r"lengths: must be non-negative, lengths\[0\]=-1"),
        (jagged.jagged_index_select, (x, torch.tensor([2, 2]), torch.tensor([0])),
         "lengths: sums to 4, but there are 5 values"),
        (jagged.jagged_index_select, (x, lengths, torch.tensor([0, 2])), r"indices: must lie in \[0, 2\)"),
        (jagged.jagged_index_select, (x, lengths, torch.tensor([1]), 2),
         "num_dense_output_rows: is 2, but the selected sequences have 3 rows"),
        (jagged.jagged_slice, (x[:, 0], lengths, torch.tensor([0, 4]), 2),
         r"start: must satisfy 0 <= start\[b\] <= x_lengths\[b\], but start\[1\]=4"),
        (jagged.jagged_slice, (x[:, 0], torch.tensor([6, -1]), torch.tensor([0, 0]), 2),
         "x_lengths: must be non-negative"),
        (jagged.jagged_slice, (x[:, 0], lengths, torch.tensor([0, 0]), -1), "slice_length: must be >= 0"),
    ]


@pytest.mark.parametrize("fn,args,match", _bad_cases(),
                         ids=lambda x: getattr(x, "__name__", None) if callable(x) else "")
def test_bad_input_raises_value_error(fn, args, match):
    with pytest.raises(ValueError, match=match):
        fn(*args)


def test_validate_false_skips_value_reads():
    # offsets that end short of the values are only caught when validating (no device sync);
    # without validation the rows past the last offset are simply not part of any sequence
    x, y, off = torch.rand(5, 2), torch.rand(5, 3), torch.tensor([0, 2, 4])
    with pytest.raises(ValueError, match="x_offsets: last offset"):
        jagged.jagged_jagged_bmm(x, y, off, 3)
    with tops.use_backend("reference", ops=jagged.OP_NAMES):
        out = jagged.jagged_jagged_bmm(x, y, off, 3, validate=False)
    torch.testing.assert_close(out, torch.stack([x[:2].T @ y[:2], x[2:4].T @ y[2:4]]))


# --------------------------------------------------------------------------- streaming stores


@pytest.mark.parametrize("llc", [0, 1 << 40], ids=["streamed", "cached"])
@pytest.mark.parametrize("cap", [2, 1, 0], ids=["avx512", "avx2", "scalar"])
def test_large_outputs_by_streaming_stores_match_reference(cap, llc, isa_cap, llc_bytes):
    """Outputs of >= 8 MiB that do not fit the LLC (csrc/isa.h stream_output) are written with
    non-temporal stores, others with regular ones: the J=2 zero-padded
    jagged_to_padded_dense_forward (8.4 MB; rows of 0, 1 and max items, runs of empty rows, an
    odd D so rows start off the 32/64-byte grid) and jagged_index_select (8.6 MB), on every ISA
    path with no LLC (streamed) and a 1 TiB one (cached), against the reference."""
    g = torch.Generator().manual_seed(31)
    isa_cap(cap)
    llc_bytes(llc)
    B, N0, N1, D = 64, 16, 32, 65
    l0 = torch.randint(0, N0 + 1, (B,), generator=g)
    l0[:3] = torch.tensor([0, 1, N0])
    l1 = torch.randint(0, N1 + 1, (int(l0.sum()),), generator=g)
    l1[:3] = torch.tensor([0, 1, N1])
    l1[5:40] = 0  # a run of empty dense rows: one padding fill across them
    offs = [torch.cat([torch.zeros(1, dtype=torch.int64), l.cumsum(0)]) for l in (l0, l1)]
    x = torch.randn(int(l1.sum()), D, generator=g)
    with tops.use_backend("cpu_kernel", ops=["jagged_to_padded_dense_forward"]):
        got = torch.ops.torchrec_ascend.jagged_to_padded_dense_forward(x, offs, [N0, N1], 0.0)
    assert got.numel() * 4 >= 8 << 20
    with tops.use_backend("reference", ops=["jagged_to_padded_dense_forward"]):
        want = torch.ops.torchrec_ascend.jagged_to_padded_dense_forward(x, offs, [N0, N1], 0.0)
    torch.testing.assert_close(got, want, rtol=0, atol=0)

    lengths = torch.randint(0, 200, (64,), generator=g)
    lengths[:3] = torch.tensor([0, 1, 199])
    v = torch.randn(int(lengths.sum()), 257, generator=g)
    idx = torch.cat([torch.arange(64), torch.randint(0, 64, (40,), generator=g)])
    with tops.use_backend("cpu_kernel", ops=["jagged_index_select"]):
        got_v, got_l = torch.ops.torchrec_ascend.jagged_index_select(v, lengths, idx)
    assert got_v.numel() * 4 >= 8 << 20
    with tops.use_backend("reference", ops=["jagged_index_select"]):
        want_v, want_l = torch.ops.torchrec_ascend.jagged_index_select(v, lengths, idx)
    torch.testing.assert_close(got_v, want_v, rtol=0, atol=0)
    torch.testing.assert_close(got_l, want_l)
