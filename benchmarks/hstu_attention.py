"""Fused jagged HSTU attention (csrc CPU kernel): efficiency against the machine's large-GEMM peak
of the same dtype, measured in the same run; and speed / memory against a padded PyTorch HSTU.

Usage: ``python benchmarks/hstu_attention.py [--quick] [--max-len 1024 ...] [--threads 1 2]
[--heads 8]`` (``--quick``: max_len 256, one round).  Writes
``benchmarks/results/hstu_attention_<cpu kind>.json`` (``amx``, ``avx512bf16``, ``avx512``,
``avx2``: :func:`common.cpu_kind`; ``..._h<heads>.json`` for heads other than 4) and prints a
table.

Rows: dtype (fp32, bf16) x max_len (256, 1024, 4096) x threads (1, 2).  Inputs: heavy-tailed
lengths (mean about max_len / 4, one sequence at max_len; the batch shrinks with max_len so the
padded side fits), H=4 (``--heads``; the paper config trains with 8), d=64 (the paper's head
dim), causal, relative bias (position + time buckets, sorted timestamps) on -- the configuration
HSTU trains with.

Per row, these contenders are timed side by side, interleaved round by round
(``benchmarks/side_by_side.py``: ``torch.utils.benchmark`` blocked_autorange at the row's thread
count):

* ``fwd``: ``torchrec_ascend::hstu_mha`` on the csrc backend (the engine the backend chose for
  the dtype on this CPU: ``ops.hstu_engines.cpu_engine``);
* ``bwd``: ``torchrec_ascend::hstu_mha_backward`` (the autograd formula's op: dq, dk, dv and the
  bias tables' gradients; it recomputes S itself);
* ``gemm``: ``torch.mm`` of two 2048 x 2048 matrices of the dtype -- the large-GEMM peak;
* ``padded_fwdbwd`` (1-thread rows of ``--padded``): the padded PyTorch HSTU attention of
  ``ops/reference/hstu.py`` with torch autograd.

``fwd_efficiency`` / ``bwd_efficiency``: useful FLOP per second of the fused op over the GEMM's
rate, per round, median over rounds.  Useful FLOP: the causal pairs ``sum_b n_b (n_b + 1) / 2`` x H
x (2 dqk + 2 dv) for the forward, twice that for the backward (dS K, dS^T Q, P^T dO, dO V^T; not
the recomputed S).  The same ratios from thread CPU time (1-thread rows: immune to the time other
processes take from the core, not to what they do to its caches) are ``*_efficiency_cpu``.  The
1-minute load average is recorded per row.  Goals (issue 31): forward >= 0.60, backward >= 0.50 at
max_len 1024 and 4096.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Callable, ContextManager, Dict, List, Tuple

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import side_by_side  # noqa: E402

import torchrec_ascend.ops as ops  # noqa: E402
from torchrec_ascend import device  # noqa: E402
from torchrec_ascend.ops import extension  # noqa: E402
from torchrec_ascend.ops.hstu_engines import cpu_engine  # noqa: E402
from torchrec_ascend.ops.reference import hstu as padded  # noqa: E402

H, D = 4, 64
BATCH = {256: 64, 1024: 16, 4096: 2}  # padded [B, H, N, N] scores: 64 MiB .. 512 MiB in fp32
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
GEMM_N = 2048
OPS = ["hstu_mha", "hstu_mha_backward"]
GOALS = {"fwd_efficiency": 0.60, "bwd_efficiency": 0.50}
MEM_FLOOR = 2 ** 20  # a peak RSS rise under 1 MiB is no measurement of the op's memory


def set_heads(heads: int) -> None:
    """The heads every row runs with (``--heads``)."""
    global H
    H = int(heads)


_ops = torch.ops.torchrec_ascend


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


def positional(args: Dict[str, torch.Tensor], max_len: int) -> tuple:
    """The op's positional arguments (alpha 1/sqrt(d), normalised by max_len, causal)."""
    return (args["q"], args["k"], args["v"], args["offsets"], D ** -0.5, max_len, False, None, 0,
            args["pos_w"], args["ts_w"], args["timestamps"])


def padded_step(args: Dict[str, torch.Tensor], max_len: int) -> Callable[[], None]:
    """One forward + backward of the padded PyTorch HSTU attention (torch autograd)."""
    leaves = {n: args[n].clone().requires_grad_(True) for n in ("q", "k", "v", "pos_w", "ts_w")}
    grad = torch.ones(args["q"].shape[0], H, D, dtype=args["q"].dtype)

    def step() -> None:
        out = padded.hstu_mha(leaves["q"], leaves["k"], leaves["v"], args["offsets"], D ** -0.5, max_len,
                              False, None, 0, leaves["pos_w"], leaves["ts_w"], args["timestamps"])
        out.backward(grad)
        for t in leaves.values():
            t.grad = None

    return step


