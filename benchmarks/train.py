"""Training throughput of the library's trainer: tokens/s and MFU of HSTU and SASRec on CPU.

Both models are built by ``torchrec_ascend.training.Trainer`` exactly as a training run builds
them (TorchRec ``EmbeddingCollection`` sharded by the planner under ``DistributedModelParallel``,
one process; fused row-wise Adagrad for the table, AdamW for dense; steps driven by TorchRec's
``TrainPipelineSparseDist`` with the negative prefetcher) on the same synthetic split
(heavy-tailed sequence lengths from ``benchmarks.common.heavy_tailed_lengths``, uniform item
ids, fixed seeds), and timed **alternately, round by round** (HSTU round r, SASRec round r, ...)
so machine noise hits both alike.

MFU = model FLOPs per second / peak, model FLOPs = forward + backward (3x forward) of the
encoder's matmuls plus the sampled-softmax scoring (torchrec_ascend/metrics/flops.py,
torchrec_ascend/modules/hstu.py); peak = the best of three 2048^3 fp32 GEMMs
(``torchrec_ascend.metrics.measure_peak_gemm_flops``) measured in this run, before and after.

    python benchmarks/train.py --quick     # < 60 s; writes benchmarks/results/train.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Dict, List

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.common import heavy_tailed_lengths, print_table, write_json  # noqa: E402
from torchrec_ascend.datasets import Sequences  # noqa: E402
from torchrec_ascend.metrics import measure_peak_gemm_flops  # noqa: E402
from torchrec_ascend.training import Trainer, config_from_dict, leave_two_out  # noqa: E402
from torchrec_ascend.training.distributed import init_distributed  # noqa: E402

# the fixed configuration (the demo config's model, a larger corpus)
MODEL = {"embedding_dim": 64, "num_layers": 2, "num_heads": 2, "attention_dim": 32,
         "linear_dim": 32, "max_seq_len": 128, "dropout": 0.2, "normalization": "max_len",
         "use_time_bias": True, "use_actions": True, "sasrec_ffn_dim": 128}
TRAIN = {"batch_size": 32, "lr": 1e-3, "sparse_lr": 0.05, "num_negatives": 256,
         "temperature": 0.05, "sharding": "row_wise", "planner": "torchrec",
         "pipeline": "sparse_dist", "seed": 0, "steps": 100000}
NUM_ITEMS = 20_000
NUM_USERS = 4_000


def synthetic_split(seed: int = 0):
    """Heavy-tailed sequences (+2 held-out items each) over ``NUM_ITEMS`` uniform items."""
    g = torch.Generator().manual_seed(seed)
    lens = heavy_tailed_lengths(NUM_USERS, MODEL["max_seq_len"], generator=g).clamp(min=2) + 2
    lens = lens.numpy().astype(np.int64)
    rng = np.random.default_rng(seed)
    off = np.zeros(NUM_USERS + 1, dtype=np.int64)
    np.cumsum(lens, out=off[1:])
    items = rng.integers(0, NUM_ITEMS, off[-1])
    times = np.concatenate([np.cumsum(rng.integers(1, 3600, n)) for n in lens]) * 1000
    actions = (rng.random((off[-1], 8)) < 0.2).astype(np.uint8)
    bits = (actions << np.arange(8, dtype=np.uint8)).sum(1).astype(np.uint8)
    return leave_two_out(Sequences(items, times, bits, off, np.arange(NUM_USERS), NUM_ITEMS))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few steps (< 60 s)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (default 1: the small ops are latency-bound; "
                         "0 = torch's default)")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    env = init_distributed("cpu")
    warmup, rounds, per_round = (3, 3, 4) if args.quick else (5, 6, 10)
    cfg = config_from_dict({"data": {"source": "table", "files": ["synthetic"]},
                            "model": MODEL, "train": TRAIN, "models": ["hstu", "sasrec"]})
    split = synthetic_split()
    peak = measure_peak_gemm_flops(2048, repeat=3)
    trainers = {k: Trainer(cfg, split, env, os.devnull, k, peak, progress=False,
                           log=lambda _m: None) for k in cfg.models}
    acc: Dict[str, Dict[str, float]] = {k: {"tokens": 0.0, "flops": 0.0, "seconds": 0.0,
                                            "steps": 0, "loss": float("nan")} for k in trainers}
    steps = {k: 0 for k in trainers}

    def run(kind: str, n: int, record: bool) -> None:
        a = acc[kind]

        def on_step(step: int, loss: float, stats: torch.Tensor, secs: float) -> None:
            a["loss"] = loss
            if record:
                a["tokens"] += float(stats[1])
                a["flops"] += float(stats[2])
                a["seconds"] += secs
                a["steps"] += 1

        steps[kind] = trainers[kind].train_segment(steps[kind], steps[kind] + n, on_step)

    t0 = time.perf_counter()
    for kind in trainers:
        run(kind, warmup, record=False)
    for _ in range(rounds):  # alternate round by round
        for kind in trainers:
            run(kind, per_round, record=True)
    wall = time.perf_counter() - t0
    peak_after = measure_peak_gemm_flops(2048, repeat=3)
    rows: List[Dict[str, Any]] = []
    for kind, a in acc.items():
        rows.append({"model": kind, "steps": int(a["steps"]), "tokens": int(a["tokens"]),
                     "seconds": a["seconds"], "tokens_per_s": a["tokens"] / a["seconds"],
                     "model_gflops_per_s": a["flops"] / a["seconds"] / 1e9,
                     "mfu": a["flops"] / a["seconds"] / peak,
                     "mfu_pct": 100 * a["flops"] / a["seconds"] / peak, "final_loss": a["loss"]})
    for t in trainers.values():
        t.builder.close()
    print(f"peak fp32 GEMM: {peak / 1e9:.1f} GFLOP/s before, {peak_after / 1e9:.1f} after "
          f"({torch.get_num_threads()} thread(s)); {rounds} alternating rounds of {per_round} "
          f"steps after {warmup} warm-up steps each, {wall:.1f}s")
    print_table(rows, ["model", "steps", "tokens", "seconds", "tokens_per_s",
                       "model_gflops_per_s", "mfu_pct", "final_loss"])
    hstu = rows[0]
    path = write_json("train", {
        "quick": args.quick, "config": {"model": MODEL, "train": TRAIN, "num_items": NUM_ITEMS,
                                        "num_users": NUM_USERS},
        "protocol": {"warmup_steps": warmup, "rounds": rounds, "steps_per_round": per_round,
                     "alternating": True, "pipeline": TRAIN["pipeline"]},
        "tokens_per_s": hstu["tokens_per_s"], "mfu": hstu["mfu"],
        "hstu_over_sasrec_tokens_per_s": rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"],
        "peak_gemm_gflops": peak / 1e9, "peak_gemm_gflops_after": peak_after / 1e9,
        "rows": rows,
    })
    print(f"wrote {path}")
    if env.created:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
