"""``Trainer``: one model of a :class:`~.task.Task` trained and evaluated, whatever the task.

    trainer = Trainer(cfg, task, env, out="runs/x", kind="hstu", peak_flops=peak)
    result = trainer.fit()   # {"valid", "test", "tokens_per_s", "mfu", "history", ...}

What runs where (docs/training.md):

* the task's model under torchrec_ascend's ``DistributedModelParallel(staleness=train.staleness)``
  (or the 2-D ``TwoDimModelParallel``; :func:`~.pipelines.wrap_model`) on ``env.device``, its
  tables sharded by the planner of ``train.planner``
  (:func:`torchrec_ascend.distributed.planner.make_planner`) and trained by row-wise Adagrad
  fused into the backward; the dense part's gradients summed over ranks and stepped by AdamW
  (+ gradient clipping);
* every step through the train pipeline of ``train.pipeline``, fed by the task's batches; each
  step's stage record goes to log.jsonl and TensorBoard, and ``<out>/<kind>/pipeline.png`` draws
  a few steps at the end;
* training runs in segments between evaluation / checkpoint steps: a segment's batch iterator
  ends there, the pipeline drains, and evaluation (pipeline detached) or the checkpoint sees a
  model with no batch in flight.  Dropout is seeded by the step, so results do not depend on
  where segments (or a kill and a resume) fall;
* a non-finite loss or dense gradient norm ends training at that step with
  :class:`NonFiniteTrainingError` (nothing of that step is checkpointed); a step that exceeds
  ``train.step_timeout_s`` (its collectives included: the loss and throughput all-reduces)
  ends the job on every rank; an evaluation or a checkpoint that exceeds the larger of 600 s
  and that limit too.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist

from ..device import dtype_name
from ..distributed.data_parallel import summed_sparse_gradients
from ..distributed.planner import make_planner
from ..distributed.train_pipeline import PeerFailureError
from ..distributed.train_pipeline.faults import is_peer_failure
from . import checkpoint as ckpt
from .console import Console
from .lr_schedule import lr_schedule
from .pipelines import draw_pipeline_png, make_pipeline, step_row, wrap_model
from .precision import resolve_precision
from .process_group import DistEnv
from .recorder import Recorder
from .task import Task, sparse_parameters

__all__ = ["Trainer", "DenseOptimizer", "NonFiniteTrainingError", "total_steps"]


class NonFiniteTrainingError(RuntimeError):
    """Training produced a non-finite loss or gradient norm at ``step`` (nothing of that step
    was checkpointed)."""

    def __init__(self, step: int, what: str, value: float) -> None:
        super().__init__(f"training diverged at step {step}: the {what} is {value} (lower "
                         "train.lr / train.sparse_lr, or set train.clip_grad_norm); the last "
                         "checkpoint before it is kept")
        self.step, self.what, self.value = step, what, value

    def __reduce__(self):
        return (type(self), (self.step, self.what, self.value))


def gradient_norm(grads: List[torch.Tensor]) -> torch.Tensor:
    """The global L2 norm of ``grads``, as ``torch.nn.utils.get_total_norm`` (a 0-d tensor).

    fp32 / fp64 gradients on the CPU: the square root of the sum (in float64) of each gradient's
    dot product with itself (BLAS, one pass each; get_total_norm's per-tensor norms take about
    twice as long: the paper config's ~11M fp32 gradients, cold caches, 4.5 vs 2.4-2.8 ms); a sum
    that overflows or is not finite is decided by get_total_norm.  Elsewhere get_total_norm."""
    if grads and all(g.device.type == "cpu" and g.dtype in (torch.float32, torch.float64)
                     for g in grads):
        total = 0.0
        for g in grads:
            v = g.reshape(-1)
            total += float(torch.dot(v, v))
        if math.isfinite(total):
            return torch.tensor(math.sqrt(total), dtype=grads[0].dtype)
    return torch.nn.utils.get_total_norm(grads)


class DenseOptimizer:
    """AdamW over the dense parameters with optional global-norm gradient clipping before each
    step (the interface TorchRec's pipelines call: ``zero_grad`` / ``step``).  A non-finite
    gradient norm raises :class:`NonFiniteTrainingError` before any weight changes.  Parameters
    all on the CPU take torch's fused CPU AdamW (the same update, one kernel per parameter
    instead of ~6 elementwise ops: paper config 41.5 -> 13.0 ms per step, docs/training.md),
    which also applies the clipping factor (its ``grad_scale``: the gradients are divided by
    ``(norm + 1e-6) / clip`` in the update's own pass, equal to clip_grad_norm_'s multiply up to
    one rounding); other devices (npu) the default implementation."""

    def __init__(self, params: List[torch.nn.Parameter], lr: float, weight_decay: float,
                 clip: Optional[float], schedule: Optional[Callable[[int], float]] = None
                 ) -> None:
        self.params = list(params)
        fused = bool(self.params) and all(p.device.type == "cpu" for p in self.params)
        self.fused = fused
        self.inner = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay,
                                       betas=(0.9, 0.98), fused=fused or None)
        self.clip = clip
        self.lr = lr
        self.schedule = schedule
        self.step_number = 0  # the trainer's step being trained (for the error)

    @property
    def param_groups(self) -> list:
        return self.inner.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Optional[Callable[[], Any]] = None) -> None:
        grads = [p for p in self.params if p.grad is not None]
        scale: Optional[torch.Tensor] = None
        if grads:
            norm = gradient_norm([p.grad for p in grads])
            if not bool(torch.isfinite(norm)):
                raise NonFiniteTrainingError(self.step_number, "dense gradient norm", float(norm))
            # clip_grad_norm_'s scaling, skipped where its factor min(1, clip / (norm + 1e-6))
            # is 1 (bit-identical: the multiply by 1.0 was a pass over every gradient)
            if self.clip and float(norm) + 1e-6 > self.clip:
                if self.fused:
                    scale = (norm.float() + 1e-6) / self.clip
                else:
                    torch.nn.utils.clip_grads_with_norm_(grads, self.clip, norm)
        if self.schedule is not None:
            for group in self.inner.param_groups:
                group["lr"] = self.lr * self.schedule(self.step_number - 1)
        if scale is None:
            self.inner.step()
            return
        # the fused kernel divides each gradient by ``grad_scale`` in its own pass (and stores
        # the clipped gradient back): the clip costs no pass over the gradients of its own
        # (the interface torch.amp.GradScaler uses: an attribute present during the step)
        self.inner.grad_scale = scale
        try:
            self.inner.step()
        finally:
            del self.inner.grad_scale

    def state_dict(self) -> Dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        fused = [g.get("fused") for g in self.inner.param_groups]
        self.inner.load_state_dict(state)
        for group, f in zip(self.inner.param_groups, fused):  # this run's devices decide
            group["fused"] = f


def total_steps(cfg: Any, steps_per_epoch: int) -> int:
    """``train.steps``, else ``ceil(train.epochs x steps_per_epoch)`` (default epochs when
    neither is set)."""
    from .config import DEFAULT_EPOCHS

    t = cfg.train
    if t.steps is not None:
        return int(t.steps)
    epochs = t.epochs if t.epochs is not None else DEFAULT_EPOCHS
    return max(1, int(np.ceil(epochs * steps_per_epoch)))


class Trainer:
    """Trains model ``kind`` of ``task`` (module docstring).  ``out``: the run's folder (the
    model's log and checkpoints go to ``out/<kind>/``); ``peak_flops``: per-rank peak for MFU;
    ``resume``: continue from the newest intact checkpoint; ``console``: where messages go
    (through the progress bar); ``track_versions``: the ``semi_async`` pipeline records which
    parameter version each lookup read (``pipeline.versions``; tests); ``stage``: a second
    training of the same model kind (e.g. ``refit``: its log and checkpoints go to
    ``out/<kind>/<stage>/``); ``stop_fraction``: stop after that share of the run's total steps
    (the learning-rate schedule still spans the whole run)."""

    def __init__(self, cfg: Any, task: Task, env: DistEnv, out: str, kind: str,
                 peak_flops: float, progress: bool = True, resume: bool = False,
                 console: Optional[Console] = None, track_versions: bool = False,
                 stage: str = "", stop_fraction: Optional[float] = None) -> None:
        self.cfg, self.task, self.env, self.out, self.kind = cfg, task, env, out, kind
        self.peak_flops, self.progress, self.resume = peak_flops, progress, resume
        self.console = console if console is not None else Console(env.rank == 0)
        self._track_versions = track_versions
        self.stop_fraction = stop_fraction
        self.name = f"{kind}/{stage}" if stage else kind  # its log's folder, its console label
        self.root = f"{out}/{self.name}"
        self.best_root = f"{self.root}/best"
        self._build()

    # ------------------------------------------------------------------ set-up
    def _build(self) -> None:
        from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
        from torchrec.optim.optimizers import in_backward_optimizer_filter
        from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

        t, env, task = self.cfg.train, self.env, self.task
        self.compute_dtype, self.precision_reason = resolve_precision(t.precision, env.device)
        torch.manual_seed(t.seed)
        model = task.build_model(self.kind, self.compute_dtype)
        sparse = sparse_parameters(model)
        apply_optimizer_in_backward(RowWiseAdagrad, sparse,
                                    {"lr": task.sparse_lr(self.kind, t.sparse_lr), "eps": 1e-8})
        sparse_ids = {id(p) for p in sparse}
        self.num_dense = sum(p.numel() for p in model.parameters() if id(p) not in sparse_ids)
        sharders = task.sharders()
        planner = make_planner(
            t.planner, compute_device=env.device.type, world_size=env.world_size,
            local_world_size=env.local_world_size,
            constraints={name: [t.sharding] for name in task.table_names(self.kind)},
            dense_bytes=16 * self.num_dense, sync_every=t.sync_every)  # param, grad, 2 AdamW
        self.plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
        self.dmp = wrap_model(model, env.device, self.plan, sharders, t.staleness, planner,
                              t.replica_merge)
        task.init_tables(self.dmp, t.seed)
        dense = [p for _, p in in_backward_optimizer_filter(self.dmp.named_parameters())]
        self.batches = task.batches(self.kind, env.rank, env.world_size, self._balance_group())
        self.schedule_total = total_steps(self.cfg, self.batches.steps_per_epoch)
        self.total = self.schedule_total
        if self.stop_fraction is not None:
            self.total = max(1, min(self.total, round(self.stop_fraction * self.total)))
        self.optimizer = DenseOptimizer(dense, t.lr, t.weight_decay, t.clip_grad_norm or None,
                                        lr_schedule(t.lr_schedule, self.schedule_total))
        self.pipeline = make_pipeline(t.pipeline, self.dmp, self.optimizer, env.device,
                                      t.staleness, t.step_timeout_s, self._track_versions,
                                      t.sync_warmup_steps)
        self.sharding_type = ", ".join(sorted({opt.sharding_type for mod in self.plan.plan.values()
                                               for opt in mod.values()}))

    def _balance_group(self) -> Optional[dist.ProcessGroup]:
        """A process group of its own for the all_to_all balancer (collective): the batches
        are built inside the pipeline (on its batch thread in ``semi_async``), so the
        balancer's collectives must not share a group with the pipeline's."""
        if self.cfg.train.balance != "all_to_all" or self.env.world_size == 1:
            return None
        return dist.new_group(ranks=list(range(self.env.world_size)))

    @property
    def model(self) -> torch.nn.Module:
        return self.dmp.module

    # ------------------------------------------------------------------ pieces
    def _boundaries(self, start: int) -> List[int]:
        t = self.cfg.train
        marks = {self.total}
        for every in (t.eval_every, t.checkpoint_every):
            if every:
                marks.update(range(every, self.total, every))
        return sorted(m for m in marks if m > start)

    def _load(self, path: str) -> Dict[str, Any]:
        """Load checkpoint ``path`` into the model and the dense optimizer; its trainer state.
        2-D: the model counts its steps from the checkpoint's (always of synced replicas)."""
        with self.pipeline.watchdog.watch(f"loading checkpoint {path}", step=False):
            state = ckpt.load(path, self.dmp, self.optimizer)
        self.dmp.restart_count(int(state["step"]))
        return state

    def _save(self, root: str, step: int, state: Dict[str, Any], keep: int) -> None:
        with self.pipeline.watchdog.watch(f"checkpoint of step {step}", step=False):
            self.dmp.sync_replicas()  # 2-D: the checkpoint holds one copy (the merged one)
            ckpt.save(root, step, self.dmp, self.optimizer, state, keep=keep)

    def _global(self, values: List[float]) -> torch.Tensor:
        v = torch.tensor(values, dtype=torch.float64)
        if self.env.world_size > 1:
            dist.all_reduce(v)
        return v

    def evaluate(self, which: str, limit: Optional[int] = None) -> Dict[str, Any]:
        """Metrics on ``which`` (``valid`` / ``test``), pipeline detached (collective); 2-D: of
        the hosts' replicas merged."""
        with self.pipeline.watchdog.watch(f"evaluation on {which}", step=False):
            self.pipeline.detach()
            share = self.task.eval_share(which, self.env.rank, self.env.world_size, limit)
            with self.dmp.merged_weights():
                return self.task.evaluate(self.model, which, share, self.env.device)

    # ------------------------------------------------------------------ the loop
    def train_segment(self, start: int, end: int,
                      on_step: Optional[Callable[[int, float, torch.Tensor, float], None]] = None
                      ) -> int:
        """Train steps ``[start, end)`` through the pipeline (it drains at ``end``); calls
        ``on_step(step_number, global_loss, stats, seconds)`` after each (``global_loss``: the
        sum of the ranks' losses; non-finite: :class:`NonFiniteTrainingError`); returns
        ``end``."""
        seed = self.cfg.train.seed
        it = self.batches.stream(start, end)
        step = start
        while True:
            torch.manual_seed(seed * 7919 + step)  # dropout: a function of the step
            self.optimizer.step_number = step + 1
            tic = time.perf_counter()
            with self.pipeline.watchdog.watch(f"step {step + 1}"):
                try:
                    loss, stats = self.pipeline.progress(it)
                except StopIteration:
                    break
                try:
                    self.dmp.step_done()  # 2-D: syncs every train.sync_every
                    lv = float(self._global([float(loss.detach().cpu())])[0])
                except Exception as exc:
                    if is_peer_failure(exc):
                        raise PeerFailureError.of(
                            exc, f"rank {self.env.rank}: step {step + 1}") from exc
                    raise
                if not math.isfinite(lv):
                    raise NonFiniteTrainingError(step + 1, "loss", lv)
                if on_step is not None:  # its throughput all-reduce is part of the step
                    on_step(step + 1, lv, stats, time.perf_counter() - tic)
            step += 1
        if step != end:
            raise RuntimeError(f"train_segment: ran {step - start} steps, expected {end - start}")
        return step

    def fit(self) -> Dict[str, Any]:
        """Train to ``total`` steps (from the newest intact checkpoint with ``resume``), evaluate;
        returns the results, ``history`` (losses, evaluations, throughput) included."""
        t = self.cfg.train
        start = 0
        history: Dict[str, list] = {"loss": [], "eval": [], "perf": []}
        stop = {"best": None, "best_step": None, "bad": 0, "stopped": False}
        if self.resume:
            last = ckpt.find_checkpoint(self.root)
            if last is not None:
                st = self._load(last)
                start, history, stop = int(st["step"]), st["history"], st["early_stopping"]
                if t.sync_warmup_steps:  # the warm-up counts global steps
                    self.pipeline.sync_warmup_steps = max(0, t.sync_warmup_steps - start)
                self.console.say(f"[{self.name}] resumed from {last} at step {start}")
        rec = Recorder(self.out, self.name, self.env.rank == 0, start_step=start)
        rec.log({"step": start, "precision": t.precision,
                 "compute_dtype": dtype_name(self.compute_dtype), "reason": self.precision_reason})
        win = np.zeros(3)  # tokens, flops, seconds
        seg_end = [start]

        def on_step(n: int, lv: float, stats: torch.Tensor, secs: float) -> None:
            win[:] += [float(stats[1]), float(stats[2]), secs]
            history["loss"].append((n, lv))
            row = step_row(self.pipeline.last_stats)
            if self.batches.last_balance_s is not None:
                row["balance_ms"] = 1e3 * self.batches.last_balance_s
            rec.log({"step": n, "loss": lv, **row})
            rec.scalar("train/loss", lv, n)
            for key, value in row.items():
                rec.scalar(f"pipeline/{key}", value, n)
            self.console.advance(loss=lv)
            if n % t.log_every == 0 or n == seg_end[0]:
                self._log_perf(win, n, history, rec)
                win[:] = 0

        step = start
        self.console.open_bar(f"train {self.name}", self.total, start, self.progress)
        try:
            with summed_sparse_gradients():
                step = self._train_to(step, on_step, seg_end, history, rec, stop)
        finally:
            self.console.close_bar()
            self.batches.close()
            self.pipeline.close()
        return self._finish(step, history, rec, stop)

    def _train_to(self, step: int, on_step: Callable, seg_end: List[int],
                  history: Dict[str, list], rec: Recorder, stop: Dict[str, Any]) -> int:
        """The segments from ``step`` to ``total`` (or early stop), with periodic evaluations
        and checkpoints; returns the last step."""
        t = self.cfg.train
        for end in self._boundaries(step):
            if stop["stopped"]:
                break
            seg_end[0] = end
            step = self.train_segment(step, end, on_step)
            if t.eval_every and step % t.eval_every == 0 and step < self.total:
                self._periodic_eval(step, history, rec, stop)
            if t.checkpoint_every and step % t.checkpoint_every == 0:
                self._save(self.root, step, {"history": history, "early_stopping": stop,
                                             "kind": self.kind}, t.keep_checkpoints)
        return step

    def _finish(self, step: int, history: Dict[str, list], rec: Recorder,
                stop: Dict[str, Any]) -> Dict[str, Any]:
        """The picture, the best model back (``eval.restore_best``), the final validation and
        test; the results."""
        t, e = self.cfg.train, self.cfg.eval
        if self.env.rank == 0:
            draw_pipeline_png(self.pipeline, f"{self.root}/pipeline.png",
                              title=f"{self.name}: train.pipeline={t.pipeline}, "
                                    f"staleness={t.staleness} (rank 0)")
        restored = None
        if e.restore_best and stop["best_step"] not in (None, step):
            best = ckpt.find_checkpoint(self.best_root)
            if best is None:
                raise RuntimeError(f"eval.restore_best: no intact checkpoint under "
                                   f"{self.best_root}")
            restored = int(self._load(best)["step"])
            self.console.say(f"[{self.name}] restored the best validation model (step {restored})")
        with self.pipeline.watchdog.watch("the replicas' final sync", step=False):
            self.dmp.sync_replicas()  # 2-D: the final evaluation is of the merged replicas
        valid = self.evaluate("valid") if self.task.has_valid else None
        test = self.evaluate("test")
        for name, met in (("valid", valid), ("test", test)):
            for k, v in _scalars(met or {}).items():
                rec.scalar(f"final_{name}/{k}", v, step)
        if valid is not None:
            history["eval"].append({"step": step, "split": "valid", **valid})
        rec.log({"step": step, "split": "final", "valid": valid, "test": test})
        rec.close()
        perf = history.get("perf", [])
        return {"valid": valid, "test": test,
                "tokens_per_s": perf[-1]["tokens_per_s"] if perf else None,
                "mfu": perf[-1]["mfu"] if perf else None, "steps": step,
                "stopped_early": bool(stop["stopped"]),
                "best_valid": {"step": stop["best_step"], e.metric: stop["best"]},
                "restored_step": restored,
                "evals": history["eval"], "sharding": self.sharding_type,
                "compute_dtype": dtype_name(self.compute_dtype),
                "world_size": self.env.world_size, "history": history}

    def _log_perf(self, win: np.ndarray, step: int, history: Dict[str, list],
                  rec: Recorder) -> None:
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
        self.console.say(f"[{self.name}] step {step}/{self.total} loss {lv:.4f} tokens/s "
                         f"{tok_s:,.0f} MFU {100 * mfu:.2f}%")

    def _periodic_eval(self, step: int, history: Dict[str, list], rec: Recorder,
                       stop: Dict[str, Any]) -> None:
        e, t = self.cfg.eval, self.cfg.train
        met = self.evaluate("valid", e.eval_users)
        history["eval"].append({"step": step, "split": "valid", **met})
        rec.log({"step": step, "split": "valid", **met})
        for k, v in _scalars(met).items():
            rec.scalar(f"valid/{k}", v, step)
        value = self.task.metric(met, e.metric)
        if stop["best"] is None or value > stop["best"]:
            stop.update(best=value, best_step=step, bad=0)
            if e.restore_best:
                self._save(self.best_root, step, {"history": history, "early_stopping": stop},
                           keep=1)
        else:
            stop["bad"] += 1
            if t.early_stopping_patience and stop["bad"] >= t.early_stopping_patience:
                stop["stopped"] = True
        shown = {k: v for k, v in _scalars(met).items()
                 if "/" not in k or k.endswith("/auc") or k.endswith("/rmse")}
        self.console.say(f"[{self.name}] step {step} valid " +
                         " ".join(f"{k} {v:.4f}" for k, v in shown.items()) +
                         (" (early stop)" if stop["stopped"] else ""))


def _scalars(metrics: Dict[str, Any]) -> Dict[str, float]:
    """The numeric entries of a metrics dict, nested ones flattened as ``outer/inner``
    (``None`` entries, e.g. a task with one class, are left out)."""
    out: Dict[str, float] = {}
    for k, v in metrics.items():
        if isinstance(v, dict):
            out.update({f"{k}/{kk}": vv for kk, vv in _scalars(v).items()})
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = float(v)
    return out
