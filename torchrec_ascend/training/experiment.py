"""Run a config end to end: data -> leave-two-out split -> most-popular baseline -> each encoder
trained and evaluated -> ``<out>/results.json`` + ``<out>/training.png``.

``results.json``::

    {"config": name, "world_size": W, "peak_gflops": per-rank peak (GEMM of the compute dtype),
     "precision": {"requested", "compute_dtype", "reason"}, "seconds": wall time,
     "data": {"users", "items", "train_events"},
     "models": {"hstu": {"valid": {metrics}, "test": {metrics}, "tokens_per_s": x, "mfu": x,
                         "steps", "stopped_early", "best_valid", "evals": [...]}, ...},
     "baselines": {"most_popular": {"valid": {metrics}, "test": {metrics}}},
     "plot": path, "config_values": the full config}

Metrics: ``hr@K``, ``ndcg@K`` for ``eval.ks`` and ``mrr`` (torchrec_ascend.metrics).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Dict, Optional

import torch
import torch.distributed as dist

from ..device import dtype_name
from ..metrics import device_peak_flops
from .config import ExperimentConfig
from .distributed import DistEnv, init_distributed
from .evaluator import Evaluator, eval_users
from .precision import resolve_precision
from .recorder import plot
from .sources import load_sequences
from .split import Split, leave_one_out, leave_two_out
from .trainer import Trainer

__all__ = ["run_experiment", "prepare_split", "format_summary"]


def prepare_split(cfg: ExperimentConfig, progress: bool = False) -> Split:
    """The config's data as a leave-two-out split, or leave-one-out with ``eval.holdout``
    (collective in a multi-rank job)."""
    hold_out = leave_one_out if cfg.eval.holdout == "leave_one_out" else leave_two_out
    return hold_out(load_sequences(cfg.data, progress=progress))


def _peak(env: DistEnv, gemm_size: int, dtype: torch.dtype = torch.float32) -> float:
    local = device_peak_flops(env.device, dtype=dtype, gemm_size=gemm_size)
    v = torch.tensor([local], dtype=torch.float64)
    if env.world_size > 1:
        dist.all_reduce(v)
    return float(v[0]) / env.world_size


def run_experiment(cfg: ExperimentConfig, out: str, resume: bool = False, progress: bool = True,
                   env: Optional[DistEnv] = None, log: Callable[[str], None] = print
                   ) -> Dict[str, Any]:
    """Train and evaluate every encoder of ``cfg.models``; returns the results (rank 0 also
    writes them to ``<out>/results.json``)."""
    env = env or init_distributed()
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    say = log if env.rank == 0 else (lambda _msg: None)
    t0 = time.perf_counter()
    split = prepare_split(cfg, progress=progress and env.rank == 0)
    if env.rank == 0:
        os.makedirs(out, exist_ok=True)
    lens = split.prefix_lengths
    say(f"data: {split.num_users:,} users, {split.num_items:,} items, {len(split.items):,} "
        f"training events (prefix length mean {lens.mean():.1f}, max {lens.max()}); "
        + ("leave-two-out: validation = second-to-last, test = last item "
           if split.has_valid else
           "leave-one-out: test = last item, the second-to-last is trained on, no validation ")
        + f"({time.perf_counter() - t0:.1f}s)")
    compute_dtype, why = resolve_precision(cfg.train.precision, env.device)
    peak = _peak(env, cfg.train.peak_gemm_size, compute_dtype)
    say(f"device {env.device}, compute dtype {dtype_name(compute_dtype)} ({why}), peak "
        f"(measured {dtype_name(compute_dtype)} GEMM) {peak / 1e9:.1f} GFLOP/s per rank, "
        f"{env.world_size} rank(s)")
    ev = Evaluator(split, cfg.model.max_seq_len, cfg.eval.ks, cfg.eval.batch_size)
    users = eval_users(split.num_users, env.rank, env.world_size)
    baselines = {"most_popular": {
        "valid": ev.most_popular("valid", users) if split.has_valid else None,  # leave-one-out
        "test": ev.most_popular("test", users)}}
    histories: Dict[str, Dict[str, list]] = {}
    results: Dict[str, Any] = {}
    for kind in cfg.models:
        trainer = Trainer(cfg, split, env, out, kind, peak, progress=progress, resume=resume,
                          histories=histories, log=log)
        say(f"[{kind}] parameters: {split.num_items:,} x {cfg.model.table_dim} embedding "
            f"(model uses {cfg.model.embedding_dim} columns) + {trainer.num_dense:,} dense; "
            f"plan: {trainer.sharding_type} on {env.world_size} rank(s); "
            f"{trainer.total} steps ({trainer.builder.order.steps_per_epoch} per epoch), "
            f"pipeline {cfg.train.pipeline} (staleness {cfg.train.staleness}), "
            f"balance {cfg.train.balance}")
        results[kind] = trainer.fit()
    summary: Dict[str, Any] = {
        "config": cfg.name, "world_size": env.world_size, "peak_gflops": peak / 1e9,
        "precision": {"requested": cfg.train.precision, "compute_dtype": dtype_name(compute_dtype),
                      "reason": why},
        "data": {"users": split.num_users, "items": split.num_items,
                 "train_events": int(len(split.items))},
        "models": results, "baselines": baselines,
        "seconds": time.perf_counter() - t0, "config_values": cfg.to_dict()}
    if env.rank == 0:
        valid_base = {k: v["valid"] for k, v in baselines.items() if v["valid"] is not None}
        summary["plot"] = plot(out, histories, valid_base, key=cfg.eval.metric)
        tmp = os.path.join(out, "results.json.tmp")
        with open(tmp, "w") as f:
            json.dump(summary, f, indent=1)
        os.replace(tmp, os.path.join(out, "results.json"))
        log(format_summary(summary))
    if env.world_size > 1:
        dist.barrier()
    return summary


def format_summary(s: Dict[str, Any]) -> str:
    """The final table: every model and baseline, validation and test."""
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
    for k, r in s["models"].items():
        if r.get("tokens_per_s"):
            lines.append(f"{k}: {r['tokens_per_s']:,.0f} tokens/s, MFU {100 * r['mfu']:.2f}% "
                         f"(peak {s['peak_gflops']:.1f} GFLOP/s per rank), {r['steps']} steps"
                         + (" (stopped early)" if r["stopped_early"] else ""))
    if s.get("plot"):
        lines.append(f"plot: {s['plot']}")
    lines.append(f"total time: {s['seconds']:.1f}s")
    return "\n".join(lines)
