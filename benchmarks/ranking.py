#!/usr/bin/env python
"""The multi-task ranker next to its baselines, on the same split and features, over seeds.

    python benchmarks/ranking.py                    # the shared KuaiRand data, 3 seeds
    python benchmarks/ranking.py --quick            # synthetic KuaiRand-format data, < 60 s
    python benchmarks/ranking.py --data pure_slice --seeds 0 1 2 3 4

Each data set is an ``examples/kuairand/configs/ranking_<data>.json`` config (the Pure slice:
``ranking_pure_slice``; the 27K sample: ``ranking_sample``); a data set whose files are absent
is skipped.  Every seed trains the HSTU ranker and TorchRec's DLRM in one run
(:func:`torchrec_ascend.training.run_experiment`, one thread); the no-history CTR baseline has
no seed.  Rows ``{"data", "model", "seed", "valid": {task: {"auc", "gauc", "ne", ...}},
"test": {...}, "tokens_per_s", "mfu", "steps"}`` go to ``benchmarks/results/ranking.json``
(``ranking_quick.json`` with ``--quick``), with the means over seeds in ``summary``.  A config
with ``ranking.refit`` (both KuaiRand ones) reports the refit models' test; each row keeps the
refit's steps (``refit``) and the test of the model before it (``test_without_refit``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.common import print_table, write_json  # noqa: E402

DATA = {"pure_slice": "ranking_pure_slice", "sample": "ranking_sample"}
QUICK = ["data.source=synthetic", "data.files=[]", "train.epochs=null", "train.steps=30",
         "train.eval_every=0", "eval.restore_best=false",
         'data.synthetic={"num_users": 300, "num_items": 400, "num_clusters": 10, '
         '"mean_len": 12, "max_len": 40, "random_log_rows": 20, "seed": 1}',
         "data.user_features=null", "data.item_features=null", "ranking.test_days=1",
         "ranking.valid_days=1", "model.embedding_dim=16", "model.max_seq_len=32"]
METRICS = ("auc", "gauc", "ne", "logloss", "positive_rate", "count", "rmse", "mae", "r2")


def _slim(split: Dict[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for task, m in split.items():
        out[task] = {k: m.get(k) for k in METRICS + ("reason",) if k in m} \
            if isinstance(m, dict) else m
    return out


def run_one(data: str, seed: int, quick: bool, out_root: str) -> List[Dict[str, Any]]:
    """The rows (ranker, DLRM, CTR) of one seed of one data set."""
    from examples.kuairand.train import build_config
    from torchrec_ascend.training import run_experiment
    from torchrec_ascend.training.process_group import init_distributed

    sets = [f"train.seed={seed}", "train.threads=1"] + (QUICK if quick else [])
    cfg = build_config(DATA[data], sets)
    if not quick and not all(os.path.exists(f) for f in cfg.data.files):
        print(f"skipped {data}: {cfg.data.files} absent")
        return []
    res = run_experiment(cfg, os.path.join(out_root, f"{data}-s{seed}"), progress=False,
                         env=init_distributed("cpu"), log=lambda _m: None)
    rows = []
    name = "synthetic" if quick else data
    for model, r in res["models"].items():
        refit = r.get("refit")
        rows.append({"data": name, "model": model, "seed": seed, "valid": _slim(r["valid"]),
                     "test": _slim(r["test"]), "tokens_per_s": r["tokens_per_s"],
                     "mfu": r["mfu"], "steps": r["steps"],
                     "restored_step": r.get("restored_step"),
                     "refit": ({k: v for k, v in refit.items() if k != "test_without_refit"}
                               if refit else None),
                     "test_without_refit": (_slim(refit["test_without_refit"]) if refit
                                            else None)})
    for baseline, b in res["baselines"].items():
        rows.append({"data": name, "model": baseline, "seed": None, "valid": _slim(b["valid"]),
                     "test": _slim(b["test"]), "tokens_per_s": None, "mfu": None,
                     "steps": None})
    return rows


def summarize(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Mean (and standard deviation) over seeds of every task's test and validation AUC."""
    out = []
    for data in dict.fromkeys(r["data"] for r in rows):
        for model in dict.fromkeys(r["model"] for r in rows if r["data"] == data):
            rs = [r for r in rows if r["data"] == data and r["model"] == model]
            if model == "ctr":
                rs = rs[:1]  # no seed: the same numbers every time
            for split in ("valid", "test", "test_without_refit"):
                if not rs[0].get(split):
                    continue
                for task, m in rs[0][split].items():
                    if not isinstance(m, dict) or "auc" not in m:
                        continue
                    vals = [r[split][task]["auc"] for r in rs if r[split][task]["auc"] is not None]
                    out.append({"data": data, "model": model, "split": split, "task": task,
                                "auc_mean": float(np.mean(vals)) if vals else None,
                                "auc_std": float(np.std(vals)) if len(vals) > 1 else None,
                                "seeds": len(vals)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", nargs="+", default=None, choices=sorted(DATA),
                    help="data sets (default: every one whose files are present)")
    ap.add_argument("--seeds", nargs="+", type=int, default=None, help="default 0 1 2")
    ap.add_argument("--quick", action="store_true", help="synthetic data, one seed, < 60 s")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    datasets = args.data or (["pure_slice"] if args.quick else sorted(DATA))
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    rows: List[Dict[str, Any]] = []
    tic = time.perf_counter()
    with tempfile.TemporaryDirectory() as out_root:
        for data in datasets:
            for seed in seeds:
                rows += run_one(data, seed, args.quick, out_root)
    summary = summarize(rows)
    print_table([s for s in summary if s["split"] == "test"],
                ["data", "model", "task", "auc_mean", "auc_std", "seeds"])
    path = write_json("ranking_quick" if args.quick else "ranking",
                      {"quick": args.quick, "seeds": seeds, "rows": rows, "summary": summary,
                       "seconds": time.perf_counter() - tic})
    print(f"wrote {path} ({time.perf_counter() - tic:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
