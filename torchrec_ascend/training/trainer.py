"""``Trainer``: one encoder (HSTU or SASRec) trained on a split, evaluated on validation
periodically and on validation + test at the end.

    trainer = Trainer(cfg, split, env, out="runs/x", kind="hstu", peak_flops=peak)
    result = trainer.fit()   # {"valid": {...}, "test": {...}, "tokens_per_s", "mfu", ...}

What runs where (docs/training.md):

* the model (:class:`~torchrec_ascend.models.GenerativeRetrieval`) under torchrec_ascend's
  ``DistributedModelParallel(staleness=train.staleness)`` (TorchRec's, plus the bound) on
  ``env.device`` (npu / cuda / cpu from
  :mod:`torchrec_ascend.device`), the item table sharded by the planner of ``train.planner``
  (TorchRec's ``EmbeddingShardingPlanner`` over a topology built by ``TopologyFactory``, with a
  storage reservation that knows the dense part; or the hierarchical planner), its row-wise
  Adagrad fused into the backward; the dense part's gradients summed over ranks (DDP with
  :class:`~.distributed.SumDataParallelWrapper` at staleness 0, the pipeline's deferred
  all-reduce at staleness >= 1; :mod:`.pipelines`) and AdamW (+ gradient clipping);
* every step through the train pipeline of ``train.pipeline`` (``sync`` | ``sparse_dist``
  (default) | ``semi_async``, :func:`torchrec_ascend.distributed.make_train_pipeline`), fed by
  :class:`~.batches.BatchBuilder` (deterministic order, balance hook, negatives prefetched one
  step ahead); each step's stage record (stage ms, busy fraction) goes to log.jsonl and
  TensorBoard, and ``<out>/<kind>/pipeline.png`` draws a few steps at the end;
* training runs in segments between evaluation / checkpoint steps: a segment's batch iterator
  ends there, the pipeline drains, and evaluation (pipeline detached) or the checkpoint sees a
  model with no batch in flight; the next segment re-attaches it.  Dropout is seeded by the
  step, so results do not depend on where segments (or a kill and a resume) fall.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist

from ..device import dtype_name
from ..models import TABLE, GenerativeRetrieval
from ..models.generative_retrieval import init_item_table
from ..sampling import make_sampler
from . import checkpoint as ckpt
from .batches import BatchBuilder, cost_model_for
from .config import ExperimentConfig
from .distributed import DistEnv
from .evaluator import Evaluator, eval_users
from .pipelines import draw_pipeline_png, make_pipeline, step_row, wrap_model
from .precision import resolve_precision
from .recorder import Recorder
from .split import Split

__all__ = ["Trainer", "DenseOptimizer", "make_planner", "total_steps"]


class DenseOptimizer:
    """AdamW over the dense parameters with optional global-norm gradient clipping before each
    step (the interface TorchRec's pipelines call: ``zero_grad`` / ``step``)."""

    def __init__(self, params: List[torch.nn.Parameter], lr: float, weight_decay: float,
                 clip: Optional[float]) -> None:
        self.params = list(params)
        self.inner = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay,
                                       betas=(0.9, 0.98))
        self.clip = clip

    @property
    def param_groups(self) -> list:
        return self.inner.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Optional[Callable[[], Any]] = None) -> None:
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.inner.step()

    def state_dict(self) -> Dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.inner.load_state_dict(state)


