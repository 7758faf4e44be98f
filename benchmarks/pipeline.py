"""Train pipelines side by side: sync vs sparse_dist vs semi_async, and scaling from 1 to 2 ranks.

Workload: :class:`torchrec_ascend.testing.pipeline_workload.HSTUModel` (one row-wise sharded
item EmbeddingCollection, fused Adam; HSTU encoder 2 layers, dim 64; in-batch next-item softmax;
Adam on the dense part), random-walk item sequences of length 16..64, 16 sequences per rank.
2 gloo ranks on cpu, one thread each.

1. **Modes** (one 2-rank run per alternation): three models (sync and sparse_dist under our
   DMP with staleness 0 — TorchRec's DMP exactly — and semi_async under staleness ``k``, default
   1) are built once; every round runs ``steps`` steps (2; quick: 1) of each mode, the order
   rotating round by round, after a barrier: the modes alternate every step or two, so a
   change of machine load hits them alike.  ``step_s`` = median over rounds of the round's
   mean step time on rank 0; ``busy_fraction`` and ``stages_ms`` are the means of the
   pipelines' own per-step records (:mod:`torchrec_ascend.distributed.train_pipeline.stages`).
2. **Scaling**: the same per-rank batch on 1 rank (a separate 1-process run, alternated with
   the 2-rank runs), sync and semi_async; ``scaling_efficiency`` = tokens/s on 2 ranks /
   (2 x tokens/s on 1 rank).
3. ``pipeline.png``: the semi_async timeline on rank 0 (one lane per stage) of 4 consecutive
   steps run right after its warmup (not counted in the timings).

``cpu_ms_per_step``: rank 0's CPU time per step (all its threads, and the compute thread
alone) and its share of the wall time, per mode: whether a faster schedule had idle CPU to use.
``ndcg_rel_diff`` is copied from ``benchmarks/results/semi_async_quality.json`` (the trainer
on the KuaiRand sample; this synthetic workload has no validation split).

    python benchmarks/pipeline.py            # full
    python benchmarks/pipeline.py --quick    # < 60 s
    python benchmarks/pipeline.py --ndcg-only   # re-copy ndcg_rel_diff only
Writes benchmarks/results/pipeline.json and pipeline.png (``--quick``: pipeline_quick.*).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from typing import Dict, Iterator, List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import torch  # noqa: E402

from benchmarks.common import RESULTS_DIR, print_table, write_json  # noqa: E402

MODES = ("sync", "sparse_dist", "semi_async")
TIMELINE_STEPS = 4


def _batches(shape, rank: int, tokens: List[int], count: int) -> Iterator:
    """Exactly ``count`` batches: every rank's pipeline reads and drains the same number, so
    every launched collective is waited before the process group goes away."""
    from torchrec_ascend.testing.pipeline_workload import hstu_batch

    step = 0
    while step < count:
        batch = hstu_batch(shape, rank, step)
        tokens.append(int(batch.items.lengths().sum()))
        step += 1
        yield batch


def _mean_record(records: List[dict]) -> Dict[str, object]:
    stages: Dict[str, float] = {}
    for r in records:
        for k, v in r["stages_ms"].items():
            stages[k] = stages.get(k, 0.0) + v / len(records)
    return {"busy_fraction": statistics.fmean(r["busy_fraction"] for r in records),
            "stages_ms": {k: round(v, 3) for k, v in stages.items()}}


def _worker(rank: int, world: int, modes: List[str], staleness: int, rounds: int, steps: int,
            warmup: int, shape_kw: dict, png: str) -> dict:
    """Build one model + pipeline per mode, then alternate them round by round."""
    import torch.distributed as dist

    from torchrec_ascend.distributed import make_train_pipeline
    from torchrec_ascend.distributed.train_pipeline import draw_timeline
    from torchrec_ascend.testing.pipeline_workload import HSTUShape, build_hstu

    shape = HSTUShape(**shape_kw)
    cpu = torch.device("cpu")
    config = dataclasses.asdict(shape)
    pipes, iters, tokens, skip = {}, {}, {}, {}
    for mode in modes:
        k = staleness if mode == "semi_async" else 0
        model, opt = build_hstu(shape, k, cpu)
        pipes[mode] = make_train_pipeline(mode, model, opt, cpu)
        tokens[mode] = []
        # semi_async runs TIMELINE_STEPS more consecutive steps after its warmup: the picture
        skip[mode] = warmup + (TIMELINE_STEPS if mode == "semi_async" else 0)
        iters[mode] = _batches(shape, rank, tokens[mode], skip[mode] + rounds * steps)
        for _ in range(skip[mode]):
            pipes[mode].progress(iters[mode])
    out: Dict[str, object] = {m: {"round_step_s": [], "round_cpu_s": [],
                                  "round_thread_cpu_s": [], "records": [], "tokens": []}
                              for m in modes}
    out["shape"] = config
    for r in range(rounds):
        order = list(modes[r % len(modes):]) + list(modes[:r % len(modes)])
        for mode in order:
            pipe = pipes[mode]
            dist.barrier()
            n_tok = len(tokens[mode])
            start, cpu, thread_cpu = time.perf_counter(), time.process_time(), time.thread_time()
            for _ in range(steps):
                pipe.progress(iters[mode])
            out[mode]["round_step_s"].append((time.perf_counter() - start) / steps)
            out[mode]["round_cpu_s"].append((time.process_time() - cpu) / steps)
            out[mode]["round_thread_cpu_s"].append((time.thread_time() - thread_cpu) / steps)
            out[mode]["records"].extend(pipe.stats[-steps:])
            # tokens of the batches trained this round (the prefetcher reads ahead: count the
            # batches by index, not by what was read)
            out[mode]["tokens"].append(n_tok)
    for mode in modes:
        trained = pipes[mode].steps_done
        out[mode]["tokens_per_step"] = statistics.fmean(tokens[mode][skip[mode]:trained])
    for mode in modes:  # every batch is trained: this only confirms the end
        try:
            pipes[mode].progress(iters[mode])
        except StopIteration:
            pass
        else:
            raise RuntimeError(f"{mode}: a batch beyond warmup + rounds * steps was trained")
    if rank == 0 and png and "semi_async" in pipes:
        shown = list(range(warmup, warmup + TIMELINE_STEPS))
        draw_timeline(pipes["semi_async"].timer.spans, png, steps=shown,
                      title=f"semi_async (staleness {staleness}), rank 0 of {world}: steps "
                            f"{shown[0]}-{shown[-1]}, consecutive")
    dist.barrier()
    return out


def _median_of(runs: List[List[dict]], mode: str, key: str) -> float:
    """Median over every round of rank 0's per-round value ``key``."""
    return statistics.median(v for run in runs for v in run[0][mode][key])


