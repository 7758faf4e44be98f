"""Triton fused jagged HSTU attention vs the padded torch reference, on a lent GPU.

Needs only torch + triton (imports ``torchrec_ascend.ops``, which is torch-only, and
``benchmarks/common.py``).  Two stages:

1. **Correctness** (always first; exits 1 on a mismatch): the Triton forward and backward
   (dq, dk, dv, d pos_w, d ts_w) against the padded reference evaluated in float64 on the same
   device, ragged lengths with 0, 1 and the max, targets, contextual prefix, both normalisations,
   fp32 and bf16.
2. **Timings**: B=64, max_len in {256, 1024}, H=4, d=64, heavy-tailed (KuaiRand-like) lengths,
   position + time-bucket bias, fp32 and bf16; forward and forward+backward of the Triton kernels
   vs padded torch (``"baseline": "padded"``: the reference forward in the run's dtype, its
   backward by torch autograd), all four timed side by side by ``torch.utils.benchmark``
   (interleaved per round, ``benchmarks/side_by_side.py``; the Timer synchronises CUDA), peak
   memory of each, the Triton path's useful TFLOP/s (causal pairs only) and its share of the
   ``torch.mm`` rate of the row's dtype measured in the same run (``gemm_efficiency``).  Prints a table and writes
   ``benchmarks/results/hstu_attention_gpu.json``.

Usage::

    python benchmarks/gpu/hstu_attention.py                     # on a CUDA machine
    TRITON_INTERPRET=1 python benchmarks/gpu/hstu_attention.py --interpret-smoke
        # correctness stage only, tiny shapes, CPU tensors through the Triton interpreter
    python benchmarks/gpu/hstu_attention.py --compile-only 90 --dtypes bf16
        # no GPU: ahead-of-time compile of the kernels for sm_90 (triton's bundled ptxas)
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from benchmarks import side_by_side  # noqa: E402
from benchmarks.common import heavy_tailed_lengths, print_table, write_json  # noqa: E402
from torchrec_ascend import device as _device  # noqa: E402
from torchrec_ascend.ops.reference import hstu as ref  # noqa: E402

NAME = "hstu_attention_gpu"
NUM_BUCKETS = 128
ALPHA_OF = lambda d: d ** -0.5  # noqa: E731
GRAD_NAMES = ("dq", "dk", "dv", "d_pos_w", "d_ts_w")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# (rtol, atol) against the float64 reference, per input dtype
TOLERANCE = {torch.float32: (2e-4, 2e-5), torch.bfloat16: (5e-2, 2e-2), torch.float16: (2e-2, 5e-3)}


def _kernels():
    """The Triton implementation (imported here: it needs triton)."""
    from torchrec_ascend.ops.triton import hstu as th

    return th


def make_inputs(lengths: torch.Tensor, max_seq_len: int, H: int, d: int, dtype: torch.dtype,
                device: torch.device, *, num_targets: Optional[torch.Tensor] = None,
                contextual: int = 0, norm_by_len: bool = False, seed: int = 0) -> list:
    """The op's positional arguments: fresh random q, k, v, tables and heavy-tailed timestamps."""
    g = torch.Generator().manual_seed(seed)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    T = int(offsets[-1])
    mk = lambda *s: (torch.randn(*s, generator=g) * 0.5).to(dtype).to(device)  # noqa: E731
    ts = torch.exp(torch.rand(T, generator=g) * 14).long().cumsum(0)
    return [mk(T, H, d), mk(T, H, d), mk(T, H, d), offsets.to(device), ALPHA_OF(d), max_seq_len,
            norm_by_len, num_targets.to(device) if num_targets is not None else None, contextual,
            mk(2 * max_seq_len - 1), mk(NUM_BUCKETS + 1), ts.to(device)]


def _f64(args: list) -> list:
    return [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]