def make_planner(cfg: ExperimentConfig, env: DistEnv, dense_bytes: int):
    """The sharding planner of ``train.planner`` for this job's topology (built through
    TorchRec's ``TopologyFactory``); the memory reservation keeps 15% of each device plus the
    dense part's estimate (``dense_bytes``) away from the tables."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import ParameterConstraints

    from ..distributed.planner import (DeviceMemoryReservation, HierarchicalShardingPlanner,
                                       HierarchicalTopology, TwoDimShardingPlanner)

    topo = HierarchicalTopology.from_env(
        compute_device=env.device.type,
        environ={"WORLD_SIZE": str(env.world_size), "LOCAL_WORLD_SIZE": str(env.local_world_size)})
    reserve = DeviceMemoryReservation(min(0.9, 0.15 + dense_bytes / topo.memory_bytes))
    constraints = {TABLE: ParameterConstraints(sharding_types=[cfg.train.sharding])}
    if cfg.train.planner == "hierarchical_2d":
        return TwoDimShardingPlanner(topology=topo, constraints=constraints,
                                     storage_reservation=reserve, sync_every=cfg.train.sync_every)
    if cfg.train.planner == "hierarchical":
        return HierarchicalShardingPlanner(topology=topo, constraints=constraints,
                                           storage_reservation=reserve)
    return EmbeddingShardingPlanner(topology=topo.to_torchrec(), constraints=constraints,
                                    storage_reservation=reserve)


def total_steps(cfg: ExperimentConfig, steps_per_epoch: int) -> int:
    """``train.steps``, else ``ceil(train.epochs x steps_per_epoch)`` (default epochs when
    neither is set)."""
    from .config import DEFAULT_EPOCHS

    t = cfg.train
    if t.steps is not None:
        return int(t.steps)
    epochs = t.epochs if t.epochs is not None else DEFAULT_EPOCHS
    return max(1, int(np.ceil(epochs * steps_per_epoch)))


class Trainer:
    """Trains encoder ``kind`` of ``cfg`` on ``split`` (module docstring).  ``out``: the run's
    folder (the model's log and checkpoints go to ``out/<kind>/``); ``peak_flops``: per-rank
    peak for MFU; ``resume``: continue from the latest checkpoint; ``histories``: shared dict
    the plot reads (``kind`` -> history); ``track_versions``: the ``semi_async`` pipeline
    records which parameter version each lookup read (``pipeline.versions``; costs a pass over
    the local table per step: tests)."""

    def __init__(self, cfg: ExperimentConfig, split: Split, env: DistEnv, out: str, kind: str,
                 peak_flops: float, progress: bool = True, resume: bool = False,
                 histories: Optional[Dict[str, Dict[str, list]]] = None,
                 log: Callable[[str], None] = print, track_versions: bool = False) -> None:
        self.cfg, self.split, self.env, self.out, self.kind = cfg, split, env, out, kind
        self.peak_flops, self.progress, self.resume = peak_flops, progress, resume
        self.histories = histories if histories is not None else {}
        self._log = log
        self._track_versions = track_versions
        self.root = f"{out}/{kind}"
        self.best_root = f"{self.root}/best"
        self.evaluator = Evaluator(split, cfg.model.max_seq_len, cfg.eval.ks, cfg.eval.batch_size)
        self._build()

    # ------------------------------------------------------------------ set-up
    def _build(self) -> None:
        from torchrec.distributed.embedding import EmbeddingCollectionSharder
        from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
        from torchrec.optim.optimizers import in_backward_optimizer_filter
        from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

        t, env = self.cfg.train, self.env
        self.compute_dtype, self.precision_reason = resolve_precision(t.precision, env.device)
        torch.manual_seed(t.seed)
        model = GenerativeRetrieval(self.split.num_items, self.cfg.model, self.kind,
                                    t.temperature, device=torch.device("meta"),
                                    compute_dtype=self.compute_dtype)
        apply_optimizer_in_backward(RowWiseAdagrad, model.ec.parameters(),
                                    {"lr": t.sparse_lr, "eps": 1e-8})
        n_dense = sum(p.numel() for p in model.head.parameters())
        sharders = [EmbeddingCollectionSharder()]
        planner = make_planner(self.cfg, env, dense_bytes=16 * n_dense)  # param, grad, 2 AdamW
        self.plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
        self.dmp = wrap_model(model, env.device, self.plan, sharders, t.staleness, planner,
                              t.replica_merge)
        init_item_table(self.dmp, self.split.num_items, self.cfg.model.table_dim, t.seed)
        dense = [p for _, p in in_backward_optimizer_filter(self.dmp.named_parameters())]
        self.optimizer = DenseOptimizer(dense, t.lr, t.weight_decay, t.clip_grad_norm or None)
        self.pipeline = make_pipeline(t.pipeline, self.dmp, self.optimizer, env.device,
                                      t.staleness, t.step_timeout_s, self._track_versions,
                                      t.sync_warmup_steps)
        counts = torch.from_numpy(self.split.item_counts()).to(torch.float32)
        sampler = make_sampler(t.sampler, self.split.num_items,
                               counts=counts if t.sampler != "uniform" else None)
        self.builder = BatchBuilder(
            self.split, self.cfg.model.max_seq_len, t.batch_size, env.rank, env.world_size,
            t.seed, sampler, t.num_negatives, t.balance,
            cost_model_for(self.kind, self.cfg.model) if t.balance != "none" else None,
            prefetch=t.prefetch, balance_group=self._balance_group(), balance_ahead=t.balance_ahead,
            negatives=t.negatives)
        self.total = total_steps(self.cfg, self.builder.order.steps_per_epoch)
        self.sharding_type = self.plan.plan["ec"][TABLE].sharding_type
        self.num_dense = n_dense

    def _balance_group(self) -> Optional[dist.ProcessGroup]:
        """A process group of its own for the all_to_all balancer (collective): the batches
        are built inside the pipeline (on its batch thread in ``semi_async``), so the
        balancer's collectives must not share a group with the pipeline's."""
        if self.cfg.train.balance != "all_to_all" or self.env.world_size == 1:
            return None
        return dist.new_group(ranks=list(range(self.env.world_size)))

    def say(self, msg: str) -> None:
        if self.env.rank == 0:
            self._log(msg)

    @property
    def model(self) -> GenerativeRetrieval:
        return self.dmp.module  # type: ignore[return-value]

    # ------------------------------------------------------------------ pieces
    def _boundaries(self, start: int) -> List[int]:
        t = self.cfg.train
        marks = {self.total}
        for every in (t.eval_every, t.checkpoint_every):
            if every:
                marks.update(range(every, self.total, every))
        return sorted(m for m in marks if m > start)

    def _sync_replicas(self) -> None:
        """2-D parallelism: merge the hosts' replicas now if a step was trained since the
        last sync (before a checkpoint, which holds one copy, and before the final
        evaluation); nothing otherwise (collective)."""
        sync = getattr(self.dmp, "sync_replicas", None)
        if sync is not None:
            sync()

    def _load(self, path: str) -> Dict[str, Any]:
        """Load checkpoint ``path`` into the model and the dense optimizer; its trainer state.
        2-D: the model counts its steps from the checkpoint's (always of synced replicas)."""
        state = ckpt.load(path, self.dmp, self.optimizer)
        restart = getattr(self.dmp, "restart_count", None)
        if restart is not None:
            restart(int(state["step"]))
        return state

    def _save(self, step: int, state: Dict[str, Any]) -> None:
        self._sync_replicas()
        ckpt.save(self.root, step, self.dmp, self.optimizer, state,
                  keep=self.cfg.train.keep_checkpoints)

    def _global(self, values: List[float]) -> torch.Tensor:
        v = torch.tensor(values, dtype=torch.float64)
        if self.env.world_size > 1:
            dist.all_reduce(v)
        return v

    def evaluate(self, which: str, limit: Optional[int] = None) -> Dict[str, float]:
        """Metrics on ``which`` (``valid`` / ``test``), pipeline detached (collective)."""
        detach = getattr(self.pipeline, "detach", None)  # pipelines that rewrite the model
        if detach is not None:
            detach()
        users = eval_users(self.split.num_users, self.env.rank, self.env.world_size, limit)
        merged = getattr(self.dmp, "merged_weights", None)  # 2-D: of the hosts' replicas merged
        with merged() if merged is not None else contextlib.nullcontext():
            return self.evaluator.evaluate(self.model, which, users, self.env.device)

    # ------------------------------------------------------------------ the loop
    def train_segment(self, start: int, end: int,
                      on_step: Optional[Callable[[int, float, torch.Tensor, float], None]] = None
                      ) -> int:
        """Train steps ``[start, end)`` through the pipeline (it drains at ``end``); calls
        ``on_step(step_number, rank_loss, stats, seconds)`` after each; returns ``end``."""
        seed = self.cfg.train.seed
        it = self.builder.stream(start, end)
        step_done = getattr(self.dmp, "step_done", None)  # 2-D: syncs every train.sync_every
        step = start
        while True:
            torch.manual_seed(seed * 7919 + step)  # dropout: a function of the step
            tic = time.perf_counter()
            try:
                loss, stats = self.pipeline.progress(it)
            except StopIteration:
                break
            if step_done is not None:
                step_done()
            lv = float(loss.detach().cpu())
            step += 1
            if on_step is not None:
                on_step(step, lv, stats, time.perf_counter() - tic)
        if step != end:
            raise RuntimeError(f"train_segment: ran {step - start} steps, expected {end - start}")
        return step

    def fit(self) -> Dict[str, Any]:
        t, e = self.cfg.train, self.cfg.eval
        start = 0
        history: Dict[str, list] = {"loss": [], "eval": [], "perf": []}
        stop_state = {"best": None, "best_step": None, "bad": 0, "stopped": False}
        if self.resume:
            last = ckpt.latest(self.root)
            if last is not None:
                st = self._load(last)
                start, history = int(st["step"]), st["history"]
                stop_state = st["early_stopping"]
                if t.sync_warmup_steps:  # the warm-up counts global steps
                    self.pipeline.sync_warmup_steps = max(0, t.sync_warmup_steps - start)
                self.say(f"[{self.kind}] resumed from {last} at step {start}")
        self.histories[self.kind] = history
        rec = Recorder(self.out, self.kind, self.env.rank == 0, fresh=start == 0)
        rec.log({"step": start, "precision": t.precision,
                 "compute_dtype": dtype_name(self.compute_dtype), "reason": self.precision_reason})
        bar = None
        if self.progress and self.env.rank == 0:
            from tqdm import tqdm

            bar = tqdm(total=self.total, initial=start, desc=f"train {self.kind}",
                       mininterval=1.0, dynamic_ncols=True, file=sys.stderr)
        write = bar.write if bar is not None else self.say
        win = np.zeros(3)  # tokens, flops, seconds
        seg_end = [start]

        def on_step(n: int, lv_local: float, stats: torch.Tensor, secs: float) -> None:
            win[:] += [float(stats[1]), float(stats[2]), secs]
            lv = float(self._global([lv_local])[0])
            history["loss"].append((n, lv))
            row = step_row(self.pipeline.last_stats)
            if self.builder.last_balance_s is not None:
                row["balance_ms"] = 1e3 * self.builder.last_balance_s
            rec.log({"step": n, "loss": lv, **row})
            rec.scalar("train/loss", lv, n)
            for key, value in row.items():
                rec.scalar(f"pipeline/{key}", value, n)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{lv:.3f}", refresh=False)
            if n % t.log_every == 0 or n == seg_end[0]:
                self._log_perf(win, n, history, rec, write)
                win[:] = 0

        step = start
        try:
            for end in self._boundaries(start):
                if stop_state["stopped"]:
                    break
                seg_end[0] = end
                step = self.train_segment(step, end, on_step)
                if t.eval_every and step % t.eval_every == 0 and step < self.total:
                    self._periodic_eval(step, history, rec, write, stop_state)
                if t.checkpoint_every and step % t.checkpoint_every == 0:
                    self._save(step, {"history": history, "early_stopping": stop_state,
                                      "kind": self.kind})
        finally:
            if bar is not None:
                bar.close()
            self.builder.close()
            close = getattr(self.pipeline, "close", None)  # semi_async: its batch thread
            if close is not None:
                close()
        if self.env.rank == 0:
            draw_pipeline_png(self.pipeline, f"{self.root}/pipeline.png",
                              title=f"{self.kind}: train.pipeline={t.pipeline}, "
                                    f"staleness={t.staleness} (rank 0)")
        restored = None
        if e.restore_best and stop_state["best_step"] not in (None, step):
            best = ckpt.latest(self.best_root)
            if best is None:
                raise RuntimeError(f"eval.restore_best: no checkpoint under {self.best_root}")
            restored = int(self._load(best)["step"])
            self.say(f"[{self.kind}] restored the best validation model (step {restored})")
        self._sync_replicas()  # 2-D: the final evaluation is of the merged replicas
        valid = self.evaluate("valid") if self.split.has_valid else None  # leave-one-out: none
        test = self.evaluate("test")
        for name, met in (("valid", valid), ("test", test)):
            for k, v in (met or {}).items():
                rec.scalar(f"final_{name}/{k}", v, step)
        if valid is not None:
            history["eval"].append({"step": step, "split": "valid", **valid})
        rec.log({"step": step, "split": "final", "valid": valid, "test": test})
        rec.close()
        perf = history.get("perf", [])
        return {"valid": valid, "test": test,
                "tokens_per_s": perf[-1]["tokens_per_s"] if perf else None,
                "mfu": perf[-1]["mfu"] if perf else None, "steps": step,
                "stopped_early": bool(stop_state["stopped"]),
                "best_valid": {"step": stop_state["best_step"], e.metric: stop_state["best"]},
                "restored_step": restored,
                "evals": history["eval"], "sharding": self.sharding_type,
                "compute_dtype": dtype_name(self.compute_dtype),
                "world_size": self.env.world_size}

    def _log_perf(self, win: np.ndarray, step: int, history: Dict[str, list], rec: Recorder,
                  write: Callable[[str], None]) -> None:
        tokens, flops, secs = (float(x) for x in self._global(list(win)))
        world = self.env.world_size
        if secs <= 0:
            return
        tok_s = tokens / (secs / world)
        mfu = flops / (secs / world) / (self.peak_flops * world)
        history["perf"].append({"step": step, "tokens_per_s": tok_s, "mfu": mfu})
        rec.log({"step": step, "tokens_per_s": tok_s, "mfu": mfu})
        rec.scalar("perf/tokens_per_s", tok_s, step)
        rec.scalar("perf/mfu", mfu, step)
        lv = history["loss"][-1][1] if history["loss"] else float("nan")
        if self.env.rank == 0:
            write(f"[{self.kind}] step {step}/{self.total} loss {lv:.4f} tokens/s {tok_s:,.0f} "
                  f"MFU {100 * mfu:.2f}%")

    def _periodic_eval(self, step: int, history: Dict[str, list], rec: Recorder,
                       write: Callable[[str], None], stop_state: Dict[str, Any]) -> None:
        e, t = self.cfg.eval, self.cfg.train
        met = self.evaluate("valid", e.eval_users)
        history["eval"].append({"step": step, "split": "valid", **met})
        rec.log({"step": step, "split": "valid", **met})
        for k, v in met.items():
            rec.scalar(f"valid/{k}", v, step)
        value = met[e.metric]
        if stop_state["best"] is None or value > stop_state["best"]:
            stop_state.update(best=value, best_step=step, bad=0)
            if e.restore_best:
                self._sync_replicas()  # 2-D: the checkpoint holds one copy (the merged one)
                ckpt.save(self.best_root, step, self.dmp, self.optimizer,
                          {"history": history, "early_stopping": stop_state}, keep=1)
        else:
            stop_state["bad"] += 1
            if t.early_stopping_patience and stop_state["bad"] >= t.early_stopping_patience:
                stop_state["stopped"] = True
        if self.env.rank == 0:
            write(f"[{self.kind}] step {step} valid " +
                  " ".join(f"{k} {v:.4f}" for k, v in met.items()) +
                  (" (early stop)" if stop_state["stopped"] else ""))
