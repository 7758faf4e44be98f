"""Negative sampling benchmark: shared pool vs per-token negatives, fp16 vs fp32 logits, async
offload.  CPU, HSTU-sized batches (T ~ 16k jagged tokens, D = 256).

Usage: ``python benchmarks/negatives.py [--quick]``  ->  ``benchmarks/results/negatives.json``

What is measured (all side by side in one run, same inputs; training steps and GEMMs are timed
by ``torch.utils.benchmark`` with the contenders interleaved round by round,
``benchmarks/side_by_side.py``, and ratios are medians of per-round ratios):

* ``effective_negatives_ratio``: negatives per token of the shared pool (R) over those of
  per-token sampling (K), with the shared pool using *fewer* embedding lookups (R vs T*K) --
  and ``step_time_ratio``: its training-step time (sample, lookup, loss forward+backward) over
  the per-token step's.  ``--quick`` measures R = 16 K; the full run sweeps R and also reports
  the largest R within 1.1x of the per-token step time.
* fp16 / bf16 vs fp32 logits (forward + backward of the ``[T, D] x [D, R]`` GEMM path in the
  loss): time, bytes saved for backward, loss and gradient error.  Half compute runs where
  ``torchrec_ascend.device`` measured that dtype's GEMM faster than fp32 on this machine
  (recorded in each row's ``gemm``; AVX512-BF16 / AMX CPUs for bf16): elsewhere the rows are
  widened to fp32 for the GEMM (native half GEMM on AVX2 is ~100x slower, measured here too),
  so half precision is a storage format there; on npu/cuda it is the fast path.
* ``async_hidden_fraction``: share of the per-step sampling + lookup cost that the background
  worker hides from the training loop, measured side by side: ``1 - exposed_async /
  exposed_sync`` where ``exposed`` = a steady-state step's wall time minus its training compute
  (step 0, the pipeline fill, has nothing to overlap with and is reported apart as
  ``pipeline_fill_ms``).  Also reported: ``1 - wait / t_sample`` against the standalone cost, and
  the training-time ratio async / sync (the worker shares the CPU cores with training).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Dict, List

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import side_by_side  # noqa: E402
from benchmarks.common import heavy_tailed_lengths, print_table, timeit, write_json  # noqa: E402
from torchrec_ascend import device  # noqa: E402
from torchrec_ascend.sampling import (AsyncNegativePrefetcher, MixedSampler,  # noqa: E402
                                      SampledSoftmaxLoss, UniformSampler, half_gemm_is_fast,
                                      half_logits)


def _zipf_ids(t: int, n: int, g: torch.Generator) -> torch.Tensor:
    """Skewed (Zipf ~1) item ids, like KuaiRand's popularity."""
    w = 1.0 / torch.arange(1, n + 1, dtype=torch.float64)
    cdf = torch.cumsum(w / w.sum(), 0)
    return torch.searchsorted(cdf, torch.rand(t, generator=g, dtype=torch.float64)).clamp_(max=n - 1)


class Setup:
    def __init__(self, quick: bool) -> None:
        g = torch.Generator().manual_seed(0)
        self.batch, self.max_len, self.d = 64, 1024, 256
        self.lengths = heavy_tailed_lengths(self.batch, self.max_len, generator=g)
        self.t = int(self.lengths.sum())
        self.num_items = 100_000 if quick else 300_000
        self.table = (torch.randn(self.num_items, self.d, generator=g) * 0.05).requires_grad_(True)
        self.pos = _zipf_ids(self.t, self.num_items, g)
        self.query = torch.randn(self.t, self.d, generator=g).requires_grad_(True)
        self.loss_fn = SampledSoftmaxLoss(temperature=0.05)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        # sparse gradient: the backward touches only the looked-up rows (like a fused TBE)
        return F.embedding(ids, self.table, sparse=True)

    def step(self, sampler, shared: int, per_token: int, g: torch.Generator,
             loss_fn=None) -> float:
        """One training step of the loss part: sample, look up, forward, backward."""
        neg = sampler.sample(self.pos, shared, g) if shared else None
        ex = sampler.sample_per_token(self.pos, per_token, g) if per_token else None
        pe = self.lookup(self.pos)
        f = loss_fn or self.loss_fn
        if neg is None:
            loss = f(self.query, self.pos, pe, ex, self.lookup(ex.ids))
        else:
            kw = {}
            if ex is not None:
                kw = dict(extra_negatives=ex, extra_neg_emb=self.lookup(ex.ids))
            loss = f(self.query, self.pos, pe, neg, self.lookup(neg.ids), **kw)
        loss.backward()
        self.query.grad = None
        self.table.grad = None
        return float(loss.detach())