def check_case(args: list, label: str) -> List[str]:
    """Compare Triton fwd + bwd with the float64 padded reference; return failure messages.
    Output buffers are poisoned with NaN first, so unwritten rows show up."""
    th = _kernels()
    q, k, v = args[:3]
    rtol, atol = TOLERANCE[q.dtype]
    out = th.hstu_mha_fwd(*args, out=torch.full_like(v, float("nan")))
    grad = torch.randn_like(out)
    grads = th.hstu_mha_bwd(grad, *args, outs=tuple(torch.full_like(t, float("nan")) for t in (q, k, v)))
    a64 = _f64(args)
    want = ref.hstu_mha(*a64)
    want_grads = ref.hstu_mha_backward(grad.double(), *a64)
    fails = []
    for name, got, exp in zip(("out",) + GRAD_NAMES, (out,) + tuple(grads), (want,) + tuple(want_grads)):
        if got.shape != exp.shape:
            fails.append(f"{label} {name}: shape {tuple(got.shape)} != {tuple(exp.shape)}")
            continue
        if not bool(torch.isfinite(got).all()):
            fails.append(f"{label} {name}: non-finite values")
            continue
        # scale-aware check: table grads sum many terms, compare relative to their magnitude
        scale = float(exp.abs().max()) if exp.numel() else 0.0
        err = float((got.double() - exp).abs().max()) if exp.numel() else 0.0
        if err > atol + rtol * max(scale, 1.0) * (10 if name.startswith("d_") else 1):
            fails.append(f"{label} {name}: max abs err {err:.3g} (max |ref| {scale:.3g})")
    return fails


def correctness(device: torch.device, smoke: bool) -> bool:
    """Stage 1. Prints PASS / FAIL lines; True when everything matched."""
    if smoke:
        # fp32 only: triton 3.9's interpreter computes tl.dot on bf16 operands wrongly (~1e10 off
        # on a bare 16x16 dot), so bf16 is checked on the device only
        H, d, dtypes = 2, 16, (torch.float32,)
        shapes = [([0, 1, 20], 24)]
    else:
        H, d, dtypes = 4, 64, (torch.float32, torch.bfloat16)
        shapes = [([0, 1, 300, 77, 129, 64, 65, 5], 300), ([1000, 1, 0, 513], 1024)]
    fails: List[str] = []
    n_checks = 0
    for dtype in dtypes:
        for si, (lens, msl) in enumerate(shapes):
            lengths = torch.tensor(lens, dtype=torch.int64)
            nt = torch.minimum(torch.tensor([3, 0, 5, 1] * 2)[: len(lens)], lengths)
            for ci, (targets, ctx, by_len) in enumerate([(False, 0, False), (True, 3, True)]):
                args = make_inputs(lengths, msl, H, d, dtype, device,
                                   num_targets=nt if targets else None, contextual=ctx,
                                   norm_by_len=by_len, seed=10 * si + ci)
                label = f"[{str(dtype).split('.')[-1]} lens={lens} targets={targets} ctx={ctx} by_len={by_len}]"
                f = check_case(args, label)
                n_checks += 1
                print(("FAIL " if f else "ok   ") + label)
                fails += f
    for f in fails:
        print("  " + f)
    print(f"correctness: {'PASS' if not fails else 'FAIL'} ({n_checks} configurations, fwd + bwd)")
    return not fails