def fused_step(args: Dict[str, torch.Tensor], max_len: int, backward: bool) -> Callable[[], None]:
    """One call of the fused op (forward, or backward); run it inside :func:`fused_backend`."""
    pos = positional(args, max_len)
    grad = torch.ones(args["q"].shape[0], H, D, dtype=args["q"].dtype)

    def fwd() -> None:
        _ops.hstu_mha(*pos)

    def bwd() -> None:
        _ops.hstu_mha_backward(grad, *pos)

    return bwd if backward else fwd


def fused_backend() -> ContextManager[None]:
    """The csrc kernel forced for the fused op, entered once around a workload as a user would
    (entering and leaving ``use_backend`` rewrites the dispatcher's tables: ~0.3 ms, which timed
    around each call was ~10% of a max_len 1024 bf16 forward)."""
    return ops.use_backend("cpu_kernel", ops=OPS, device="cpu")


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
    if path == "padded":
        step = padded_step(args, max_len)
    else:
        fwd, bwd = fused_step(args, max_len, False), fused_step(args, max_len, True)

        def step() -> None:
            fwd()
            bwd()
    with fused_backend():
        step()  # warmed up like the timed runs (one-time allocations, the engine choice)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak (VmHWM) to the current resident size
        before = _rss_bytes()
        step()
    print(json.dumps({"peak_rise_bytes": max(_hwm_bytes() - before, 0)}))


