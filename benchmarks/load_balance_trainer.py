"""Issue 14's overhead goal inside the trainer: the all_to_all balancer's time as a share of the
trainer's full step (``train.balance = "all_to_all"``, 2 gloo ranks, one thread each).

The KuaiRand example's ``demo`` config (synthetic KuaiRand-format data, HSTU, batch 64 per
rank, 256 negatives), ``train.pipeline = sparse_dist`` (the default).  Per step and rank:

* ``step_s``: the wall time of ``pipeline.progress()`` (data, balance, input dist, forward,
  backward, optimizer) -- what ``Trainer.train_segment`` times;
* ``balance_s``: the ``AllToAllBalancer.balance`` call inside the batch builder (two
  all_gathers + plan + one all_to_all of items / timestamps / action bits / log q / users), on
  its own process group (``BatchBuilder.last_balance_s``);
* ``restore_s``: one ``BalancedBatch.restore`` of a per-sample tensor (what a metric in the
  original order would need; the trainer's loss does not need it), timed after the step.

``overhead_fraction_trainer`` = median over steps of (balance_s + restore_s) / (step_s +
restore_s), the larger of the two ranks; ``..._balance_only`` without the restore.  Wall times:
a balancer waiting for the slower rank inside its all_gather counts as overhead.
``..._cpu_time``: the same share in the main thread's CPU time (``time.thread_time``: balance +
restore over the thread's CPU time per step), which a waiting collective does not inflate.

    python benchmarks/load_balance_trainer.py            # 60 measured steps
    python benchmarks/load_balance_trainer.py --quick    # 20 measured steps (< 60 s)
Writes benchmarks/results/load_balance_trainer.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.common import print_table, write_json  # noqa: E402
from torchrec_ascend.testing.multiprocess import run_multiprocess  # noqa: E402

WARMUP = 5


def _worker(rank: int, world: int, steps: int, out: str) -> Dict[str, List[float]]:
    import torch

    from examples.kuairand.train import build_config
    from torchrec_ascend.training import Trainer
    from torchrec_ascend.training.distributed import init_distributed
    from torchrec_ascend.training.experiment import prepare_split

    torch.set_num_threads(1)
    env = init_distributed("cpu")
    cfg = build_config("demo", [f"train.steps={WARMUP + steps}", "train.balance=all_to_all",
                                "train.eval_every=0", "train.checkpoint_every=0",
                                'models=["hstu"]', "train.threads=1"])
    split = prepare_split(cfg)
    trainer = Trainer(cfg, split, env, out, "hstu", peak_flops=1e9, progress=False,
                      log=lambda _m: None)
    rec: Dict[str, List[float]] = {k: [] for k in ("step_s", "balance_s", "restore_s",
                                                   "step_cpu_s", "balance_cpu_s",
                                                   "restore_cpu_s")}
    builder = trainer.builder
    balance = builder.balancer.balance
    cpu = {"balance": 0.0, "mark": time.thread_time()}

    def timed_balance(*a, **kw):  # this thread's CPU time inside the balancer
        tic = time.thread_time()
        try:
            return balance(*a, **kw)
        finally:
            cpu["balance"] = time.thread_time() - tic

    builder.balancer.balance = timed_balance

    def on_step(n: int, _loss: float, _stats, secs: float) -> None:
        bb = builder.last_balanced
        per_sample = bb.sample_fields["users"].to(torch.float32)
        tic, tic_cpu = time.perf_counter(), time.thread_time()
        bb.restore(per_sample)
        restore, restore_cpu = time.perf_counter() - tic, time.thread_time() - tic_cpu
        now = time.thread_time()
        if n > WARMUP:
            rec["step_s"].append(secs)
            rec["balance_s"].append(float(builder.last_balance_s))
            rec["restore_s"].append(restore)
            rec["step_cpu_s"].append(now - cpu["mark"])  # the main thread's CPU since last step
            rec["balance_cpu_s"].append(cpu["balance"])
            rec["restore_cpu_s"].append(restore_cpu)
        cpu["mark"] = now

    trainer.train_segment(0, WARMUP + steps, on_step)
    builder.close()
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="20 measured steps")
    args = ap.parse_args()
    steps = 20 if args.quick else 60
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        ranks = run_multiprocess(_worker, 2, (steps, out))
    rows, fr, fr_b, fr_cpu = [], [], [], []
    for r, rec in enumerate(ranks):
        full = [(b + s) / (t + s) for b, s, t in zip(rec["balance_s"], rec["restore_s"],
                                                     rec["step_s"])]
        bal = [b / t for b, t in zip(rec["balance_s"], rec["step_s"])]
        cpu = [(b + s) / t for b, s, t in zip(rec["balance_cpu_s"], rec["restore_cpu_s"],
                                              rec["step_cpu_s"])]
        fr.append(statistics.median(full))
        fr_b.append(statistics.median(bal))
        fr_cpu.append(statistics.median(cpu))
        rows.append({"rank": r, "step_ms": round(1e3 * statistics.median(rec["step_s"]), 2),
                     "balance_ms": round(1e3 * statistics.median(rec["balance_s"]), 3),
                     "restore_ms": round(1e3 * statistics.median(rec["restore_s"]), 3),
                     "overhead": round(fr[-1], 4), "balance_only": round(fr_b[-1], 4),
                     "overhead_cpu": round(fr_cpu[-1], 4)})
    print_table(rows)
    payload = {"overhead_fraction_trainer": max(fr),
               "overhead_fraction_trainer_balance_only": max(fr_b),
               "overhead_fraction_trainer_cpu_time": max(fr_cpu),
               "goal_overhead_fraction": 0.02, "per_rank": rows,
               "config": {"config": "examples/kuairand/configs/demo.json", "models": ["hstu"],
                          "world_size": 2, "threads_per_rank": 1, "pipeline": "sparse_dist",
                          "balance": "all_to_all", "warmup_steps": WARMUP,
                          "measured_steps": steps, "quick": args.quick},
               "seconds": round(time.perf_counter() - t0, 1)}
    print(f"overhead_fraction_trainer {max(fr):.4f} (balance only {max(fr_b):.4f}; main-thread "
          f"CPU time {max(fr_cpu):.4f}); goal 0.02")
    print(f"wrote {write_json('load_balance_trainer', payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