def compile_only(arch: int, dtype_name: str, kernels: Sequence[str]) -> bool:
    """Compile the kernels ahead of time for CUDA ``sm_<arch>`` with triton's bundled ptxas: no
    GPU needed (catches what the interpreter cannot: types, layouts, shared memory)."""
    import time

    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    th = _kernels()
    dt = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}[dtype_name]
    ptr_types = {"OFF": "i64", "NT": "i64", "THR": "i64", "TS": "i64", "DPOS": "fp32", "DTS": "fp32"}
    flags = dict(NORM_BY_LEN=False, HAS_NT=True, HAS_CTX=True, HAS_POS=True, HAS_TS=True,
                 BLOCK_M=64, BLOCK_N=64, BLOCK_DQ=64, BLOCK_DV=64, ACC=tl.float32, PRECISION="ieee")
    ptrs = {"Q", "K", "V", "DO", "OUT", "DK", "DVAL", "DQP", "DPOS", "DTS", "PW", "TW", "THR", "TS",
            "OFF", "NT"}
    ok = True
    # a kernel with a BWD flag (_q_tile_kernel: forward and dq backward) is compiled both ways
    variants = [(name, bwd) for name in kernels
                for bwd in ((False, True) if "BWD" in getattr(th, name).arg_names else (None,))]
    for name, bwd in variants:
        fn = getattr(th, name)
        sig, cons = {}, {}
        label = name if bwd is None else f"{name}[BWD={bwd}]"
        for arg in fn.arg_names:
            if arg == "BWD":
                sig[arg], cons[arg] = "constexpr", bwd
            elif arg in flags:
                sig[arg], cons[arg] = "constexpr", flags[arg]
            elif arg in ptrs:
                sig[arg] = "*" + ptr_types.get(arg, dt)
            elif arg in ("alpha_hi", "alpha_lo"):
                sig[arg] = "fp32"
            else:
                sig[arg] = "i32"
        t0 = time.time()
        try:
            k = triton.compile(ASTSource(fn, sig, cons), target=GPUTarget("cuda", arch, 32),
                               options={"num_warps": 4, "num_stages": 2 if dt == "fp32" else 3})
            print(f"compiled {label} {dtype_name} sm_{arch}: shared {k.metadata.shared} B, "
                  f"{time.time() - t0:.0f} s", flush=True)
        except Exception as e:  # report every kernel, then fail
            ok = False
            print(f"FAILED to compile {label} {dtype_name} sm_{arch}: {e!r}", flush=True)
    return ok


