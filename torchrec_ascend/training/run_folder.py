"""The run's output folder (``--out``): one run per folder, checked before any work starts.

* A folder that holds a run (``run.json``, ``results.json``, ``tb/`` or a model's ``log.jsonl``
  / ``checkpoints/``) is refused unless the run is continued (``--resume``) or replaced
  (``--overwrite``: its run files are removed when the new run starts writing, nothing else in
  the folder).
* ``--resume`` needs a checkpoint, and refuses one trained with another config in a key that
  changes the model or the data (:func:`identity_diff`), naming the keys.
* ``--out`` and ``data.cache_dir`` must be writable directories (or creatable ones): a path under
  a file or on a read-only file system is an error before the data is read.

``run.json`` records the config (and the resumes) of the run the folder holds.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import tempfile
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..options import OptionError

__all__ = ["RunFolder", "RUN_RECORD", "IDENTITY", "identity_diff", "check_writable_dir"]

RUN_RECORD = "run.json"
_RUN_FILES = (RUN_RECORD, "results.json", "training.png", "tb")

IDENTITY: Tuple[str, ...] = ("task", "models", "data", "model", "ranking", "eval.holdout",
                             "train.batch_size", "train.seed", "train.negatives",
                             "train.num_negatives", "train.sampler")
"""Config keys (sections or dotted keys) that change the model or the data a checkpoint holds:
a resume must keep them.  Others (steps, epochs, learning rates, pipelines, logging cadence,
evaluation) may change on a resume."""


def _flat(d: Any, prefix: str = "") -> Dict[str, Any]:
    if not isinstance(d, Mapping):
        return {prefix: d}
    out: Dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def identity_diff(old: Mapping[str, Any], new: Mapping[str, Any],
                  identity: Sequence[str] = IDENTITY) -> List[Tuple[str, Any, Any]]:
    """``(key, old value, new value)`` of every config key under ``identity`` that differs."""
    a, b = _flat(old), _flat(new)
    out = []
    for key in sorted(set(a) | set(b)):
        if any(key == k or key.startswith(k + ".") for k in identity):
            if a.get(key) != b.get(key):
                out.append((key, a.get(key), b.get(key)))
    return out


def check_writable_dir(key: str, path: str) -> None:
    """``path`` is (or can be created as) a directory this process can write into; else
    :class:`OptionError` naming ``key`` (a path under a file, a read-only file system, no
    permission).  Creates nothing that stays: a probe file in the nearest existing folder."""
    path = os.path.abspath(path)
    probe_dir = path
    while not os.path.exists(probe_dir):
        parent = os.path.dirname(probe_dir)
        if parent == probe_dir:
            break
        probe_dir = parent
    if not os.path.isdir(probe_dir):
        where = "is a file" if probe_dir == path else f"is under a file ({probe_dir})"
        raise OptionError(key, f"{path!r} {where}, not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=probe_dir)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise OptionError(key, f"cannot write into {probe_dir!r}: {e.strerror}") from None


class RunFolder:
    """The output folder of one run (module docstring)."""

    def __init__(self, out: str, model_dirs: Iterable[str]) -> None:
        self.out = out
        self.model_dirs = list(model_dirs)

    def run_files(self) -> List[str]:
        """The files and folders of a run here (relative paths)."""
        found = [f for f in _RUN_FILES if os.path.exists(os.path.join(self.out, f))]
        if os.path.isdir(self.out):
            for d in sorted(os.listdir(self.out)):
                for f in ("log.jsonl", "checkpoints"):
                    if os.path.exists(os.path.join(self.out, d, f)):
                        found.append(f"{d}/{f}")
        return found

    def checkpoint_roots(self) -> List[str]:
        return [os.path.join(self.out, d) for d in self.model_dirs
                if os.path.isdir(os.path.join(self.out, d, "checkpoints"))]

    def record(self) -> Optional[Dict[str, Any]]:
        try:
            with open(os.path.join(self.out, RUN_RECORD)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def check(self, config: Mapping[str, Any], resume: bool, overwrite: bool) -> None:
        """Refuse what would mix two runs or resume the wrong one (:class:`OptionError`)."""
        if resume and overwrite:
            raise OptionError("--overwrite", "with --resume: continue the run or replace it, "
                                             "not both")
        check_writable_dir("--out", self.out)
        files = self.run_files()
        if resume:
            if not any(os.path.isdir(os.path.join(r, "checkpoints"))
                       for r in self.checkpoint_roots()):
                raise OptionError("--resume", f"{self.out!r} holds no checkpoint to continue "
                                              "from (train without --resume to start a run)")
            old = self.record()
            if old is not None:
                diff = identity_diff(old.get("config", {}), config)
                if diff:
                    shown = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in diff[:6])
                    more = f" (+{len(diff) - 6} more)" if len(diff) > 6 else ""
                    raise OptionError("--resume", f"the run in {self.out!r} was trained with "
                                                  f"another model or data: {shown}{more}; keep "
                                                  "those keys, or use another --out")
        elif files and not overwrite:
            raise OptionError("--out", f"{self.out!r} holds a run ({', '.join(files[:4])}): use "
                                       "--resume to continue it, another folder, or --overwrite "
                                       "to replace it")

    def start(self, config: Mapping[str, Any], resume: bool, overwrite: bool) -> None:
        """Rank 0, when the run starts writing: remove the replaced run's files (``overwrite``),
        create the folder, and write (or extend, on a resume) ``run.json``."""
        if overwrite:
            for f in self.run_files():
                p = os.path.join(self.out, f.split("/")[0] if f.endswith("log.jsonl") or
                                 f.endswith("checkpoints") else f)
                if os.path.isdir(p):
                    shutil.rmtree(p, ignore_errors=True)
                elif os.path.exists(p):
                    os.remove(p)
        os.makedirs(self.out, exist_ok=True)
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        rec = self.record() if resume else None
        if rec is None:
            rec = {"created": now, "config": dict(config), "resumed": []}
        else:
            rec.setdefault("resumed", []).append({"at": now, "config": dict(config)})
        tmp = os.path.join(self.out, RUN_RECORD + ".tmp")
        with open(tmp, "w") as f:
            json.dump(rec, f, indent=1, default=str)
        os.replace(tmp, os.path.join(self.out, RUN_RECORD))
