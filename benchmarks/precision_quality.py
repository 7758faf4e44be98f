"""Issue 18's quality check: validation NDCG@10 of ``train.precision=bf16`` (autocast mixed
precision, fp32 master weights) vs ``fp32`` after the same steps, on the shared KuaiRand-27K
sample, in the trainer.

Every run is the KuaiRand example's ``sample`` config (HSTU only, ``--steps`` steps, no periodic
evaluation), one process, one thread (``benchmarks/sample_runs.py``); the two sides differ only in
``train.precision``, run alternately (fp32 first for even seeds, bf16 first for odd ones).  The
final validation metrics are on every user (full corpus).  ``rel_diff`` = bf16 / fp32 - 1 of the
mean over seeds (goal: |rel_diff| <= 2%), per seed too; the fp32 spread over seeds is printed
next to it (what seed noise alone does), and NDCG@200 (~7x more hits, less noisy) the same way.

    python benchmarks/precision_quality.py                 # 400 steps, seeds 0 1 2
    python benchmarks/precision_quality.py --quick         # 100 steps, seed 0
    python benchmarks/precision_quality.py --bf16-engine fp32   # bf16 runs, HSTU attention widened
Writes benchmarks/results/precision_quality.json (``precision_quality_<engine>.json`` with
``--bf16-engine``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Dict, List

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.common import print_table, write_json  # noqa: E402
from benchmarks.sample_runs import (rel, run_description, sample_config,  # noqa: E402
                                    sample_split, train_valid)

SIDES = ("fp32", "bf16")
METRICS = ("ndcg@10", "hr@10", "ndcg@200")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100 steps, seed 0")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default 400)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2")
    ap.add_argument("--bf16-engine", default=None,
                    help="force the csrc HSTU attention engine of the bf16 runs (ops.hstu_engines.cpu_engines: e.g. "
                         "amx_bf16, avx512_bf16, fp32 = widened); writes precision_quality_<engine>.json")
    args = ap.parse_args()
    steps = args.steps or (100 if args.quick else 400)
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])

    from torchrec_ascend import device as _device
    from torchrec_ascend.ops.hstu_engines import cpu_engine, set_cpu_engine

    if args.bf16_engine:
        set_cpu_engine(torch.bfloat16, args.bf16_engine)

    got = sample_split(steps)
    if got is None:
        return 0
    env, split = got
    t0 = time.perf_counter()
    rows: List[Dict[str, object]] = []
    valid: Dict[str, Dict[str, Dict[str, float]]] = {m: {s: {} for s in SIDES} for m in METRICS}
    for seed in seeds:
        for side in (SIDES if seed % 2 == 0 else SIDES[::-1]):
            cfg = sample_config(steps, [f"train.seed={seed}", f"train.precision={side}"])
            res = train_valid(cfg, split, env)
            for m in METRICS:
                valid[m][side][str(seed)] = res["valid"][m]
            rows.append({"seed": seed, "precision": side, "compute_dtype": res["compute_dtype"],
                         **{f"valid_{m}": round(res["valid"][m], 5) for m in METRICS},
                         "tokens_per_s": round(res["tokens_per_s"] or 0.0, 1),
                         "seconds": round(res["seconds"], 1)})
            print(rows[-1], flush=True)
    mean = {m: {s: statistics.mean(valid[m][s].values()) for s in SIDES} for m in METRICS}
    rel_diff = {m: rel(mean[m]["bf16"], mean[m]["fp32"]) for m in METRICS}
    per_seed = {m: {str(s): rel(valid[m]["bf16"][str(s)], valid[m]["fp32"][str(s)])
                    for s in seeds} for m in METRICS}
    spread = {m: (max(valid[m]["fp32"].values()) / min(valid[m]["fp32"].values()) - 1
                  if len(seeds) > 1 else None) for m in METRICS}
    print_table(rows)
    for m in METRICS:
        print(f"{m}: mean fp32 {mean[m]['fp32']:.5f}, bf16 {mean[m]['bf16']:.5f}, "
              f"rel_diff {rel_diff[m]:+.4f}; per seed {per_seed[m]}; fp32 seed spread {spread[m]}")
    path = write_json("precision_quality" + (f"_{args.bf16_engine}" if args.bf16_engine else ""), {
        "rel_diff": rel_diff, "goal_abs_rel_diff": 0.02,
        "meets_goal": abs(rel_diff["ndcg@10"]) <= 0.02,
        "mean_valid": mean, "valid": valid, "rel_diff_per_seed": per_seed,
        "fp32_seed_spread": spread, "runs": rows,
        "gemm_capability": _device.gemm_capability("cpu").as_dict(),
        "hstu_cpu_engines": {"float32": cpu_engine(torch.float32), "bfloat16": cpu_engine(torch.bfloat16)},
        "config": run_description(steps, seeds, args.quick),
        "seconds": round(time.perf_counter() - t0, 1)})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
