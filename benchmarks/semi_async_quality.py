"""Issue 15's quality check: validation NDCG@10 of semi-async training (staleness 1, 2) vs
synchronous training after the same steps, on the shared KuaiRand-27K sample, in the trainer.

Every run is :class:`torchrec_ascend.training.Trainer` with the KuaiRand example's ``sample``
config (HSTU only), ``--steps`` steps with a validation evaluation (every user, full corpus)
every ``--eval-every`` steps, one process, one thread.  The modes differ only in
``train.pipeline`` / ``train.staleness`` / ``train.sync_warmup_steps``:

* ``sync`` (k = 0), ``k1``, ``k2`` (``semi_async``, staleness 1 / 2 from the first step);
* ``k1w``, ``k2w``: the same with ``--warmup`` synchronous steps first (TorchRec's
  ``start_batch``).

**Paired seeds**: a seed fixes the initial weights, the batch order, the negatives and the
dropout masks of every step, identically in every mode, so each seed gives one paired
relative difference ``d = ndcg_mode / ndcg_sync - 1``.  Reported per mode: the mean of ``d``
over seeds and its 95% Student-t confidence interval, for the NDCG@10 after the last step
(the issue's measure) and for the mean NDCG@10 over the evaluations of the last third of
the steps (``plateau``: less evaluation noise once validation NDCG has converged), and NDCG@200.

Each run is a child process (``--jobs`` at a time); the parent only collects their results
(``--runs-dir``: each run's result is kept there as JSON and reused by a later invocation with
the same mode, seed, steps, evaluation interval and warm-up, so seeds or modes can be added).

    python benchmarks/semi_async_quality.py                    # 1200 steps, seeds 0-2, 5 modes
    python benchmarks/semi_async_quality.py --quick            # 100 steps, seed 0, sync + k1
    python benchmarks/semi_async_quality.py --steps 2400 --modes sync k2 \
        --name semi_async_quality_2400                         # longer, sync vs k = 2
Writes benchmarks/results/semi_async_quality.json (``--name``: NAME.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.common import print_table, write_json  # noqa: E402
from benchmarks.sample_runs import (run_description, sample_absent,  # noqa: E402
                                    sample_config, sample_split, train_valid)

MODES = ("sync", "k1", "k2", "k1w", "k2w")
DEFAULT_MODES = MODES
PLATEAU = 2 / 3  # the plateau: evaluations at steps >= PLATEAU x steps
# two-sided 95% quantiles of Student's t, df = 1 .. 10 (published tables)
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
RESULT = "RESULT "


def mode_overrides(mode: str, warmup: int) -> List[str]:
    """Config overrides of a mode (module docstring)."""
    if mode == "sync":
        return ["train.pipeline=sync", "train.staleness=0"]
    k = int(mode[1])
    over = ["train.pipeline=semi_async", f"train.staleness={k}"]
    if mode.endswith("w"):
        over.append(f"train.sync_warmup_steps={warmup}")
    return over


def child(mode: str, seed: int, steps: int, eval_every: int, warmup: int) -> int:
    """One training run; prints its result as one ``RESULT {json}`` line."""
    env, split = sample_split(steps)
    cfg = sample_config(steps, [f"train.eval_every={eval_every}", f"train.seed={seed}"]
                        + mode_overrides(mode, warmup))
    res = train_valid(cfg, split, env)
    evals = [{"step": e["step"], "ndcg@10": e["ndcg@10"], "ndcg@200": e["ndcg@200"],
              "hr@10": e["hr@10"]} for e in res["evals"]]
    print(RESULT + json.dumps({"mode": mode, "seed": seed, "valid": res["valid"],
                               "evals": evals, "seconds": res["seconds"]}),
          flush=True)
    return 0


def stale_reads(seed: int, steps: int, ks: Sequence[int] = (1, 2)) -> Dict[str, object]:
    """How often a stale lookup reads a row that the skipped updates changed (the Hogwild
    "collisions are rare" premise), from the sample config's first ``steps`` batches: the share
    of the table a step's lookups (sequences + negatives) touch, and for each ``k`` the share of
    a batch's lookups whose row one of the previous ``k`` batches also looked up (and so
    updated: every looked-up row gets a gradient)."""
    import numpy as np

    from torchrec_ascend.training.experiment import prepare_task

    cfg = sample_config(steps, [f"train.seed={seed}", "train.prefetch=false"])
    task = prepare_task(cfg)
    split = task.split
    builder = task.batches("hstu", 0, 1, None)
    rows = [b.kjt.values().numpy() for b in builder.stream(0, steps)]
    builder.close()
    uniq = [np.unique(r) for r in rows]
    out: Dict[str, object] = {
        "steps": steps, "table_rows": int(split.num_items),
        "rows_touched_per_step": float(np.mean([u.size for u in uniq]) / split.num_items)}
    for k in ks:
        shares = [float(np.isin(rows[j], np.concatenate(uniq[j - k:j])).mean())
                  for j in range(k, steps)]
        out[f"lookups_of_rows_updated_in_last_{k}"] = float(np.mean(shares))
    return out


def kept_run(path: Optional[str], mode: str, seed: int) -> Optional[dict]:
    """The result kept at ``path`` by an earlier invocation (``--runs-dir``), else None."""
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        print(f"{mode} seed {seed}: reused {path}", flush=True)
        return dict(json.load(f), reused=path)


def keep_run(path: Optional[str], r: dict, note: str = "") -> None:
    """Keep result ``r`` at ``path`` (``--runs-dir``; nothing when None) and print it."""
    if path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(r, f)
    print(f"{r['mode']} seed {r['seed']}: valid ndcg@10 {r['valid']['ndcg@10']:.4f} "
          f"({r['seconds']:.0f} s)  {note}", flush=True)


def run_all(jobs: List[tuple], args: argparse.Namespace) -> List[dict]:
    """Run every ``(mode, seed)`` as a child process, ``args.jobs`` at a time."""
    pending, running, done = [], [], []

    def cached(mode: str, seed: int) -> Optional[str]:
        if not args.runs_dir:
            return None
        w = args.warmup if mode.endswith("w") else 0
        return os.path.join(args.runs_dir, f"{mode}_seed{seed}_steps{args.steps}_"
                                           f"eval{args.eval_every}_warmup{w}.json")

    for mode, seed in jobs:
        kept = kept_run(cached(mode, seed), mode, seed)
        if kept is not None:
            done.append(kept)
        else:
            pending.append((mode, seed))
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    while pending or running:
        while pending and len(running) < args.jobs:
            mode, seed = pending.pop(0)
            cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, str(seed),
                   "--steps", str(args.steps), "--eval-every", str(args.eval_every),
                   "--warmup", str(args.warmup)]
            running.append(((mode, seed), subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                                           stderr=subprocess.PIPE, text=True)))
        time.sleep(0.5)
        for item in list(running):
            (mode, seed), proc = item
            if proc.poll() is None:
                continue
            out, err = proc.communicate()
            running.remove(item)
            lines = [ln for ln in out.splitlines() if ln.startswith(RESULT)]
            if proc.returncode != 0 or not lines:
                raise RuntimeError(f"run {mode} seed {seed} failed ({proc.returncode}):\n"
                                   f"{err[-3000:]}")
            done.append(json.loads(lines[-1][len(RESULT):]))
            keep_run(cached(mode, seed), done[-1], lines[-1])
    return done


def paired(values: Dict[str, Dict[int, float]], mode: str,
           baseline: str = "sync") -> Optional[Dict[str, object]]:
    """Mean, sd and 95% t-interval of ``values[mode][s] / values[baseline][s] - 1`` over
    seeds."""
    seeds = sorted(set(values.get(mode, {})) & set(values.get(baseline, {})))
    if not seeds:
        return None
    d = [values[mode][s] / values[baseline][s] - 1 for s in seeds]
    mean = statistics.mean(d)
    out: Dict[str, object] = {"mean": mean, "per_seed": dict(zip(map(str, seeds), d)),
                              "seeds": len(seeds)}
    if len(d) > 1:
        sd = statistics.stdev(d)
        half = T975[len(d) - 2] * sd / math.sqrt(len(d))
        out.update(sd=sd, ci95=[mean - half, mean + half])
    return out


def summarize(runs: List[dict], steps: int, baseline: str = "sync") -> Dict[str, object]:
    """Per-mode paired relative differences (against mode ``baseline``) of final / plateau
    NDCG@10 and final NDCG@200."""
    plateau_from = PLATEAU * steps
    final10: Dict[str, Dict[int, float]] = {}
    final200: Dict[str, Dict[int, float]] = {}
    plateau10: Dict[str, Dict[int, float]] = {}
    for r in runs:
        m, s = r["mode"], r["seed"]
        final10.setdefault(m, {})[s] = r["valid"]["ndcg@10"]
        final200.setdefault(m, {})[s] = r["valid"]["ndcg@200"]
        late = [e["ndcg@10"] for e in r["evals"] if e["step"] >= plateau_from]
        plateau10.setdefault(m, {})[s] = statistics.mean(late)
    out: Dict[str, object] = {"values": {"final_ndcg@10": final10, "plateau_ndcg@10": plateau10,
                                         "final_ndcg@200": final200}}
    for name, table in (("final_ndcg@10", final10), ("plateau_ndcg@10", plateau10),
                        ("final_ndcg@200", final200)):
        out[name] = {m: paired(table, m, baseline) for m in table if m != baseline}
        base = list(table.get(baseline, {}).values())
        if len(base) > 1:
            out[name][f"{baseline}_seed_relative_std"] = (statistics.stdev(base)
                                                          / statistics.mean(base))
    return out


def difference_rows(summary: Dict[str, object], modes: Sequence[str],
                    baseline: str = "sync") -> List[Dict[str, object]]:
    """The printed table: per mode (not ``baseline``), each measure's mean relative difference
    and 95% interval, in percent."""
    rows = []
    for m in modes:
        if m == baseline:
            continue
        row: Dict[str, object] = {"mode": m}
        for name in ("final_ndcg@10", "plateau_ndcg@10", "final_ndcg@200"):
            p = summary[name][m]  # type: ignore[index]
            ci = p.get("ci95")
            row[name] = (f"{100 * p['mean']:+.1f}%" +
                         (f" [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]" if ci else ""))
        rows.append(row)
    return rows


def run_records(runs: List[dict]) -> List[Dict[str, object]]:
    """The JSON's ``runs``: each run's mode, seed, seconds, reuse, final and periodic metrics."""
    return [{"mode": r["mode"], "seed": r["seed"], "seconds": round(r["seconds"], 1),
             "reused_from_runs_dir": "reused" in r, "valid": r["valid"], "evals": r["evals"]}
            for r in runs]


def write_result(args: argparse.Namespace, seeds: Sequence[int], modes: Sequence[str],
                 summary: Dict[str, object], runs: List[dict], load: float, t0: float,
                 config: Dict[str, object], extra: Optional[Dict[str, object]] = None) -> str:
    """Write ``benchmarks/results/<args.name>.json``: ``extra``, the summary, the runs, the
    configuration (``config`` added to the shared part), load averages and seconds."""
    path = write_json(args.name, {
        **(extra or {}), **summary, "runs": run_records(runs),
        "config": {**run_description(args.steps, seeds, args.quick),
                   "eval_every": args.eval_every, "modes": list(modes), **config,
                   "plateau": f"evaluations at steps >= {PLATEAU * args.steps:g}"},
        "load_average_before": round(load, 2), "load_average_after": round(os.getloadavg()[0], 2),
        "seconds": round(time.perf_counter() - t0, 1)})
    print(f"wrote {path}")
    return path


def quality_arguments(ap: argparse.ArgumentParser, quick_modes: str, name: str) -> None:
    """The options every paired-seed quality script shares (``--quick`` runs ``quick_modes``;
    ``name``: the default result file)."""
    ap.add_argument("--quick", action="store_true", help=f"100 steps, seed 0, {quick_modes}")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default 1200)")
    ap.add_argument("--eval-every", type=int, default=None, help="default 100 (quick: 50)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2")
    ap.add_argument("--runs-dir", default=None, help="keep / reuse each run's result here")
    ap.add_argument("--name", default=name,
                    help=f"result file benchmarks/results/NAME.json (default {name})")


def schedule(args: argparse.Namespace) -> List[int]:
    """Fill in ``args.steps`` / ``args.eval_every`` (quick or full defaults); the seeds."""
    args.steps = args.steps or (100 if args.quick else 1200)
    args.eval_every = args.eval_every or (50 if args.quick else 100)
    return args.seeds or ([0] if args.quick else [0, 1, 2])


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    quality_arguments(ap, "sync and k1", "semi_async_quality")
    ap.add_argument("--modes", nargs="+", default=None, choices=MODES,
                    help=f"default {' '.join(DEFAULT_MODES)}")
    ap.add_argument("--warmup", type=int, default=200,
                    help="train.sync_warmup_steps of k1w / k2w (default 200)")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "SEED"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    seeds = schedule(args)
    if args.child:
        return child(args.child[0], int(args.child[1]), args.steps, args.eval_every,
                     args.warmup)
    modes = args.modes or (["sync", "k1"] if args.quick else list(DEFAULT_MODES))
    if "sync" not in modes:
        ap.error("--modes: needs sync (every difference is paired with it)")
    if args.jobs < 1 or args.steps < 1 or args.eval_every < 1 or args.warmup < 0:
        ap.error("--jobs, --steps, --eval-every must be >= 1 and --warmup >= 0")
    if sample_absent(args.steps):
        return 0
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    collisions = stale_reads(seeds[0], min(args.steps, 200))
    print(f"stale reads: {collisions}", flush=True)
    runs = run_all([(m, s) for s in seeds for m in modes], args)
    runs.sort(key=lambda r: (r["seed"], modes.index(r["mode"])))
    summary = summarize(runs, args.steps)
    print_table(difference_rows(summary, modes))
    write_result(args, seeds, modes, summary, runs, load, t0,
                 {"sync_warmup_steps": args.warmup, "jobs": args.jobs},
                 {"ndcg_rel_diff": {m[1]: summary["final_ndcg@10"][m]["mean"]  # type: ignore
                                    for m in ("k1", "k2") if m in modes},
                  "goal_abs_rel_diff": 0.02, "stale_reads": collisions})
    return 0


if __name__ == "__main__":
    sys.exit(main())
