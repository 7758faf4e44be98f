"""Fused jagged HSTU attention (csrc CPU kernel) vs the padded torch reference, on CPU.

Usage: ``python benchmarks/hstu_attention.py [--quick]`` (``--quick``: max_len 256 only, fewer
repeats, under 60 s).  Writes ``benchmarks/results/hstu_attention.json`` and prints a table.

Per max_len: B=64 heavy-tailed lengths (mean about max_len / 4), H=4, d=64, fp32, relative bias
(position + time buckets) on, the same inputs for both paths:

* ``fwd_speedup`` / ``fwdbwd_speedup``: reference time / fused time (forward; forward+backward);
* ``peak_mem_ratio``: padded / fused peak memory of forward+backward, each measured in its own
  subprocess as the rise of the peak resident set size (``VmHWM``, reset through
  ``/proc/self/clear_refs``) over the resident size just before the call (so torch's allocations are seen, not only Python's);
* ``gemm_efficiency``: useful FLOP per second of the fused forward (causal: ``sum_b n_b (n_b + 1)
  / 2`` pairs x H x (2 dqk + 2 dv)) over the fp32 ``torch.mm`` 2048x2048 rate of the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from typing import Dict, Tuple

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import torchrec_ascend.ops as ops  # noqa: E402
from torchrec_ascend.ops import cpu  # noqa: E402
from torchrec_ascend.metrics import measure_peak_gemm_flops  # noqa: E402
from torchrec_ascend.ops.hstu import hstu_mha  # noqa: E402

B, H, D = 64, 4, 64
OPS = ["hstu_mha", "hstu_mha_backward"]


def make_inputs(max_len: int, seed: int = 0) -> Tuple[Dict[str, torch.Tensor], torch.Tensor]:
    """Same inputs for every path (seeded): jagged q, k, v [T, H, D], offsets, bias tables."""
    g = torch.Generator().manual_seed(seed)
    lengths = common.heavy_tailed_lengths(B, max_len, generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    T = int(offsets[-1])
    args = dict(
        q=torch.randn(T, H, D, generator=g), k=torch.randn(T, H, D, generator=g),
        v=torch.randn(T, H, D, generator=g), offsets=offsets,
        pos_w=torch.randn(2 * max_len - 1, generator=g) * 0.1,
        ts_w=torch.randn(129, generator=g) * 0.1,
        timestamps=torch.randint(0, 100_000, (T,), generator=g).cumsum(0),
    )
    return args, lengths


def run(backend: str, args: Dict[str, torch.Tensor], max_len: int, backward: bool) -> None:
    """One forward (and backward) of hstu_mha on ``backend``."""
    leaves = {n: args[n].clone().requires_grad_(backward) for n in ("q", "k", "v", "pos_w", "ts_w")}
    with ops.use_backend(backend, ops=OPS, device="cpu"):
        out = hstu_mha(leaves["q"], leaves["k"], leaves["v"], args["offsets"], max_seq_len=max_len,
                       alpha=D ** -0.5, pos_w=leaves["pos_w"], ts_w=leaves["ts_w"],
                       timestamps=args["timestamps"])
        if backward:
            out.backward(torch.ones_like(out))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def mem_worker(backend: str, max_len: int) -> None:
    """Subprocess body: print the peak RSS rise (bytes) of one forward+backward on ``backend``."""
    args, _ = make_inputs(max_len)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current resident size
    before = _rss_bytes()
    run(backend, args, max_len, backward=True)
    peak = _hwm_bytes()
    print(json.dumps({"peak_rise_bytes": max(peak - before, 0)}))


def peak_mem(backend: str, max_len: int) -> int:
    """Peak RSS rise of one forward+backward, measured in a fresh subprocess."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--mem-worker", backend,
                          str(max_len)], check=True, capture_output=True, text=True)
    return int(json.loads(out.stdout.strip().splitlines()[-1])["peak_rise_bytes"])


def bench(max_len: int, gflops: float, quick: bool) -> Dict[str, object]:
    args, lengths = make_inputs(max_len)
    n = lengths.to(torch.float64)
    pairs = float((n * (n + 1) / 2).sum())
    fwd_flop = pairs * H * (2 * D + 2 * D)
    ref_rep = dict(warmup=0, repeat=1)
    fused_rep = dict(warmup=1, repeat=3 if quick else 5)
    t = {}
    for backend, rep in (("cpu_kernel", fused_rep), ("reference", ref_rep)):
        for bwd in (False, True):
            t[backend, bwd] = common.timeit(lambda: run(backend, args, max_len, bwd), **rep)
    mem_fused, mem_ref = peak_mem("cpu_kernel", max_len), peak_mem("reference", max_len)
    return {
        "max_len": max_len, "B": B, "H": H, "d": D, "T": int(lengths.sum()),
        "mean_len": round(float(n.mean()), 1),
        "fused_fwd_ms": t["cpu_kernel", False], "ref_fwd_ms": t["reference", False],
        "fused_fwdbwd_ms": t["cpu_kernel", True], "ref_fwdbwd_ms": t["reference", True],
        "fwd_speedup": t["reference", False] / t["cpu_kernel", False],
        "fwdbwd_speedup": t["reference", True] / t["cpu_kernel", True],
        "fused_peak_mb": mem_fused / 2 ** 20, "ref_peak_mb": mem_ref / 2 ** 20,
        "peak_mem_ratio": mem_ref / max(mem_fused, 1),
        "fused_fwd_gflops": fwd_flop / (t["cpu_kernel", False] * 1e-3) / 1e9,
        "gemm_gflops": gflops,
        "gemm_efficiency": fwd_flop / (t["cpu_kernel", False] * 1e-3) / 1e9 / gflops,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="max_len 256 only (under 60 s)")
    ap.add_argument("--mem-worker", nargs=2, metavar=("BACKEND", "MAX_LEN"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.mem_worker:
        mem_worker(a.mem_worker[0], int(a.mem_worker[1]))
        return 0
    if cpu.kernel("hstu_mha_fwd") is None:
        print("csrc extension not built (make build): nothing to compare", file=sys.stderr)
        return 1
    gflops = measure_peak_gemm_flops() / 1e9
    rows = [bench(L, gflops, a.quick) for L in ((256,) if a.quick else (256, 1024))]
    common.print_table(rows, ["max_len", "T", "mean_len", "fused_fwd_ms", "ref_fwd_ms", "fwd_speedup",
                              "fused_fwdbwd_ms", "ref_fwdbwd_ms", "fwdbwd_speedup", "fused_peak_mb",
                              "ref_peak_mb", "peak_mem_ratio", "fused_fwd_gflops", "gemm_efficiency"])
    path = common.write_json("hstu_attention", {
        "quick": a.quick, "goals": {"fwd_speedup": 3.0, "fwdbwd_speedup": 3.0, "peak_mem_ratio": 2.0},
        "rows": rows})
    print(f"fp32 GEMM {gflops:.1f} GFLOP/s; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
