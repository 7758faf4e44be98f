"""Choose trainer settings on VALIDATION only: every variant (a list of ``--set`` overrides) is
trained by the generic CLI (``python -m torchrec_ascend.training``, leave-two-out split) on each
data set, seed and epoch count, and compared with the ``base`` variant on the validation
metrics (HR@10, NDCG@10, HR@200, MRR; the test split is never read by this script).

    python benchmarks/validation_sweep.py --data toys=/data/s3-toys.csv yelpb=/data/yelpb-t.csv \\
        --epochs 3 --seeds 0 --runs-dir runs/sweep \\
        --variant base \\
        --variant sparse_lr_0.2 train.sparse_lr=0.2 \\
        --variant batch128 train.batch_size=128
    python benchmarks/validation_sweep.py ... --name validation_sweep_toys   # JSON name

Each run is a child process, one at a time, one thread, under ``--runs-dir/<data>/<variant>-e<E>-s<S>``;
a run whose ``results.json`` exists is reused, so variants, seeds and data sets can be added by
invoking again.  Writes ``benchmarks/results/<name>.json`` (per run: validation metrics and
tokens/s; per variant and data set: the mean over seeds and its relative difference to ``base``)
and prints the table.  docs/training.md, "Defaults that adapt to the data", says which sweeps
chose which default.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.common import write_json  # noqa: E402

METRICS = ("hr@10", "ndcg@10", "hr@200", "mrr")


def run_dir(runs: str, data: str, variant: str, epochs: float, seed: int) -> str:
    return os.path.join(runs, data, f"{variant}-e{epochs:g}-s{seed}")


def train(csv: str, out: str, epochs: float, seed: int, overrides: Sequence[str],
          cache: str, threads: int = 1) -> Dict[str, object]:
    """One CLI run (reused when ``out/results.json`` exists); its results.json."""
    path = os.path.join(out, "results.json")
    if not os.path.exists(path):
        cmd = [sys.executable, "-m", "torchrec_ascend.training", "--data", csv,
               "--epochs", f"{epochs:g}", "--threads", str(threads), "--no-progress",
               "--set", f"train.seed={seed}", "--set", f"data.cache_dir={cache}", "--out", out]
        for o in overrides:
            cmd += ["--set", o]
        os.makedirs(out, exist_ok=True)
        with open(out + ".log", "w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, "PYTHONPATH": REPO}).returncode
        if rc != 0:
            raise RuntimeError(f"{out}: exit status {rc} (log: {out}.log)")
    with open(path) as f:
        return json.load(f)


def summarise(runs: List[Dict[str, object]], base: str) -> Dict[str, Dict[str, object]]:
    """Per (data, epochs, variant): mean validation metrics over seeds, and mean / base - 1."""
    groups: Dict[tuple, List[Dict[str, object]]] = {}
    for r in runs:
        groups.setdefault((r["data"], r["epochs"], r["variant"]), []).append(r)
    out: Dict[str, Dict[str, object]] = {}
    for (data, epochs, variant), rs in groups.items():
        mean = {m: statistics.fmean(r["valid"][m] for r in rs) for m in METRICS}
        out[f"{data}/e{epochs:g}/{variant}"] = {"data": data, "epochs": epochs,
                                                 "variant": variant, "seeds": len(rs),
                                                 "valid_mean": mean}
    for key, g in out.items():
        b = out.get(f"{g['data']}/e{g['epochs']:g}/{base}")
        if b is not None:
            g["vs_base"] = {m: g["valid_mean"][m] / b["valid_mean"][m] - 1.0
                            for m in METRICS if b["valid_mean"][m] > 0}
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", nargs="+", required=True, metavar="NAME=CSV")
    ap.add_argument("--epochs", type=float, nargs="+", default=[3.0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--variant", nargs="+", action="append", required=True,
                    metavar="NAME [KEY=VALUE ...]", help="a named list of --set overrides")
    ap.add_argument("--base", default="base", help="the variant the others are compared with")
    ap.add_argument("--runs-dir", required=True)
    ap.add_argument("--name", default="validation_sweep")
    args = ap.parse_args(argv)
    data = dict(d.split("=", 1) for d in args.data)
    variants = {v[0]: v[1:] for v in args.variant}
    cache = os.path.join(args.runs_dir, "cache")
    runs = []
    for name, csv in data.items():
        for epochs in args.epochs:
            for seed in args.seeds:
                for variant, overrides in variants.items():
                    out = run_dir(args.runs_dir, name, variant, epochs, seed)
                    res = train(csv, out, epochs, seed, overrides, cache)
                    h = res["models"]["hstu"]
                    runs.append({"data": name, "epochs": epochs, "seed": seed, "variant": variant,
                                 "overrides": list(overrides), "valid": h["valid"],
                                 "tokens_per_s": h["tokens_per_s"], "steps": h["steps"]})
                    v = h["valid"]
                    print(f"{name} e{epochs:g} s{seed} {variant:24s} " +
                          " ".join(f"{m} {v[m]:.4f}" for m in METRICS) +
                          f" tok/s {h['tokens_per_s'] or 0:,.0f}", flush=True)
    summary = summarise(runs, args.base)
    print("\n| data | epochs | variant | seeds | " + " | ".join(METRICS) + " |")
    print("|---|---|---|---|" + "---|" * len(METRICS))
    for g in summary.values():
        rel = g.get("vs_base", {})
        print(f"| {g['data']} | {g['epochs']:g} | {g['variant']} | {g['seeds']} | " +
              " | ".join(f"{g['valid_mean'][m]:.4f}" + (f" ({100 * rel[m]:+.1f}%)" if m in rel
                                                          and g['variant'] != args.base else "")
                         for m in METRICS) + " |")
    write_json(args.name, {"what": "validation metrics (leave-two-out) of trainer variants",
                           "data": data, "variants": variants, "base": args.base,
                           "command": " ".join(sys.argv), "runs": runs, "summary": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
