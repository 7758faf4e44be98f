"""Run a config end to end: output folder checked -> data -> the task's split -> its baselines ->
each model trained and evaluated -> ``<out>/results.json`` + ``<out>/training.png``.

``results.json``::

    {"config": name, "task": "retrieval", "world_size": W, "peak_gflops": per-rank peak (GEMM
     of the compute dtype), "precision": {"requested", "compute_dtype", "reason"},
     "seconds": wall time, "data": the task's data summary,
     "models": {"hstu": {"valid": {metrics}, "test": {metrics}, "tokens_per_s": x, "mfu": x,
                         "steps", "stopped_early", "best_valid", "evals": [...],
                         "refit": {...} with ranking.refit (.refit)}, ...},
     "baselines": {"most_popular": {"valid": {metrics}, "test": {metrics}}},
     "plot": path, "config_values": the full config}

Retrieval metrics: ``hr@K``, ``ndcg@K`` for ``eval.ks`` and ``mrr`` (torchrec_ascend.metrics).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist

from ..device import dtype_name
from ..metrics import device_peak_flops
from .config import ExperimentConfig
from .console import Console, quiet_notices
from .precision import resolve_precision
from .process_group import DistEnv, init_distributed
from .ranking import RankingTask, prepare_ranking
from .ranking.evaluator import REGRESSION_METRIC
from .recorder import plot
from .refit import refit
from .retrieval import RetrievalTask, hold_out
from .run_folder import RunFolder, check_writable_dir
from .sources import load_sequences
from .task import Task
from .trainer import Trainer

__all__ = ["run_experiment", "prepare_task", "format_summary"]


def prepare_task(cfg: ExperimentConfig, progress: bool = False) -> Task:
    """The config's data prepared for its task (collective in a multi-rank job)."""
    if cfg.task == "ranking":
        return RankingTask(cfg, prepare_ranking(cfg, progress=progress))
    seqs = load_sequences(cfg.data, progress=progress)
    return RetrievalTask(cfg, hold_out(seqs, cfg.eval.holdout))


def _peak(env: DistEnv, gemm_size: int, dtype: torch.dtype = torch.float32) -> float:
    local = device_peak_flops(env.device, dtype=dtype, gemm_size=gemm_size)
    v = torch.tensor([local], dtype=torch.float64)
    if env.world_size > 1:
        dist.all_reduce(v)
    return float(v[0]) / env.world_size


def run_experiment(cfg: ExperimentConfig, out: str, resume: bool = False, progress: bool = True,
                   env: Optional[DistEnv] = None, log: Callable[[str], None] = print,
                   overwrite: bool = False) -> Dict[str, Any]:
    """Train and evaluate every model of ``cfg.models``; returns the results (rank 0 also
    writes them to ``<out>/results.json``).  The output folder's rules
    (:mod:`.run_folder`: one run per folder, ``resume`` continues it, ``overwrite`` replaces
    it) and the writability of ``data.cache_dir`` are checked before the data is read."""
    with quiet_notices():
        return _run(cfg, out, resume, progress, env, log, overwrite)


def _run(cfg: ExperimentConfig, out: str, resume: bool, progress: bool,
         env: Optional[DistEnv], log: Callable[[str], None], overwrite: bool) -> Dict[str, Any]:
    env = env or init_distributed()
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    console = Console(env.rank == 0, log)
    folder = RunFolder(out, cfg.models)
    folder.check(cfg.to_dict(), resume, overwrite)
    check_writable_dir("data.cache_dir", cfg.data.cache_dir)
    t0 = time.perf_counter()
    task = prepare_task(cfg, progress=progress and env.rank == 0)
    if env.rank == 0:
        folder.start(cfg.to_dict(), resume, overwrite)
    if env.world_size > 1:
        dist.barrier()
    console.say(f"{task.describe()} ({time.perf_counter() - t0:.1f}s)")
    compute_dtype, why = resolve_precision(cfg.train.precision, env.device)
    peak = _peak(env, cfg.train.peak_gemm_size, compute_dtype)
    console.say(f"device {env.device}, compute dtype {dtype_name(compute_dtype)} ({why}), peak "
                f"(measured {dtype_name(compute_dtype)} GEMM) {peak / 1e9:.1f} GFLOP/s per rank, "
                f"{env.world_size} rank(s)")
    baselines = task.baselines(env.rank, env.world_size)
    histories: Dict[str, Dict[str, list]] = {}
    results: Dict[str, Any] = {}
    for kind in cfg.models:
        trainer = Trainer(cfg, task, env, out, kind, peak, progress=progress, resume=resume,
                          console=console)
        console.say(f"[{kind}] parameters: {trainer.num_dense:,} dense; plan: "
                    f"{trainer.sharding_type} on {env.world_size} rank(s); {trainer.total} steps "
                    f"({trainer.batches.steps_per_epoch} per epoch), pipeline "
                    f"{cfg.train.pipeline} (staleness {cfg.train.staleness}), balance "
                    f"{cfg.train.balance}")
        results[kind] = trainer.fit()
        histories[kind] = results[kind].pop("history")
        if task.refit_task() is not None:
            results[kind] = refit(cfg, task, env, out, kind, peak, trainer, results[kind],
                                  console, progress=progress, resume=resume)
    summary: Dict[str, Any] = {
        "config": cfg.name, "task": task.name, "world_size": env.world_size,
        "peak_gflops": peak / 1e9,
        "precision": {"requested": cfg.train.precision, "compute_dtype": dtype_name(compute_dtype),
                      "reason": why},
        "data": task.data_summary(), "models": results, "baselines": baselines,
        "seconds": time.perf_counter() - t0, "config_values": cfg.to_dict()}
    if env.rank == 0:
        valid_base = {k: v["valid"] for k, v in baselines.items() if v["valid"] is not None}
        summary["plot"] = plot(out, histories, valid_base, keys=plot_keys(cfg, task),
                               loss="training loss (" + ("per-task BCE" if task.name == "ranking"
                                                         else "sampled softmax") + ")")
        tmp = os.path.join(out, "results.json.tmp")
        with open(tmp, "w") as f:
            json.dump(summary, f, indent=1)
        os.replace(tmp, os.path.join(out, "results.json"))
        log(format_summary(summary))
    if env.world_size > 1:
        dist.barrier()
    return summary


