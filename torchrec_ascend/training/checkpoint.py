"""Atomic, resumable checkpoints: sharded state through ``torch.distributed.checkpoint``.

Layout under ``<root>/checkpoints/`` (the trainer's ``root`` is ``<out>/<model>``)::

    step_00000200/          a complete checkpoint (DCP files + trainer.pt)
    step_00000400.tmp-*/    a save in progress (or killed): never read
    LATEST                  name of the newest complete checkpoint (replaced atomically)

A save writes everything into a ``.tmp-*`` folder (DCP: the model's sharded state dict, including
the ``ShardedTensor`` item table, and the fused sparse optimizer's sharded state; ``trainer.pt``
from rank 0: dense optimizer, step, the trainer's history), fsyncs, then rank 0 renames the
folder (atomic on POSIX) and rewrites ``LATEST`` through a temporary file + ``os.replace``.  A
process killed at any moment leaves the previous complete checkpoint and ``LATEST`` untouched.

Exact resume: the trainer's data order, negatives and dropout are functions of the step
(:mod:`.batches`), so a run resumed from step ``s`` continues as if never stopped.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

__all__ = ["save", "load", "latest", "sharded_state", "LATEST", "TRAINER_FILE"]

LATEST = "LATEST"
TRAINER_FILE = "trainer.pt"


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: str) -> None:
    for root, _, files in os.walk(path):
        for f in files:
            with open(os.path.join(root, f), "rb+") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(root)


def sharded_state(model: torch.nn.Module) -> Dict[str, Any]:
    """What DCP saves and loads in place: model + fused (sparse) optimizer state."""
    state: Dict[str, Any] = {"model": model.state_dict()}
    fused = getattr(model, "fused_optimizer", None)
    if fused is not None:
        state["sparse_opt"] = fused.state_dict()
    return state


def save(root: str, step: int, model: torch.nn.Module, dense_opt: torch.optim.Optimizer,
         trainer_state: Dict[str, Any], keep: int = 2) -> str:
    """Write checkpoint ``step`` atomically (collective: call on every rank); returns its path."""
    ckdir = os.path.join(root, "checkpoints")
    final = os.path.join(ckdir, f"step_{step:08d}")
    tmp = final + ".tmp-save"
    if _rank() == 0:
        os.makedirs(ckdir, exist_ok=True)
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
        os.makedirs(tmp)
    _barrier()
    dcp.save(sharded_state(model), checkpoint_id=tmp, no_dist=not dist.is_initialized())
    if _rank() == 0:
        torch.save({"dense_opt": dense_opt.state_dict(), "step": step, **trainer_state},
                   os.path.join(tmp, TRAINER_FILE))
    _barrier()
    if _rank() == 0:
        _fsync_tree(tmp)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(ckdir)
        latest_tmp = os.path.join(ckdir, LATEST + ".tmp")
        with open(latest_tmp, "w") as f:
            f.write(os.path.basename(final) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(latest_tmp, os.path.join(ckdir, LATEST))
        _fsync_dir(ckdir)
        _prune(ckdir, keep)
    _barrier()
    return final


def _complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, TRAINER_FILE)) and os.path.isfile(
        os.path.join(path, ".metadata"))


def _prune(ckdir: str, keep: int) -> None:
    done = sorted(d for d in os.listdir(ckdir) if d.startswith("step_") and ".tmp" not in d)
    for d in done[:-keep] if keep > 0 else []:
        shutil.rmtree(os.path.join(ckdir, d), ignore_errors=True)


def latest(root: str) -> Optional[str]:
    """The newest complete checkpoint under ``root`` (``LATEST`` first, else a scan), or None."""
    ckdir = os.path.join(root, "checkpoints")
    if not os.path.isdir(ckdir):
        return None
    try:
        with open(os.path.join(ckdir, LATEST)) as f:
            p = os.path.join(ckdir, f.read().strip())
        if _complete(p):
            return p
    except OSError:
        pass
    done = sorted(d for d in os.listdir(ckdir)
                  if d.startswith("step_") and ".tmp" not in d
                  and _complete(os.path.join(ckdir, d)))
    return os.path.join(ckdir, done[-1]) if done else None


def load(path: str, model: torch.nn.Module, dense_opt: torch.optim.Optimizer) -> Dict[str, Any]:
    """Load a checkpoint in place (collective); returns the trainer state (``step``, ...)."""
    state = sharded_state(model)
    dcp.load(state, checkpoint_id=path, no_dist=not dist.is_initialized())
    model.load_state_dict(state["model"])
    if "sparse_opt" in state:
        model.fused_optimizer.load_state_dict(state["sparse_opt"])  # type: ignore[union-attr]
    trainer = torch.load(os.path.join(path, TRAINER_FILE), weights_only=False)
    dense_opt.load_state_dict(trainer.pop("dense_opt"))
    return trainer
