"""Training throughput of the KuaiRand example's model: tokens/s and MFU on CPU.

A fixed small HSTU configuration (and the SASRec baseline, side by side, same batches) runs
whole training steps exactly as ``examples/kuairand/train.py`` does them: TorchRec
``EmbeddingCollection`` sharded by the planner under ``DistributedModelParallel`` (one process),
fused row-wise Adagrad for the table, AdamW for dense, uniform shared-pool negatives and sampled
softmax.  Batches: heavy-tailed sequence lengths (``benchmarks.common.heavy_tailed_lengths``),
uniform item ids, fixed seeds.

MFU = model FLOPs per second / peak, with model FLOPs = forward + backward (3x forward) of the
encoder's matmuls plus the sampled-softmax scoring (formulas: torchrec_ascend/metrics/flops.py
and torchrec_ascend/modules/hstu.py) and peak = a 2048^3 fp32 GEMM measured in this run.

    python benchmarks/train.py --quick     # < 60 s; writes benchmarks/results/train.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any, Dict

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for p in (REPO, os.path.join(REPO, "examples", "kuairand")):
    if p not in sys.path:
        sys.path.insert(0, p)

from benchmarks.common import gemm_gflops, heavy_tailed_lengths, print_table, write_json  # noqa: E402

# the fixed configuration (the demo config's model, a larger corpus)
MODEL = {"embedding_dim": 64, "num_layers": 2, "num_heads": 2, "attention_dim": 32,
         "linear_dim": 32, "max_seq_len": 128, "dropout": 0.2, "normalization": "max_len",
         "use_time_bias": True, "use_actions": True, "sasrec_ffn_dim": 128}
TRAIN = {"batch_size": 32, "lr": 1e-3, "sparse_lr": 0.05, "num_negatives": 256,
         "temperature": 0.05, "sharding": "row_wise", "planner": "torchrec", "seed": 0}
NUM_ITEMS = 20_000


def _example():
    """examples/kuairand/train.py as a module (its file name clashes with this script's)."""
    import importlib.util

    name = "kuairand_train"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(REPO, "examples", "kuairand", "train.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return sys.modules[name]


def make_batches(n: int, seed: int = 0):
    """``n`` training batches: (KJT, offsets, timestamps, action bits, query_idx, logQ terms)."""
    from kuairand_data import make_kjt
    from torchrec_ascend.sampling import UniformSampler

    g = torch.Generator().manual_seed(seed)
    sampler = UniformSampler(NUM_ITEMS)
    out = []
    for _ in range(n):
        lengths = heavy_tailed_lengths(TRAIN["batch_size"], MODEL["max_seq_len"], generator=g)
        lengths.clamp_(min=2)
        t = int(lengths.sum())
        offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(lengths, 0)
        items = torch.randint(0, NUM_ITEMS, (t,), generator=g)
        ts = torch.cumsum(torch.randint(1, 3600, (t,), generator=g), 0)
        bits = (torch.rand(t, 8, generator=g) < 0.2).float()
        last = offsets[1:] - 1
        is_last = torch.zeros(t, dtype=torch.bool)
        is_last[last] = True
        query_idx = torch.nonzero(~is_last).flatten()
        sample = sampler.sample(items[query_idx + 1], TRAIN["num_negatives"], generator=g)
        kjt = make_kjt(items, len(lengths), sample.ids, lengths)
        out.append((kjt, offsets, ts, bits, query_idx, sample.log_q, sample.pos_log_q))
    return out


def bench_model(kind: str, batches, warmup: int, peak: float) -> Dict[str, Any]:
    """Train ``kind`` on ``batches`` (after ``warmup`` of them); tokens/s and MFU."""
    example = _example()
    cfg = {"model": MODEL, "train": TRAIN}
    dmp, opt, _ = example.build_model(NUM_ITEMS, kind, cfg, world_size=1)
    model = dmp.module
    tokens, flops, secs = 0, 0.0, 0.0
    for i, (kjt, off, ts, bits, qi, nlq, plq) in enumerate(batches):
        t0 = time.perf_counter()
        loss = dmp(kjt, off, ts, bits, qi, nlq, plq)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        if i >= warmup:
            tokens += int(off[-1])
            flops += model.step_flops(off, int(qi.numel()), TRAIN["num_negatives"])
            secs += dt
    return {"model": kind, "steps": len(batches) - warmup, "tokens": tokens,
            "seconds": secs, "tokens_per_s": tokens / secs,
            "model_gflops_per_s": flops / secs / 1e9, "mfu": flops / secs / peak,
            "final_loss": float(loss.detach())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few steps (< 60 s)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (default 1: the example's small ops are "
                         "latency-bound; 0 = torch's default)")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    import torch.distributed as dist

    if not dist.is_initialized():
        fd, store = tempfile.mkstemp(prefix="bench-train-pg-")
        os.close(fd)
        os.remove(store)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    warmup, steps = (3, 12) if args.quick else (5, 60)
    peak = gemm_gflops(2048, repeat=3) * 1e9
    batches = make_batches(warmup + steps)
    rows = [bench_model(kind, batches, warmup, peak) for kind in ("hstu", "sasrec")]
    peak_after = gemm_gflops(2048, repeat=3) * 1e9
    for r in rows:
        r["mfu_pct"] = 100 * r["mfu"]
    print(f"peak fp32 GEMM: {peak / 1e9:.1f} GFLOP/s before, {peak_after / 1e9:.1f} after "
          f"({torch.get_num_threads()} thread(s))")
    print_table(rows, ["model", "steps", "tokens", "seconds", "tokens_per_s",
                       "model_gflops_per_s", "mfu_pct", "final_loss"])
    hstu = rows[0]
    path = write_json("train", {
        "quick": args.quick, "config": {"model": MODEL, "train": TRAIN, "num_items": NUM_ITEMS},
        "tokens_per_s": hstu["tokens_per_s"], "mfu": hstu["mfu"],
        "peak_gemm_gflops": peak / 1e9, "peak_gemm_gflops_after": peak_after / 1e9,
        "rows": rows,
    })
    print(f"wrote {path}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
