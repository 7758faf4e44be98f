"""Atomic, verified, resumable checkpoints: sharded state through ``torch.distributed.checkpoint``.

Layout under ``<root>/checkpoints/`` (the trainer's ``root`` is ``<out>/<model>``)::

    step_00000200/          a complete checkpoint (DCP files + trainer.pt + MANIFEST.json)
    step_00000400.tmp-*/    a save in progress (or killed): never read
    LATEST                  name of the newest complete checkpoint (replaced atomically)

A save writes everything into a ``.tmp-*`` folder (DCP: the model's sharded state dict, including
the sharded tables, and the fused sparse optimizer's sharded state; ``trainer.pt`` from rank 0:
dense optimizer, step, the trainer's history), then rank 0 writes ``MANIFEST.json`` **last**
(the size and SHA-256 of every other file), fsyncs, renames the folder (atomic on POSIX) and
rewrites ``LATEST`` through a temporary file + ``os.replace``.  A process killed at any moment
leaves the previous complete checkpoint and ``LATEST`` untouched.

Loading verifies: :func:`find_checkpoint` takes the newest checkpoint whose files all match its
manifest (``LATEST``'s first); a damaged one (a file truncated, missing, or overwritten at the
same size) is reported and the next older good one is used, with a warning naming both; nothing
is deleted.  Exact resume: the trainer's data order, negatives and dropout are functions of the
step, so a run resumed from step ``s`` continues as if never stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

__all__ = ["save", "load", "find_checkpoint", "verify", "sharded_state", "LATEST",
           "TRAINER_FILE", "MANIFEST", "CheckpointWarning"]

LATEST = "LATEST"
TRAINER_FILE = "trainer.pt"
MANIFEST = "MANIFEST.json"
_CHUNK = 1 << 22


class CheckpointWarning(UserWarning):
    """A checkpoint failed verification and an older one is used instead."""


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


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _files(path: str) -> List[str]:
    out = []
    for root, _, names in os.walk(path):
        for n in names:
            out.append(os.path.relpath(os.path.join(root, n), path))
    return sorted(f for f in out if f != MANIFEST)


def _write_manifest(path: str, step: int) -> None:
    """Fsync every file, then write the manifest (sizes + SHA-256) and fsync it."""
    files = {}
    for rel in _files(path):
        full = os.path.join(path, rel)
        with open(full, "rb+") as fh:
            os.fsync(fh.fileno())
        files[rel] = {"bytes": os.path.getsize(full), "sha256": _sha256(full)}
    tmp = os.path.join(path, MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"step": step, "files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, MANIFEST))
    for root, _, _ in os.walk(path):
        _fsync_dir(root)


def verify(path: str) -> Optional[str]:
    """None if checkpoint ``path`` is intact, else what is wrong (one line): no manifest, a
    file missing, of another size, or whose SHA-256 differs from the manifest's."""
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            manifest = json.load(f)
        files: Dict[str, Dict[str, Any]] = manifest["files"]
    except OSError:
        return f"no {MANIFEST} (an incomplete or foreign checkpoint)"
    except (ValueError, KeyError, TypeError):
        return f"{MANIFEST} is damaged"
    for name in (TRAINER_FILE, ".metadata"):
        if name not in files:
            return f"{MANIFEST} lists no {name}"
    for rel, rec in files.items():
        full = os.path.join(path, rel)
        try:
            size = os.path.getsize(full)
        except OSError:
            return f"{rel} is missing"
        if size != rec.get("bytes"):
            return f"{rel} has {size} bytes, {rec.get('bytes')} were written"
        if _sha256(full) != rec.get("sha256"):
            return f"{rel} does not match its SHA-256 (the bytes changed after the save)"
    return None


def sharded_state(model: torch.nn.Module) -> Dict[str, Any]:
    """What DCP saves and loads in place: model + fused (sparse) optimizer state."""
    state: Dict[str, Any] = {"model": model.state_dict()}
    fused = getattr(model, "fused_optimizer", None)
    if fused is not None:
        state["sparse_opt"] = fused.state_dict()
    return state


def save(root: str, step: int, model: torch.nn.Module, dense_opt: torch.optim.Optimizer,
         trainer_state: Dict[str, Any], keep: int = 2) -> str:
    """Write checkpoint ``step`` atomically (collective: call on every rank); returns its path.
    Keeps the newest ``keep`` checkpoints."""
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
        _write_manifest(tmp, step)
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


def _complete(ckdir: str) -> List[str]:
    """Names of the renamed (finished) checkpoint folders, oldest first."""
    return sorted(d for d in os.listdir(ckdir) if d.startswith("step_") and ".tmp" not in d
                  and os.path.isdir(os.path.join(ckdir, d)))


def _prune(ckdir: str, keep: int) -> None:
    done = _complete(ckdir)
    for d in done[:-keep] if keep > 0 else []:
        shutil.rmtree(os.path.join(ckdir, d), ignore_errors=True)


def _latest_name(ckdir: str) -> Optional[str]:
    try:
        with open(os.path.join(ckdir, LATEST)) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _find_local(root: str) -> Tuple[Optional[str], List[Tuple[str, str]]]:
    """(newest intact checkpoint or None, [(damaged checkpoint, why)] newer than it)."""
    ckdir = os.path.join(root, "checkpoints")
    if not os.path.isdir(ckdir):
        return None, []
    names = _complete(ckdir)
    latest = _latest_name(ckdir)
    if latest in names:  # LATEST first, then the others newest first
        names.remove(latest)
        names.append(latest)
    bad: List[Tuple[str, str]] = []
    for name in reversed(names):
        path = os.path.join(ckdir, name)
        why = verify(path)
        if why is None:
            return path, bad
        bad.append((path, why))
    return None, bad


def find_checkpoint(root: str) -> Optional[str]:
    """The newest intact checkpoint under ``root`` (module docstring), or None.  Decided on rank
    0 and shared with every rank (collective under a process group); a damaged newer checkpoint
    is reported with a :class:`CheckpointWarning` naming it, why, and the one used instead."""
    found: List[Any] = [None, []]
    if _rank() == 0:
        found = list(_find_local(root))
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(found, src=0)
    path, bad = found
    if _rank() == 0:
        for damaged, why in bad:
            instead = f"using {path}" if path else "no intact checkpoint is left"
            warnings.warn(f"checkpoint {damaged} is damaged ({why}); {instead}",
                          CheckpointWarning, stacklevel=2)
    return path


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