def bench_sharing(s: Setup, quick: bool) -> Dict[str, object]:
    """Per-token K vs shared pools R, every configuration's training step timed side by side:
    interleaved round by round (``side_by_side``), ratios from steps measured in the same round."""
    k = 4 if quick else 16
    mults = [16] if quick else [16, 32, 64, 128]
    sampler = UniformSampler(s.num_items)
    g = torch.Generator().manual_seed(1)
    steps = {"per_token": lambda: s.step(sampler, 0, k, g)}
    for m in mults:
        steps[f"shared_{m * k}"] = lambda r=m * k: s.step(sampler, r, 0, g)
    t = side_by_side.interleaved(steps, rounds=2 if quick else 4, min_run_time=0.5 if quick else 1.0)
    rows = [{"config": f"per-token K={k}", "negatives_per_token": k, "lookups": s.t * k,
             "step_ms": t["per_token"]["ms"], "time_ratio": 1.0}]
    for m in mults:
        r = m * k
        rows.append({"config": f"shared R={r}", "negatives_per_token": r, "lookups": r,
                     "step_ms": t[f"shared_{r}"]["ms"],
                     "time_ratio": side_by_side.ratio(t, f"shared_{r}", "per_token")})
    main = rows[1]
    within = [r for r in rows[1:] if r["time_ratio"] <= 1.1]
    best = max(within, key=lambda r: r["negatives_per_token"]) if within else None
    return {
        "rows": rows,
        "timing": "torch.utils.benchmark blocked_autorange, all configurations interleaved per round",
        "per_token_k": k,
        "shared_r": main["negatives_per_token"],
        "effective_negatives_ratio": main["negatives_per_token"] / k,
        "lookups_ratio": main["lookups"] / (s.t * k),
        "step_time_ratio": main["time_ratio"],
        "max_effective_ratio_within_1.1x_time":
            (best["negatives_per_token"] / k) if best else None,
    }


def _saved_bytes(fn) -> int:
    """Bytes of tensors autograd saves for backward while running ``fn`` (unique storages)."""
    seen: Dict[int, int] = {}

    def pack(t: torch.Tensor):
        try:
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
        except Exception:
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(seen.values()), out


def _logits_step(q: torch.Tensor, n: torch.Tensor, dtype):
    """Forward + backward of the ``[T, D] x [D, R]`` logit GEMM alone (as the loss runs it)."""
    q, n = q.clone().requires_grad_(True), n.clone().requires_grad_(True)
    g = torch.randn(q.shape[0], n.shape[0])

    def run():
        out = q @ n.t() if dtype is None else half_logits(q, n, dtype)
        out.backward(g)
        q.grad = n.grad = None

    return run