def plot_keys(cfg: ExperimentConfig, task: Task) -> List[str]:
    """The validation metrics ``training.png`` draws: ``eval.metric``, and for ranking every
    task's AUC."""
    if task.name == "ranking":
        return [cfg.eval.metric] + [f"{t}.auc" for t in task.task_names]  # type: ignore[attr-defined]
    return [cfg.eval.metric]


def format_summary(s: Dict[str, Any]) -> str:
    """The final table: every model and baseline, validation and test."""
    if s.get("task") == "ranking":
        return _ranking_summary(s)
    rows = [(k, r["valid"], r["test"]) for k, r in s["models"].items()]
    rows += [(k, r["valid"], r["test"]) for k, r in s["baselines"].items()]
    keys = list(rows[0][2].keys())  # the test metrics (leave-one-out has no validation)
    holdout = s.get("config_values", {}).get("eval", {}).get("holdout", "leave_two_out")
    lines = [f"\n== {s['config']}: {holdout.replace('_', '-')}, full corpus, history filtered ==",
             f"{'model':<14}{'split':<7}" + "".join(f"{k:>10}" for k in keys)]
    for name, valid, test in rows:
        for split, met in (("valid", valid), ("test", test)):
            if met is None:  # leave-one-out: no validation
                continue
            lines.append(f"{name:<14}{split:<7}" + "".join(f"{met[k]:>10.4f}" for k in keys))
    return "\n".join(lines + _run_lines(s))


def _ranking_summary(s: Dict[str, Any]) -> str:
    rows = [(k, r["valid"], r["test"]) for k, r in s["models"].items()]
    rows += [(k, r["valid"], r["test"]) for k, r in s["baselines"].items()]
    tasks = [k for k, v in rows[0][2].items() if isinstance(v, dict) and "auc" in v]
    lines = [f"\n== {s['config']}: ranking, time split (AUC / GAUC / NE per task) ==",
             f"{'model':<10}{'split':<7}" + "".join(f"{t:>26}" for t in tasks)]

    def cell(m: Dict[str, Any]) -> str:
        vals = [m.get(k) for k in ("auc", "gauc", "ne")]
        return "".join(f"{v:8.4f}" if v is not None else f"{'-':>8}" for v in vals)

    for name, valid, test in rows:
        for split, met in (("valid", valid), ("test", test)):
            lines.append(f"{name:<10}{split:<7}" + "".join(f"{cell(met[t]):>26}" for t in tasks))
    for name, valid, test in rows:  # the watch-time regression (ranking.watch_time_weight)
        for split, met in (("valid", valid), ("test", test)):
            w = met.get(REGRESSION_METRIC)
            if w and w.get("rmse") is not None:
                r2 = f"{w['r2']:.4f}" if w.get("r2") is not None else "-"
                lines.append(f"{name:<10}{split:<7}watch time (log1p s): RMSE {w['rmse']:.4f} "
                             f"MAE {w['mae']:.4f} R^2 {r2}")
    return "\n".join(lines + _run_lines(s))


def _run_lines(s: Dict[str, Any]) -> List[str]:
    """The summary's closing lines: each model's speed, the plot, the total time."""
    lines = []
    for k, r in s["models"].items():
        if r.get("tokens_per_s"):
            lines.append(f"{k}: {r['tokens_per_s']:,.0f} tokens/s, MFU {100 * r['mfu']:.2f}% "
                         f"(peak {s['peak_gflops']:.1f} GFLOP/s per rank), {r['steps']} steps"
                         + (" (stopped early)" if r["stopped_early"] else ""))
    if s.get("plot"):
        lines.append(f"plot: {s['plot']}")
    lines.append(f"total time: {s['seconds']:.1f}s")
    return lines