def _useful_flops(lengths: torch.Tensor, H: int, d: int) -> float:
    """Forward FLOPs of the valid (causal) pairs: 2 * d for q.k and 2 * d for p.v per pair."""
    pairs = float((lengths * (lengths + 1) // 2).sum())
    return pairs * H * 4.0 * d


def _peak_mb(fn: Callable[[], object], device: torch.device) -> float:
    """Peak memory above the live baseline while running ``fn`` once (MB)."""
    _device.synchronize(device)
    base = torch.accelerator.memory_allocated()
    torch.accelerator.reset_peak_memory_stats()
    fn()
    _device.synchronize(device)
    return (torch.accelerator.max_memory_allocated() - base) / 2 ** 20


def timings(device: torch.device, max_lens: Sequence[int], dtypes: Sequence[torch.dtype],
            B: int, H: int, d: int, repeat: int) -> List[Dict[str, object]]:
    """Stage 2: one row per (max_len, dtype); ``repeat`` interleaved rounds."""
    th = _kernels()
    peaks = _device.measure_gemm_gflops(device, tuple(dtypes), n=4096, min_run_time=0.2, rounds=2)
    rows = []
    for max_len in max_lens:
        lengths = heavy_tailed_lengths(B, max_len, generator=torch.Generator().manual_seed(max_len))
        for dtype in dtypes:
            args = make_inputs(lengths, max_len, H, d, dtype, device, seed=max_len)
            q, k, v = args[:3]
            grad = torch.randn_like(v)

            def fused_fwd():
                return th.hstu_mha_fwd(*args)

            def fused_fwdbwd():
                th.hstu_mha_fwd(*args)
                return th.hstu_mha_bwd(grad, *args)

            leaves = [t.detach().requires_grad_(True) for t in (q, k, v, args[9], args[10])]

            def padded_fwd():
                with torch.no_grad():
                    return ref.hstu_mha(*args)

            def padded_fwdbwd():
                out = ref.hstu_mha(*leaves[:3], *args[3:9], leaves[3], leaves[4], args[11])
                return torch.autograd.grad(out, leaves, grad)

            timed = side_by_side.interleaved(
                {"fused_fwd": fused_fwd, "padded_fwd": padded_fwd, "fused_fwdbwd": fused_fwdbwd,
                 "padded_fwdbwd": padded_fwdbwd}, rounds=repeat, min_run_time=0.2, warmup=2)
            t = {name: v["ms"] for name, v in timed.items()}
            mem_fused = _peak_mb(fused_fwdbwd, device)
            mem_padded = _peak_mb(padded_fwdbwd, device)
            flops = _useful_flops(lengths, H, d)
            rows.append({
                "max_len": max_len, "dtype": str(dtype).split(".")[-1], "baseline": "padded",
                "B": B, "H": H, "d": d,
                "mean_len": round(float(lengths.float().mean()), 1),
                "fused_fwd_ms": t["fused_fwd"], "padded_fwd_ms": t["padded_fwd"],
                "fwd_speedup": side_by_side.ratio(timed, "padded_fwd", "fused_fwd"),
                "fused_fwdbwd_ms": t["fused_fwdbwd"], "padded_fwdbwd_ms": t["padded_fwdbwd"],
                "fwdbwd_speedup": side_by_side.ratio(timed, "padded_fwdbwd", "fused_fwdbwd"),
                "fused_peak_mb": mem_fused, "padded_peak_mb": mem_padded,
                "peak_mem_ratio": mem_padded / max(mem_fused, 1e-9),
                "fused_fwd_tflops": flops / (t["fused_fwd"] * 1e-3) / 1e12,
                # model FLOPs of fwd + bwd = 3x the forward's (2 GEMMs fwd, 4 bwd); the kernels
                # execute 9 (the backward recomputes q k^T and do v^T in both of its kernels)
                "fused_fwdbwd_tflops": 3.0 * flops / (t["fused_fwdbwd"] * 1e-3) / 1e12,
                "gemm_tflops": peaks[dtype] / 1e3,
                "fwd_gemm_efficiency": flops / (t["fused_fwd"] * 1e-3) / (peaks[dtype] * 1e9),
                "fwdbwd_gemm_efficiency": 3.0 * flops / (t["fused_fwdbwd"] * 1e-3) / (peaks[dtype] * 1e9),
            })
            print(f"max_len={max_len} {rows[-1]['dtype']}: fwd x{rows[-1]['fwd_speedup']:.2f} "
                  f"fwd+bwd x{rows[-1]['fwdbwd_speedup']:.2f} mem x{rows[-1]['peak_mem_ratio']:.2f}",
                  flush=True)
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interpret-smoke", action="store_true",
                    help="correctness stage only, tiny shapes, CPU tensors (needs TRITON_INTERPRET=1)")
    ap.add_argument("--max-lens", default="256,1024")
    ap.add_argument("--dtypes", default="fp32,bf16", help=f"comma list of {sorted(DTYPES)}")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved timing rounds")
    ap.add_argument("--skip-check", action="store_true", help="timings without the correctness stage")
    ap.add_argument("--compile-only", type=int, metavar="SM",
                    help="no GPU needed: compile the kernels for CUDA sm_SM (e.g. 90) with the "
                         "first of --dtypes, and exit")
    ap.add_argument("--kernels", default="_q_tile_kernel,_bwd_dkdv_kernel",
                    help="with --compile-only: which kernels")
    args = ap.parse_args(argv)

    if args.compile_only:
        dtype_name = args.dtypes.split(",")[0].strip()
        return 0 if compile_only(args.compile_only, dtype_name, args.kernels.split(",")) else 1

    if args.interpret_smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("--interpret-smoke needs TRITON_INTERPRET=1 in the environment", file=sys.stderr)
            return 2
        return 0 if correctness(torch.device("cpu"), smoke=True) else 1
    if not _device.is_available("cuda"):
        print("no CUDA device: run on a GPU machine, or use --interpret-smoke", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    torch.manual_seed(0)
    if not args.skip_check and not correctness(dev, smoke=False):
        return 1
    dtypes = [DTYPES[s.strip()] for s in args.dtypes.split(",") if s.strip()]
    max_lens = [int(s) for s in args.max_lens.split(",") if s.strip()]
    rows = timings(dev, max_lens, dtypes, args.batch, args.heads, args.dim, args.repeat)
    print()
    print_table(rows, ["max_len", "dtype", "mean_len", "fused_fwd_ms", "padded_fwd_ms", "fwd_speedup",
                       "fused_fwdbwd_ms", "padded_fwdbwd_ms", "fwdbwd_speedup", "fused_peak_mb",
                       "padded_peak_mb", "peak_mem_ratio", "fused_fwd_tflops", "gemm_tflops",
                       "fwd_gemm_efficiency", "fwdbwd_gemm_efficiency"])
    path = write_json(NAME, {"config": vars(args), "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