def peak_mem(path: str, max_len: int, dtype_name: str) -> int:
    """Peak RSS rise of one forward+backward, measured in a fresh subprocess."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--heads", str(H), "--mem-worker", path,
                          str(max_len), dtype_name], check=True, capture_output=True, text=True)
    return int(json.loads(out.stdout.strip().splitlines()[-1])["peak_rise_bytes"])


def cpu_times(fns: Dict[str, Callable[[], None]], rounds: int, min_time: float = 0.2) -> Dict[str, List[float]]:
    """Per round, each contender's median thread CPU time (seconds) of repeated calls, the
    contenders interleaved (1-thread rows: the work runs on this thread)."""
    out: Dict[str, List[float]] = {n: [] for n in fns}
    names = list(fns)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            fn, ts = fns[name], []
            t_end = time.thread_time() + min_time
            while not ts or time.thread_time() < t_end:
                t0 = time.thread_time()
                fn()
                ts.append(time.thread_time() - t0)
            out[name].append(statistics.median(ts))
    return out


def bench(max_len: int, dtype_name: str, threads: int, rounds: int, with_padded: bool) -> Dict[str, object]:
    torch.set_num_threads(threads)
    dtype = DTYPES[dtype_name]
    args, lengths = make_inputs(max_len, dtype)
    n = lengths.to(torch.float64)
    fwd_flop = float((n * (n + 1) / 2).sum()) * H * (2 * D + 2 * D)
    bwd_flop = 2 * fwd_flop
    g = torch.Generator().manual_seed(1)
    ga, gb = torch.randn(GEMM_N, GEMM_N, generator=g).to(dtype), torch.randn(GEMM_N, GEMM_N, generator=g).to(dtype)
    steps: Dict[str, Callable[[], object]] = {
        "fwd": fused_step(args, max_len, False), "bwd": fused_step(args, max_len, True),
        "gemm": lambda: torch.mm(ga, gb)}
    if with_padded:
        steps["padded_fwdbwd"] = padded_step(args, max_len)
    load0 = os.getloadavg()[0]
    with fused_backend():
        t = side_by_side.interleaved(steps, rounds=rounds, min_run_time=0.2)
    r = {k: v["rounds_ms"] for k, v in t.items()}
    gemm_flop = 2.0 * GEMM_N ** 3
    fwd_eff = [fwd_flop / f / (gemm_flop / gm) for f, gm in zip(r["fwd"], r["gemm"])]
    bwd_eff = [bwd_flop / b / (gemm_flop / gm) for b, gm in zip(r["bwd"], r["gemm"])]
    ms = {k: v["ms"] for k, v in t.items()}
    row: Dict[str, object] = {
        "dtype": dtype_name, "max_len": max_len, "threads": threads, "engine": cpu_engine(dtype)[0],
        "B": BATCH[max_len], "H": H, "d": D, "T": int(lengths.sum()), "mean_len": round(float(n.mean()), 1),
        "fwd_ms": ms["fwd"], "bwd_ms": ms["bwd"], "gemm_ms": ms["gemm"],
        "gemm_gflops": gemm_flop / (ms["gemm"] * 1e-3) / 1e9,
        "fwd_gflops": fwd_flop / (ms["fwd"] * 1e-3) / 1e9, "bwd_gflops": bwd_flop / (ms["bwd"] * 1e-3) / 1e9,
        "fwd_efficiency": statistics.median(fwd_eff), "bwd_efficiency": statistics.median(bwd_eff),
        "rounds_ms": r,
    }
    if threads == 1:
        with fused_backend():
            c = cpu_times({k: steps[k] for k in ("fwd", "bwd", "gemm")}, rounds)
        row["fwd_efficiency_cpu"] = statistics.median(
            fwd_flop / f / (gemm_flop / gm) for f, gm in zip(c["fwd"], c["gemm"]))
        row["bwd_efficiency_cpu"] = statistics.median(
            bwd_flop / b / (gemm_flop / gm) for b, gm in zip(c["bwd"], c["gemm"]))
        row["gemm_gflops_cpu"] = gemm_flop / statistics.median(c["gemm"]) / 1e9
    if with_padded:
        row["padded_fwdbwd_ms"] = ms["padded_fwdbwd"]
        row["fwdbwd_speedup"] = statistics.median(
            p / (f + b) for p, f, b in zip(r["padded_fwdbwd"], r["fwd"], r["bwd"]))
        fused_mem, padded_mem = peak_mem("fused", max_len, dtype_name), peak_mem("padded", max_len, dtype_name)
        row.update(fused_peak_mb=fused_mem / 2 ** 20, padded_peak_mb=padded_mem / 2 ** 20,
                   peak_mem_ratio=padded_mem / fused_mem if fused_mem >= MEM_FLOOR else None)
        if fused_mem < MEM_FLOOR:
            row["peak_mem_note"] = (f"the fused op's peak RSS rise was {fused_mem} bytes, under "
                                    f"{MEM_FLOOR} (it reused memory its warm-up run had freed): "
                                    "no ratio")
    row["load_avg_1min"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="max_len 256, one round")
    ap.add_argument("--max-len", type=int, nargs="*", choices=sorted(BATCH), help="lengths to run")
    ap.add_argument("--threads", type=int, nargs="*", default=None, help="thread counts (default 1 2)")
    ap.add_argument("--dtypes", nargs="*", choices=sorted(DTYPES), default=None)
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; --quick 1)")
    ap.add_argument("--no-padded", action="store_true", help="skip the padded PyTorch contender")
    ap.add_argument("--heads", type=int, default=H, help=f"attention heads (default {H})")
    ap.add_argument("--mem-worker", nargs=3, metavar=("PATH", "MAX_LEN", "DTYPE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.heads < 1:
        ap.error(f"--heads: must be >= 1, got {a.heads}")
    default_heads = H
    set_heads(a.heads)
    if a.mem_worker:
        mem_worker(a.mem_worker[0], int(a.mem_worker[1]), a.mem_worker[2])
        return 0
    if extension.kernel("hstu_mha_fwd") is None:
        print("csrc extension not built (make build): nothing to measure", file=sys.stderr)
        return 1
    lens = a.max_len or ([256] if a.quick else sorted(BATCH))
    threads = a.threads or [1, 2]
    rounds = a.rounds or (1 if a.quick else 3)
    rows: List[Dict[str, object]] = []
    for name in a.dtypes or list(DTYPES):
        for L in lens:
            for th in threads:
                rows.append(bench(L, name, th, rounds, with_padded=not a.no_padded and th == 1))
                print(f"{name} max_len {L} threads {th}: fwd {rows[-1]['fwd_efficiency']:.3f} bwd "
                      f"{rows[-1]['bwd_efficiency']:.3f} of the {name} GEMM peak "
                      f"({rows[-1]['gemm_gflops']:.0f} GFLOP/s), load {rows[-1]['load_avg_1min']}", flush=True)
    common.print_table(rows, ["dtype", "max_len", "threads", "engine", "T", "fwd_ms", "bwd_ms", "gemm_gflops",
                              "fwd_gflops", "bwd_gflops", "fwd_efficiency", "bwd_efficiency",
                              "fwd_efficiency_cpu", "bwd_efficiency_cpu", "fwdbwd_speedup", "peak_mem_ratio",
                              "load_avg_1min"])
    kind = common.cpu_kind()
    suffix = "" if H == default_heads else f"_h{H}"
    path = common.write_json(f"hstu_attention_{kind}{suffix}", {
        "quick": a.quick, "rounds": rounds, "cpu_kind": kind,
        "timing": "torch.utils.benchmark blocked_autorange, contenders interleaved per round; *_cpu: thread CPU time",
        "gemm": f"torch.mm {GEMM_N}x{GEMM_N}x{GEMM_N} in the row's dtype and thread count, same rounds",
        "gemm_capability": device.gemm_capability("cpu").as_dict(),
        "engines": {d: cpu_engine(DTYPES[d]) for d in DTYPES},
        "goals": GOALS, "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
