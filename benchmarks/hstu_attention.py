"""Fused jagged HSTU attention (csrc CPU kernel) vs a padded PyTorch implementation, on CPU.

Usage: ``python benchmarks/hstu_attention.py [--quick]`` (``--quick``: max_len 256, fp32 and
bf16, one round, under a minute).  Writes ``benchmarks/results/hstu_attention.json`` and prints a
table.

The baseline (``"baseline": "padded"``) is what a user would otherwise run: the padded PyTorch
HSTU attention of ``ops/reference/hstu.py`` -- sequences padded to ``[B, N, H, d]``, the score
tensor ``[B, H, N, N]`` by einsum, the relative bias and the dense ``[B, N, N]`` mask in the run's
dtype, SiLU, a second einsum (the shape of generative-recommenders' PyTorch HSTU attention) --
called directly with torch autograd (one forward, one backward; not the registry's backward op,
which re-runs the forward).  Both sides run on the same inputs in the same dtype, warmed up and
timed by the same ``torch.utils.benchmark`` procedure, interleaved round by round
(``benchmarks/side_by_side.py``).

Per max_len (256, 1024, 4096) and dtype (fp32, bf16): heavy-tailed lengths (mean about max_len /
4; the batch shrinks with max_len so the padded side fits in memory), H=4, d=64, relative bias
(position + time buckets) on:

* ``fwd_speedup`` / ``fwdbwd_speedup``: padded time / fused time (forward; forward+backward),
  the median of per-round ratios;
* ``peak_mem_ratio``: padded / fused peak memory of forward+backward, each measured in its own
  subprocess as the rise of the peak resident set size (``VmHWM``, reset through
  ``/proc/self/clear_refs``) over the resident size just before the call;
* ``fwd_gemm_efficiency`` / ``bwd_gemm_efficiency``: useful FLOP per second of the fused forward
  (causal pairs ``sum_b n_b (n_b + 1) / 2`` x H x (2 dqk + 2 dv)) and backward (twice the
  forward's: dS, dq, dk, dv products; backward time = fwd+bwd - fwd) over the rate of a
  1024^3 ``torch.mm`` in the row's dtype, which is timed as one more contender of the same
  interleaved rounds (so it sees the same machine load); the median of per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from typing import Callable, Dict, Tuple

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import side_by_side  # noqa: E402

import torchrec_ascend.ops as ops  # noqa: E402
from torchrec_ascend import device  # noqa: E402
from torchrec_ascend.ops import extension  # noqa: E402
from torchrec_ascend.ops.hstu import cpu_bf16_gemm, hstu_mha  # noqa: E402
from torchrec_ascend.ops.reference import hstu as padded  # noqa: E402

H, D = 4, 64
BATCH = {256: 64, 1024: 16, 4096: 2}  # padded [B, H, N, N] scores: 64 MiB .. 512 MiB in fp32
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
OPS = ["hstu_mha", "hstu_mha_backward"]
TABLES = ("pos_w", "ts_w")


def make_inputs(max_len: int, dtype: torch.dtype, seed: int = 0) -> Tuple[Dict[str, torch.Tensor], torch.Tensor]:
    """Same inputs for every path (seeded): jagged q, k, v [T, H, D], offsets, bias tables."""
    g = torch.Generator().manual_seed(seed)
    lengths = common.heavy_tailed_lengths(BATCH[max_len], max_len, generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    T = int(offsets[-1])
    args = dict(
        q=torch.randn(T, H, D, generator=g).to(dtype), k=torch.randn(T, H, D, generator=g).to(dtype),
        v=torch.randn(T, H, D, generator=g).to(dtype), offsets=offsets,
        pos_w=(torch.randn(2 * max_len - 1, generator=g) * 0.1).to(dtype),
        ts_w=(torch.randn(129, generator=g) * 0.1).to(dtype),
        timestamps=torch.randint(0, 100_000, (T,), generator=g).cumsum(0),
    )
    return args, lengths


def make_step(path: str, args: Dict[str, torch.Tensor], max_len: int, backward: bool) -> Callable[[], None]:
    """One forward (and backward) of the ``fused`` or ``padded`` path, as a closure."""
    leaves = {n: args[n].clone().requires_grad_(backward) for n in ("q", "k", "v") + TABLES}
    grad = torch.ones(args["q"].shape[0], H, D, dtype=args["q"].dtype)
    alpha = D ** -0.5

    def fused() -> torch.Tensor:
        with ops.use_backend("cpu_kernel", ops=OPS, device="cpu"):
            return hstu_mha(leaves["q"], leaves["k"], leaves["v"], args["offsets"], max_seq_len=max_len,
                            alpha=alpha, pos_w=leaves["pos_w"], ts_w=leaves["ts_w"],
                            timestamps=args["timestamps"])

    def dense() -> torch.Tensor:
        return padded.hstu_mha(leaves["q"], leaves["k"], leaves["v"], args["offsets"], alpha, max_len,
                               False, None, 0, leaves["pos_w"], leaves["ts_w"], args["timestamps"])

    fwd = fused if path == "fused" else dense

    def step() -> None:
        if not backward:
            with torch.no_grad():
                fwd()
            return
        fwd().backward(grad)
        for t in leaves.values():
            t.grad = None

    return step


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def mem_worker(path: str, max_len: int, dtype_name: str) -> None:
    """Subprocess body: print the peak RSS rise (bytes) of one forward+backward on ``path``."""
    args, _ = make_inputs(max_len, DTYPES[dtype_name])
    step = make_step(path, args, max_len, backward=True)
    step()  # warmed up like the timed runs (one-time allocations: oneDNN kernels, the bf16 choice)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current resident size
    before = _rss_bytes()
    step()
    print(json.dumps({"peak_rise_bytes": max(_hwm_bytes() - before, 0)}))


def peak_mem(path: str, max_len: int, dtype_name: str) -> int:
    """Peak RSS rise of one forward+backward, measured in a fresh subprocess."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--mem-worker", path,
                          str(max_len), dtype_name], check=True, capture_output=True, text=True)
    return int(json.loads(out.stdout.strip().splitlines()[-1])["peak_rise_bytes"])


