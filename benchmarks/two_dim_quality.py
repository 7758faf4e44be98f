"""What 2-D parallelism's replica drift does to model quality: validation NDCG@10 of the
KuaiRand example's HSTU trained on world 4 = 2 hosts x 2 devices (``LOCAL_WORLD_SIZE=2``,
gloo, one thread per rank) with the item table

* ``1d``: row-wise sharded over all 4 ranks (``train.planner=hierarchical``), the baseline;
* ``2d_N``: row-wise sharded inside each host and replicated across the 2 hosts
  (``train.planner=hierarchical_2d``), the replicas (weights and row-wise Adagrad state)
  averaged every ``N`` steps (``train.sync_every=N``): each host's copy steps with its own
  host's lookups in between (docs/planner.md, "2-D parallelism").

Every run is :class:`torchrec_ascend.training.Trainer` with the ``sample`` config (HSTU only),
``--batch-size`` sequences per rank (default 8: a global batch of 32, the single-process
studies' batch), ``--steps`` steps, a validation evaluation (every user, full corpus; of the
replicas' average in 2-D, which leaves each host's copy as it was) every ``--eval-every``
steps.  **Paired seeds**: a seed fixes the initial weights, the batch order, the negatives and
the dropout masks of every rank and step, identically in every mode.  Reported per mode: the
mean relative difference to ``1d`` over seeds and its 95% Student-t interval, for the final
NDCG@10, the plateau NDCG@10 (mean over the evaluations of the last third) and the final
NDCG@200 (``benchmarks/semi_async_quality.py``'s measures).

    python benchmarks/two_dim_quality.py                      # 1200 steps, seeds 0-2
    python benchmarks/two_dim_quality.py --quick              # 100 steps, seed 0, 1d + 2d_10
    python benchmarks/two_dim_quality.py --modes 1d 2d_1 2d_100 --seeds 0 1 --runs-dir DIR
Writes benchmarks/results/two_dim_quality.json (``--name``: NAME.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.common import print_table, write_json  # noqa: E402
from benchmarks.sample_runs import run_description, sample_config  # noqa: E402
from benchmarks.semi_async_quality import PLATEAU, summarize  # noqa: E402

BASELINE = "1d"
DEFAULT_MODES = ("1d", "2d_1", "2d_10", "2d_100", "2d_1000")
HOSTS, DEVICES_PER_HOST = 2, 2


def mode_overrides(mode: str) -> List[str]:
    """Config overrides of a mode (module docstring)."""
    if mode == BASELINE:
        return ["train.planner=hierarchical"]
    prefix, _, every = mode.partition("_")
    if prefix != "2d" or not every.isdigit() or int(every) < 1:
        raise ValueError(f"mode {mode!r}: expected '1d' or '2d_N' with N >= 1")
    return ["train.planner=hierarchical_2d", f"train.sync_every={int(every)}"]


def _rank_run(rank: int, world: int, overrides: List[str], steps: int) -> Optional[dict]:
    """One rank of a run (spawned by :func:`run_one`); rank 0 returns the result."""
    import torch

    from benchmarks.sample_runs import train_valid
    from torchrec_ascend.training.distributed import init_distributed
    from torchrec_ascend.training.experiment import prepare_split

    torch.set_num_threads(1)
    env = init_distributed("cpu")
    cfg = sample_config(steps, overrides)
    res = train_valid(cfg, prepare_split(cfg), env)
    if rank != 0:
        return None
    evals = [{"step": e["step"], "ndcg@10": e["ndcg@10"], "ndcg@200": e["ndcg@200"],
              "hr@10": e["hr@10"]} for e in res["evals"]]
    return {"valid": res["valid"], "evals": evals, "seconds": res["seconds"],
            "world_size": res["world_size"]}


def run_one(mode: str, seed: int, args: argparse.Namespace) -> dict:
    """Train one (mode, seed) on 4 spawned ranks; its result (or the kept one, ``--runs-dir``)."""
    from torchrec_ascend.testing.multiprocess import run_multiprocess

    path = None
    if args.runs_dir:
        path = os.path.join(args.runs_dir, f"{mode}_seed{seed}_steps{args.steps}_"
                                           f"eval{args.eval_every}_batch{args.batch_size}.json")
        if os.path.exists(path):
            with open(path) as f:
                print(f"{mode} seed {seed}: reused {path}", flush=True)
                return dict(json.load(f), reused=path)
    overrides = [f"train.eval_every={args.eval_every}", f"train.seed={seed}",
                 f"train.batch_size={args.batch_size}", "train.threads=1",
                 *mode_overrides(mode)]
    out = run_multiprocess(_rank_run, HOSTS * DEVICES_PER_HOST, (overrides, args.steps),
                           local_world_size=DEVICES_PER_HOST)[0]
    r = {"mode": mode, "seed": seed, **out}
    if path:
        os.makedirs(args.runs_dir, exist_ok=True)
        with open(path, "w") as f:
            json.dump(r, f)
    print(f"{mode} seed {seed}: valid ndcg@10 {r['valid']['ndcg@10']:.4f} "
          f"({r['seconds']:.0f} s)", flush=True)
    return r


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100 steps, seed 0, 1d and 2d_10")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default 1200)")
    ap.add_argument("--eval-every", type=int, default=None, help="default 100 (quick: 50)")
    ap.add_argument("--batch-size", type=int, default=8, help="sequences per rank (default 8)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2")
    ap.add_argument("--modes", nargs="+", default=None,
                    help=f"1d and 2d_N (default {' '.join(DEFAULT_MODES)})")
    ap.add_argument("--runs-dir", default=None, help="keep / reuse each run's result here")
    ap.add_argument("--name", default="two_dim_quality",
                    help="result file benchmarks/results/NAME.json (default two_dim_quality)")
    args = ap.parse_args(argv)
    args.steps = args.steps or (100 if args.quick else 1200)
    args.eval_every = args.eval_every or (50 if args.quick else 100)
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    modes = args.modes or (["1d", "2d_10"] if args.quick else list(DEFAULT_MODES))
    if BASELINE not in modes:
        ap.error(f"--modes: needs {BASELINE} (every difference is paired with it)")
    for m in modes:
        try:
            mode_overrides(m)
        except ValueError as e:
            ap.error(f"--modes: {e}")
    if args.steps < 1 or args.eval_every < 1 or args.batch_size < 1:
        ap.error("--steps, --eval-every and --batch-size must be >= 1")
    base = sample_config(args.steps)
    if not os.path.exists(base.data.files[0]):
        print(f"skipped: {base.data.files[0]} is absent")
        return 0
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    runs = [run_one(m, s, args) for s in seeds for m in modes]
    summary = summarize(runs, args.steps, baseline=BASELINE)
    rows = []
    for m in modes:
        if m == BASELINE:
            continue
        row: Dict[str, object] = {"mode": m}
        for name in ("final_ndcg@10", "plateau_ndcg@10", "final_ndcg@200"):
            p = summary[name][m]  # type: ignore[index]
            ci = p.get("ci95")
            row[name] = (f"{100 * p['mean']:+.1f}%" +
                         (f" [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]" if ci else ""))
        rows.append(row)
    print_table(rows)
    path = write_json(args.name, {
        **summary,
        "runs": [{"mode": r["mode"], "seed": r["seed"], "seconds": round(r["seconds"], 1),
                  "reused_from_runs_dir": "reused" in r, "valid": r["valid"],
                  "evals": r["evals"]} for r in runs],
        "config": {**run_description(args.steps, seeds, args.quick),
                   "world_size": HOSTS * DEVICES_PER_HOST, "hosts": HOSTS,
                   "devices_per_host": DEVICES_PER_HOST, "batch_size_per_rank": args.batch_size,
                   "eval_every": args.eval_every, "modes": modes, "baseline": BASELINE,
                   "plateau": f"evaluations at steps >= {PLATEAU * args.steps:g}"},
        "load_average_before": round(load, 2), "load_average_after": round(os.getloadavg()[0], 2),
        "seconds": round(time.perf_counter() - t0, 1)})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