def bench_half(s: Setup, quick: bool) -> Dict[str, object]:
    """fp32 / fp16 / bf16 logits: errors from one call each, then every loss step and logit GEMM
    timed side by side (interleaved per round)."""
    r = 256 if quick else 4096
    g = torch.Generator().manual_seed(2)
    neg = MixedSampler(s.num_items).sample(s.pos, r, g)
    ne = s.lookup(neg.ids).detach()
    pe = s.lookup(s.pos).detach()
    rows = []
    ref = None
    steps = {}
    for hp in (None, "fp16", "bf16"):
        dt = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(hp)
        f = SampledSoftmaxLoss(temperature=0.05, half_precision=hp)
        q = s.query.detach().clone().requires_grad_(True)
        n = ne.clone().requires_grad_(True)

        def run(f=f, q=q, n=n):
            f(q, s.pos, pe, neg, n).backward()
            q.grad = n.grad = None

        # first call: bytes saved for backward, loss and gradients
        nbytes, loss = _saved_bytes(lambda: f(q, s.pos, pe, neg, n))
        loss.backward()
        res = (float(loss.detach()), q.grad.clone(), n.grad.clone())
        q.grad = n.grad = None
        name = hp or "fp32"
        steps[f"loss_{name}"] = run
        steps[f"logits_{name}"] = _logits_step(q.detach(), n.detach(), dt)
        if ref is None:
            ref = res
        rows.append({
            "precision": name,
            "gemm": "fp32" if dt is None else ("half" if half_gemm_is_fast("cpu", dt) else
                                               "fp32 on widened half rows"),
            "gemm_operands_MB": (s.t + r) * s.d * (2 if hp else 4) / 2**20,
            "saved_for_backward_MB": nbytes / 2**20,
            "loss_abs_err": abs(res[0] - ref[0]),
            "grad_q_rel_err": float((res[1] - ref[1]).norm() / ref[1].norm()),
            "grad_neg_rel_err": float((res[2] - ref[2]).norm() / ref[2].norm()),
        })
    t = side_by_side.interleaved(steps, rounds=1 if quick else 3, min_run_time=0.3 if quick else 1.0)
    for row in rows:
        name = row["precision"]
        row["logits_fwd_bwd_ms"] = t[f"logits_{name}"]["ms"]
        row["loss_fwd_bwd_ms"] = t[f"loss_{name}"]["ms"]
        row["logits_time_vs_fp32"] = side_by_side.ratio(t, f"logits_{name}", "logits_fp32")
        row["loss_time_vs_fp32"] = side_by_side.ratio(t, f"loss_{name}", "loss_fp32")
    # native half GEMM on this CPU, for the record (small shape: it is slow)
    a, b = torch.randn(512, s.d), torch.randn(s.d, 512)
    flops = 2 * 512 * 512 * s.d
    native = {}
    for name, dt in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
        x, y = a.to(dt), b.to(dt)
        native[name] = flops / (timeit(lambda: torch.mm(x, y), warmup=1, repeat=3) * 1e-3) / 1e9
    return {"pool_r": r, "rows": rows, "cpu_native_gemm_gflops_512x256x512": native,
            "note": "CPU: where this CPU has no native half GEMM (fp16 without AMX-FP16, bf16 "
                    "without AVX512-BF16/AMX) the half rows are widened to fp32 for the GEMM "
                    "(storage format only: time includes the casts, the win is memory); bf16 "
                    "with oneDNN support runs as a native bf16 GEMM. npu/cuda run the GEMM in "
                    "half precision with fp32 accumulation."}