GEMM_N = 1024


def bench(max_len: int, dtype_name: str, rounds: int) -> Dict[str, object]:
    dtype = DTYPES[dtype_name]
    args, lengths = make_inputs(max_len, dtype)
    n = lengths.to(torch.float64)
    fwd_flop = float((n * (n + 1) / 2).sum()) * H * (2 * D + 2 * D)
    steps = {f"{p}_{kind}": make_step(p, args, max_len, kind == "fwdbwd")
             for p in ("fused", "padded") for kind in ("fwd", "fwdbwd")}
    # the dtype's GEMM peak is one more contender of the same rounds: it sees the same load
    ga, gb = torch.randn(GEMM_N, GEMM_N).to(dtype), torch.randn(GEMM_N, GEMM_N).to(dtype)
    steps["gemm"] = lambda: torch.mm(ga, gb)
    t = side_by_side.interleaved(steps, rounds=rounds, min_run_time=0.2)
    ms = {k: v["ms"] for k, v in t.items()}
    mem_fused, mem_padded = peak_mem("fused", max_len, dtype_name), peak_mem("padded", max_len, dtype_name)
    gemm_flop = 2.0 * GEMM_N ** 3
    r = {k: v["rounds_ms"] for k, v in t.items()}
    # per round: useful FLOP/s of the fused fwd (bwd = fwd+bwd - fwd, twice the fwd's FLOP) over the
    # GEMM rate of that round; the row reports the median over rounds
    fwd_eff = [fwd_flop / f / (gemm_flop / g) for f, g in zip(r["fused_fwd"], r["gemm"])]
    bwd_eff = [2 * fwd_flop / max(fb - f, 1e-9) / (gemm_flop / g)
               for f, fb, g in zip(r["fused_fwd"], r["fused_fwdbwd"], r["gemm"])]
    gemm_gflops = gemm_flop / (ms["gemm"] * 1e-3) / 1e9
    return {
        "max_len": max_len, "dtype": dtype_name, "baseline": "padded", "B": BATCH[max_len], "H": H, "d": D,
        "T": int(lengths.sum()), "mean_len": round(float(n.mean()), 1),
        "fused_fwd_ms": ms["fused_fwd"], "padded_fwd_ms": ms["padded_fwd"],
        "fused_fwdbwd_ms": ms["fused_fwdbwd"], "padded_fwdbwd_ms": ms["padded_fwdbwd"],
        "fwd_speedup": side_by_side.ratio(t, "padded_fwd", "fused_fwd"),
        "fwdbwd_speedup": side_by_side.ratio(t, "padded_fwdbwd", "fused_fwdbwd"),
        "fused_peak_mb": mem_fused / 2 ** 20, "padded_peak_mb": mem_padded / 2 ** 20,
        "peak_mem_ratio": mem_padded / max(mem_fused, 1),
        "fused_fwd_gflops": fwd_flop / (ms["fused_fwd"] * 1e-3) / 1e9,
        "fused_bwd_gflops": 2 * fwd_flop / (max(ms["fused_fwdbwd"] - ms["fused_fwd"], 1e-9) * 1e-3) / 1e9,
        "gemm_gflops": gemm_gflops,
        "fwd_gemm_efficiency": statistics.median(fwd_eff), "bwd_gemm_efficiency": statistics.median(bwd_eff),
        "bf16_gemm_kernel": cpu_bf16_gemm() if dtype == torch.bfloat16 else None,
        "rounds_ms": r,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="max_len 256, one round (under a minute)")
    ap.add_argument("--max-len", type=int, nargs="*", choices=sorted(BATCH), help="lengths to run")
    ap.add_argument("--mem-worker", nargs=3, metavar=("PATH", "MAX_LEN", "DTYPE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.mem_worker:
        mem_worker(a.mem_worker[0], int(a.mem_worker[1]), a.mem_worker[2])
        return 0
    if extension.kernel("hstu_mha_fwd") is None:
        print("csrc extension not built (make build): nothing to compare", file=sys.stderr)
        return 1
    lens = a.max_len or ([256] if a.quick else sorted(BATCH))
    rounds = 1 if a.quick else 2
    rows = []
    for L in lens:
        for name in DTYPES:
            rows.append(bench(L, name, rounds))
            print(f"max_len {L} {name}: done", flush=True)
    common.print_table(rows, ["max_len", "dtype", "T", "fused_fwd_ms", "padded_fwd_ms", "fwd_speedup",
                              "fused_fwdbwd_ms", "padded_fwdbwd_ms", "fwdbwd_speedup", "fused_peak_mb",
                              "padded_peak_mb", "peak_mem_ratio", "gemm_gflops", "fwd_gemm_efficiency",
                              "bwd_gemm_efficiency"])
    path = common.write_json("hstu_attention", {
        "quick": a.quick, "rounds": rounds,
        "timing": "torch.utils.benchmark blocked_autorange, fused and padded interleaved per round",
        "gemm_capability": device.gemm_capability("cpu").as_dict(),
        "goals": {"fwd_gemm_efficiency": 0.6, "bwd_gemm_efficiency": 0.6, "peak_mem_ratio": 2.0},
        "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
