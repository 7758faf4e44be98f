"""Issue 15's quality check: validation NDCG@10 of semi-async training (staleness 1, 2) vs
synchronous training after the same steps, on the shared KuaiRand-27K sample, in the trainer.

Every run is :class:`torchrec_ascend.training.Trainer` with the KuaiRand example's ``sample``
config (HSTU only; ``--steps`` steps, no periodic evaluation), one process, one thread; the
modes differ only in ``train.pipeline`` / ``train.staleness``: ``sync`` (k = 0) and
``semi_async`` with k = 1, 2.  The final validation NDCG@10 is on every user (full corpus).
Seed noise: each seed of ``--seeds`` is a separate sync run, so the spread of sync over seeds
is printed next to the staleness effect (``rel_diff`` = ndcg_k / ndcg_sync - 1, same seed,
mean over seeds); NDCG@200 (less noisy: ~7x more hits) is reported the same way.

    python benchmarks/semi_async_quality.py                 # 400 steps, seeds 0-4
    python benchmarks/semi_async_quality.py --quick         # 100 steps, seed 0 (< 2 min)
Writes benchmarks/results/semi_async_quality.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.common import print_table, write_json  # noqa: E402
from benchmarks.sample_runs import (run_description, sample_config,  # noqa: E402
                                    sample_split, train_valid)

MODES = (("sync", 0), ("semi_async", 1), ("semi_async", 2))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100 steps, seed 0")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default 400)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2 3 4")
    args = ap.parse_args()
    steps = args.steps or (100 if args.quick else 400)
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2, 3, 4])

    got = sample_split(steps)
    if got is None:
        return 0
    env, split = got
    t0 = time.perf_counter()
    rows: List[Dict[str, object]] = []
    ndcg: Dict[str, Dict[str, float]] = {}
    ndcg200: Dict[str, Dict[str, float]] = {}
    for seed in seeds:
        for pipeline, k in MODES:
            cfg = sample_config(steps, [f"train.seed={seed}", f"train.pipeline={pipeline}",
                                        f"train.staleness={k}"])
            res = train_valid(cfg, split, env)
            ndcg.setdefault(str(k), {})[str(seed)] = res["valid"]["ndcg@10"]
            ndcg200.setdefault(str(k), {})[str(seed)] = res["valid"]["ndcg@200"]
            rows.append({"seed": seed, "mode": f"{pipeline} k={k}",
                         "valid_ndcg@10": round(res["valid"]["ndcg@10"], 5),
                         "valid_hr@10": round(res["valid"]["hr@10"], 5),
                         "valid_ndcg@200": round(res["valid"]["ndcg@200"], 5),
                         "seconds": round(res["seconds"], 1)})
            print(rows[-1], flush=True)
    def rel_diff(table: Dict[str, Dict[str, float]]) -> Dict[str, float]:
        return {k: statistics.mean(table[k][s] / table["0"][s] - 1 for s in table[k])
                for k in ("1", "2")}

    def spread(table: Dict[str, Dict[str, float]]) -> object:
        vals = list(table["0"].values())
        return (max(vals) / min(vals) - 1) if len(vals) > 1 else None

    rel, rel200 = rel_diff(ndcg), rel_diff(ndcg200)
    seed_spread = spread(ndcg)
    sync_sd = (statistics.stdev(ndcg["0"].values()) / statistics.mean(ndcg["0"].values())
               if len(seeds) > 1 else None)
    print_table(rows)
    print(f"ndcg_rel_diff (mean over seeds): k=1 {rel['1']:+.4f}, k=2 {rel['2']:+.4f}; "
          f"sync seed spread (max/min - 1): {seed_spread}, relative std {sync_sd}; "
          f"ndcg@200: k=1 {rel200['1']:+.4f}, k=2 {rel200['2']:+.4f}, spread {spread(ndcg200)}")
    path = write_json("semi_async_quality", {
        "ndcg_rel_diff": rel, "valid_ndcg@10": ndcg, "sync_seed_spread": seed_spread,
        "sync_seed_relative_std": sync_sd, "ndcg200_rel_diff": rel200,
        "valid_ndcg@200": ndcg200, "sync_seed_spread_ndcg200": spread(ndcg200),
        "goal_abs_rel_diff": 0.02, "runs": rows,
        "config": run_description(steps, seeds, args.quick),
        "seconds": round(time.perf_counter() - t0, 1)})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
