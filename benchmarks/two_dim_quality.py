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
import os
import sys
import time
from typing import List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.common import print_table  # noqa: E402
from benchmarks.sample_runs import sample_absent, sample_config  # noqa: E402
from benchmarks.semi_async_quality import (difference_rows, keep_run,  # noqa: E402
                                           kept_run, quality_arguments, schedule,
                                           summarize, write_result)

BASELINE = "1d"
DEFAULT_MODES = ("1d", "2d_1", "2d_10", "2d_100", "2d_1000")
HOSTS, DEVICES_PER_HOST = 2, 2


def mode_overrides(mode: str) -> List[str]:
    """Config overrides of a mode (module docstring)."""
    if mode == BASELINE:
        return ["train.planner=hierarchical"]
    parts = mode.split("_")
    merge = parts.pop() if len(parts) == 3 else "mean"
    if (len(parts) != 2 or parts[0] != "2d" or not parts[1].isdigit() or int(parts[1]) < 1
            or merge not in ("mean", "sum")):
        raise ValueError(f"mode {mode!r}: expected '1d', '2d_N' or '2d_N_sum' with N >= 1")
    return ["train.planner=hierarchical_2d", f"train.sync_every={int(parts[1])}",
            f"train.replica_merge={merge}"]


def _rank_run(rank: int, world: int, overrides: List[str], steps: int) -> Optional[dict]:
    """One rank of a run (spawned by :func:`run_one`); rank 0 returns the result."""
    import torch

    from benchmarks.sample_runs import train_valid
    from torchrec_ascend.training.process_group import init_distributed
    from torchrec_ascend.training.experiment import prepare_task

    torch.set_num_threads(1)
    env = init_distributed("cpu")
    cfg = sample_config(steps, overrides)
    res = train_valid(cfg, prepare_task(cfg).split, env)
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
    kept = kept_run(path, mode, seed)
    if kept is not None:
        return kept
    overrides = [f"train.eval_every={args.eval_every}", f"train.seed={seed}",
                 f"train.batch_size={args.batch_size}", "train.threads=1",
                 *mode_overrides(mode)]
    out = run_multiprocess(_rank_run, HOSTS * DEVICES_PER_HOST, (overrides, args.steps),
                           local_world_size=DEVICES_PER_HOST)[0]
    r = {"mode": mode, "seed": seed, **out}
    keep_run(path, r)
    return r


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    quality_arguments(ap, "1d and 2d_10", "two_dim_quality")
    ap.add_argument("--batch-size", type=int, default=8, help="sequences per rank (default 8)")
    ap.add_argument("--modes", nargs="+", default=None,
                    help=f"1d and 2d_N (default {' '.join(DEFAULT_MODES)})")
    args = ap.parse_args(argv)
    seeds = schedule(args)
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
    if sample_absent(args.steps):
        return 0
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    runs = [run_one(m, s, args) for s in seeds for m in modes]
    summary = summarize(runs, args.steps, baseline=BASELINE)
    print_table(difference_rows(summary, modes, BASELINE))
    write_result(args, seeds, modes, summary, runs, load, t0,
                 {"world_size": HOSTS * DEVICES_PER_HOST, "hosts": HOSTS,
                  "devices_per_host": DEVICES_PER_HOST, "batch_size_per_rank": args.batch_size,
                  "baseline": BASELINE})
    return 0


if __name__ == "__main__":
    sys.exit(main())
