"""Refit: a model trained again on the training and validation data together, for the share of
its run that validation chose (``ranking.refit``).

The first training picks its step on the validation split (the restored best with
``eval.restore_best``, else its last step).  A fresh model of the same kind and seed is then
trained on the task's :meth:`~.task.Task.refit_task` (training + validation data), with the same
config, the same number of epochs (a run in ``train.steps``: as many epochs as those steps
were) and learning-rate schedule over them, and stopped after the same share of its steps; it
is not evaluated on validation (it trained on it).  Its test metrics replace the first model's
in the results; the first model's validation metrics stay, its chosen step and its own test go
to ``results["refit"]``.  A refit's log and checkpoints are
``<out>/<kind>/refit/`` (``--resume`` continues it too).

Why: ranking data drift by the day, and the validation days are the latest before the test.  On
the shared KuaiRand-Pure slice cut before its test days (4/28 as the test, 4/27 validation),
the refit gained 0.008 AUC on is_click and long_view over the same model trained without the
validation day (docs/ranking.md).
"""

from __future__ import annotations

import copy
from typing import Any, Dict

from .console import Console
from .process_group import DistEnv
from .task import Task
from .trainer import Trainer

__all__ = ["refit_config", "refit"]


def refit_config(cfg: Any, steps_per_epoch: int) -> Any:
    """``cfg`` without periodic validation, early stopping or restoring a best model (the refit
    trains on the validation data and runs for a fixed share of its steps); a run given in
    ``train.steps`` becomes that many epochs of the first training's ``steps_per_epoch``, so
    that the refit passes over its larger data as often."""
    out = copy.deepcopy(cfg)
    if out.train.steps is not None:
        out.train.epochs = out.train.steps / steps_per_epoch
        out.train.steps = None
    out.train.eval_every = 0
    out.train.early_stopping_patience = 0
    out.eval.restore_best = False
    return out


def refit(cfg: Any, task: Task, env: DistEnv, out: str, kind: str, peak_flops: float,
          first: Trainer, result: Dict[str, Any], console: Console, progress: bool = True,
          resume: bool = False) -> Dict[str, Any]:
    """``result`` (of ``first.fit()``) with the refit model's test metrics (module docstring).
    ``task``: the task ``first`` trained on; it must offer a refit task."""
    view = task.refit_task()
    if view is None:
        raise ValueError("refit: the task has no refit (its config does not ask for one)")
    chosen = int(result["restored_step"] or result["steps"])
    trainer = Trainer(refit_config(cfg, first.batches.steps_per_epoch), view, env, out, kind,
                      peak_flops, progress=progress, resume=resume, console=console,
                      stage="refit", stop_fraction=chosen / first.total)
    console.say(f"[{kind}] refit on the training + validation data: {trainer.total} of "
                f"{trainer.schedule_total} steps ({trainer.batches.steps_per_epoch} per epoch; "
                f"validation chose step {chosen} of {first.total})")
    second = trainer.fit()
    merged = dict(result)
    merged["test"] = second["test"]
    merged["refit"] = {"chosen_step": chosen, "of_steps": first.total,
                       "steps": second["steps"], "schedule_steps": trainer.schedule_total,
                       "steps_per_epoch": trainer.batches.steps_per_epoch,
                       "test_without_refit": result["test"]}
    return merged