def _quality_reference() -> Dict[str, object]:
    """``ndcg_rel_diff``: measured by ``benchmarks/semi_async_quality.py`` (the trainer on the
    KuaiRand sample), copied from its result file when it exists (this workload is synthetic
    and has no validation split)."""
    path = os.path.join(RESULTS_DIR, "semi_async_quality.json")
    if not os.path.exists(path):
        return {"ndcg_rel_diff": {"1": None, "2": None},
                "ndcg_note": "benchmarks/results/semi_async_quality.json is absent"}
    import json

    with open(path) as f:
        q = json.load(f)
    return {"ndcg_rel_diff": q["ndcg_rel_diff"],
            "ndcg_note": f"copied from benchmarks/results/semi_async_quality.json "
                         f"({q['machine']['time']}; final validation NDCG@10 after "
                         f"{q['config']['steps']} steps, mean paired relative difference vs "
                         f"sync over seeds {q['config']['seeds']})"}


def _spawn(world: int, modes, args, shape_kw: dict, png: str) -> List[dict]:
    from torchrec_ascend.testing.multiprocess import run_multiprocess

    return run_multiprocess(_worker, world, (list(modes), args.staleness, args.rounds,
                                             args.steps, args.warmup, shape_kw, png))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="< 60 s: fewer rounds and steps")
    ap.add_argument("--staleness", type=int, default=1, help="staleness of semi_async (>= 1)")
    ap.add_argument("--alternations", type=int, default=None,
                    help="2-rank / 1-rank run pairs (default 2, quick 1)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--ndcg-only", action="store_true",
                    help="only re-copy ndcg_rel_diff from semi_async_quality.json into the "
                         "existing pipeline.json (after a new quality run)")
    args = ap.parse_args()
    if args.ndcg_only:
        import json

        path = os.path.join(RESULTS_DIR, "pipeline.json")
        with open(path) as f:
            result = json.load(f)
        result.update(_quality_reference())
        with open(path, "w") as f:
            json.dump(result, f, indent=2)
        print(f"updated ndcg_rel_diff in {path}: {result['ndcg_rel_diff']}")
        return
    if args.staleness < 1:
        raise SystemExit(f"--staleness={args.staleness}: must be >= 1 (0 is the sync modes)")
    q = args.quick
    args.alternations = args.alternations or (1 if q else 3)
    args.rounds = args.rounds or (6 if q else 24)
    args.steps = args.steps or (1 if q else 2)
    args.warmup = args.warmup if args.warmup is not None else (1 if q else 3)
    shape_kw: dict = {}  # HSTUShape's defaults (the workers report them)
    png = os.path.join(RESULTS_DIR, "pipeline_quick.png" if q else "pipeline.png")
    t0 = time.time()
    load_before = os.getloadavg()
    two: List[List[dict]] = []
    one: List[List[dict]] = []
    for a in range(args.alternations):
        two.append(_spawn(2, MODES, args, shape_kw, png if a == 0 else ""))
        one.append(_spawn(1, ("sync", "semi_async"), args, shape_kw, ""))

    def step_s(runs: List[List[dict]], mode: str) -> float:
        return statistics.median(s for run in runs for s in run[0][mode]["round_step_s"])

    def tok_per_s(runs: List[List[dict]], mode: str) -> float:
        per_step = sum(rank_out[mode]["tokens_per_step"] for rank_out in runs[0])
        return per_step / step_s(runs, mode)

    result: Dict[str, object] = {"step_s": {}, "busy_fraction": {}, "stages_ms": {}}
    for mode in MODES:
        records = [r for run in two for r in run[0][mode]["records"]]
        mean = _mean_record(records)
        result["step_s"][mode] = round(step_s(two, mode), 5)
        result["busy_fraction"][mode] = round(mean["busy_fraction"], 4)
        result["stages_ms"][mode] = mean["stages_ms"]
    # CPU time per step on rank 0 (process: every thread -- compute, gloo, prefetch; thread:
    # the compute thread) and its share of the wall time: near 1 = the rank's core was busy
    result["cpu_ms_per_step"] = {m: {
        "process": round(1e3 * _median_of(two, m, "round_cpu_s"), 3),
        "compute_thread": round(1e3 * _median_of(two, m, "round_thread_cpu_s"), 3),
        "process_cpu_over_wall": round(statistics.median(
            c / w for run in two for c, w in zip(run[0][m]["round_cpu_s"],
                                                 run[0][m]["round_step_s"])), 4)}
        for m in MODES}
    result.update(_quality_reference())
    tps = {"1_rank": {m: round(tok_per_s(one, m), 1) for m in ("sync", "semi_async")},
           "2_ranks": {m: round(tok_per_s(two, m), 1) for m in ("sync", "semi_async")}}
    result["tokens_per_s"] = tps
    result["scaling_efficiency"] = {
        m: round(tps["2_ranks"][m] / (2 * tps["1_rank"][m]), 4) for m in ("sync", "semi_async")}
    result["ratios"] = {"semi_async_over_sync_step": round(
        result["step_s"]["semi_async"] / result["step_s"]["sync"], 4),
        "sparse_dist_over_sync_step": round(
        result["step_s"]["sparse_dist"] / result["step_s"]["sync"], 4)}
    result["goals"] = {"semi_async_over_sync_step": "<= 0.8", "busy_fraction.semi_async":
                       ">= 0.9", "scaling_efficiency": ">= 0.95"}
    result["config"] = {"shape": two[0][0]["shape"], "staleness": args.staleness,
                        "alternations": args.alternations, "rounds": args.rounds,
                        "steps": args.steps, "warmup": args.warmup, "threads_per_rank": 1,
                        "backend": "gloo", "quick": q}
    result["raw_round_step_s"] = {
        "2_ranks": {m: [run[0][m]["round_step_s"] for run in two] for m in MODES},
        "1_rank": {m: [run[0][m]["round_step_s"] for run in one] for m in ("sync", "semi_async")}}
    result["loadavg_before_after"] = [list(load_before), list(os.getloadavg())]
    result["wall_s"] = round(time.time() - t0, 1)
    path = write_json("pipeline_quick" if q else "pipeline", result)
    print_table([{"mode": m, "step_ms": result["step_s"][m] * 1e3,
                  "vs_sync": result["step_s"][m] / result["step_s"]["sync"],
                  "busy_fraction": result["busy_fraction"][m]} for m in MODES])
    print_table([{"mode": m, "tok/s 1 rank": tps["1_rank"][m], "tok/s 2 ranks": tps["2_ranks"][m],
                  "scaling_eff": result["scaling_efficiency"][m]} for m in ("sync", "semi_async")])
    print_table([{"mode": m, **result["cpu_ms_per_step"][m]} for m in MODES])
    print(f"wrote {path} and {png} in {result['wall_s']} s")


if __name__ == "__main__":
    main()