def bench_async(s: Setup, quick: bool) -> Dict[str, object]:
    r = 256 if quick else 2048
    steps = 4 if quick else 8
    sampler = MixedSampler(s.num_items, uniform_fraction=0.5)
    batches = [s.pos] * steps
    pe = s.lookup(s.pos).detach()

    def lookup(ids):
        return s.lookup(ids).detach()

    def train(neg) -> None:
        q = s.query.detach().requires_grad_(True)
        n = neg.neg_emb.requires_grad_(True)
        s.loss_fn(q, s.pos, pe, neg.negatives, n).backward()

    def run(asynchronous: bool):
        """Per steady-state step: (wall, train compute, exposed = wall - train, wait in get()).

        Step 0 is the pipeline fill (nothing ran before it to overlap with, in any prefetcher):
        returned apart as its wait."""
        walls, trains, waits = [], [], []
        with AsyncNegativePrefetcher(sampler, r, lookup_fn=lookup, seed=3, device="cpu",
                                     asynchronous=asynchronous) as pf:
            it = pf.prefetch(batches, lambda b: b)
            while True:
                w0 = time.perf_counter()
                try:
                    _, neg = next(it)  # submits step i+1 (sync: samples it inline), gets step i
                except StopIteration:
                    break
                w1 = time.perf_counter()
                train(neg)
                w2 = time.perf_counter()
                walls.append(w2 - w0)
                trains.append(w2 - w1)
                waits.append(w1 - w0)
        wall, tr = statistics.mean(walls[1:]), statistics.mean(trains[1:])
        return {"wall": wall, "train": tr, "exposed": wall - tr,
                "wait": statistics.mean(waits[1:]), "fill": waits[0]}

    g = torch.Generator().manual_seed(4)
    t_sample = timeit(lambda: lookup(sampler.sample(s.pos, r, g).ids), warmup=1,
                      repeat=3 if quick else 5) * 1e-3
    sync, asyn = [], []
    for _ in range(1 if quick else 3):  # interleaved: machine load drifts
        sync.append(run(False))
        asyn.append(run(True))

    def med(rows, key):
        return statistics.median(x[key] for x in rows)

    exp_sync, exp_async = med(sync, "exposed"), med(asyn, "exposed")
    return {
        "pool_r": r, "steps": steps,
        "sample_lookup_ms": t_sample * 1e3,
        "sync_step_ms": med(sync, "wall") * 1e3, "async_step_ms": med(asyn, "wall") * 1e3,
        "sync_train_ms": med(sync, "train") * 1e3, "async_train_ms": med(asyn, "train") * 1e3,
        "sync_exposed_ms": exp_sync * 1e3, "async_exposed_ms": exp_async * 1e3,
        "async_wait_ms": med(asyn, "wait") * 1e3, "pipeline_fill_ms": med(asyn, "fill") * 1e3,
        # primary: share of the per-step sampling + lookup time that the training loop no longer
        # sees, side by side in one run: 1 - exposed(async) / exposed(sync), exposed = step wall
        # time minus the step's training compute (steady state)
        "async_hidden_fraction": 1.0 - exp_async / exp_sync,
        # the same against the standalone cost of sampling + lookup: 1 - wait / t_sample
        "async_hidden_fraction_vs_standalone": 1.0 - med(asyn, "wait") / t_sample,
        # CPU contention: the worker shares the cores with training (train time async / sync);
        # on a loaded shared machine this ratio is noise-dominated
        "train_time_ratio_async_vs_sync": med(asyn, "train") / med(sync, "train"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one configuration each, < 60 s")
    args = ap.parse_args()
    t0 = time.perf_counter()
    s = Setup(args.quick)
    rates = device.measure_gemm_gflops("cpu", (torch.float32,) + tuple(
        d for d in (torch.bfloat16, torch.float16) if d in device.gemm_capability("cpu").gflops), n=1024)
    gflops = rates[torch.float32]
    print(f"T={s.t} jagged tokens (B={s.batch}, max_len={s.max_len}), D={s.d}, "
          f"items={s.num_items}, fp32 GEMM {gflops:.1f} GFLOP/s")
    sharing = bench_sharing(s, args.quick)
    print_table(sharing["rows"])
    print(f"[{time.perf_counter() - t0:.1f} s]")
    half = bench_half(s, args.quick)
    print_table(half["rows"])
    print(f"[{time.perf_counter() - t0:.1f} s]")
    print("native CPU GEMM GFLOP/s (512x256x512):",
          {k: round(v, 2) for k, v in half["cpu_native_gemm_gflops_512x256x512"].items()})
    asyn = bench_async(s, args.quick)
    print_table([asyn])
    summary = {
        "effective_negatives_ratio": sharing["effective_negatives_ratio"],
        "step_time_ratio": sharing["step_time_ratio"],
        "max_effective_ratio_within_1.1x_time": sharing["max_effective_ratio_within_1.1x_time"],
        "fp16_gemm_on_this_cpu": half["rows"][1]["gemm"],
        "fp16_vs_fp32_logit_time_ratio": half["rows"][1]["logits_time_vs_fp32"],
        "fp16_vs_fp32_loss_time_ratio": half["rows"][1]["loss_time_vs_fp32"],
        "bf16_gemm_on_this_cpu": half["rows"][2]["gemm"],
        "bf16_vs_fp32_logit_time_ratio": half["rows"][2]["logits_time_vs_fp32"],
        "bf16_vs_fp32_loss_time_ratio": half["rows"][2]["loss_time_vs_fp32"],
        "fp16_vs_fp32_gemm_operand_bytes_ratio":
            half["rows"][1]["gemm_operands_MB"] / half["rows"][0]["gemm_operands_MB"],
        "fp16_vs_fp32_saved_bytes_ratio":
            half["rows"][1]["saved_for_backward_MB"] / half["rows"][0]["saved_for_backward_MB"],
        "async_hidden_fraction": asyn["async_hidden_fraction"],
        "async_hidden_fraction_vs_standalone": asyn["async_hidden_fraction_vs_standalone"],
        "train_time_ratio_async_vs_sync": asyn["train_time_ratio_async_vs_sync"],
    }
    goals = {"effective_negatives_ratio": ">= 16", "step_time_ratio": "<= 1.1",
             "async_hidden_fraction": ">= 0.95"}
    print_table([{"metric": k, "value": v, "goal": goals.get(k, "")} for k, v in summary.items()])
    path = write_json("negatives", {
        "quick": args.quick, "tokens": s.t, "dim": s.d, "num_items": s.num_items,
        "fp32_gemm_gflops": gflops, "gemm_gflops": {str(k).replace("torch.", ""): v for k, v in rates.items()},
        "gemm_capability": device.gemm_capability("cpu").as_dict(), "summary": summary, "goals": goals,
        "sharing": sharing, "half_precision": half, "async": asyn,
        "seconds": time.perf_counter() - t0,
    })
    print(f"wrote {path} in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
