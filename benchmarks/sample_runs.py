"""Quality checks on the shared KuaiRand-27K sample: the KuaiRand example's ``sample`` config
(HSTU only, no periodic evaluation or checkpoints), trained by
:class:`torchrec_ascend.training.Trainer` in this process, final validation on every user.
Used by ``semi_async_quality.py`` and ``precision_quality.py``."""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any, Dict, Optional, Sequence

import torch

__all__ = ["sample_config", "sample_absent", "sample_split", "train_valid", "run_description", "rel"]


def sample_config(steps: int, overrides: Sequence[str] = ()):
    """The ``sample`` config for ``steps`` steps, HSTU only, plus ``overrides``."""
    from examples.kuairand.train import build_config

    return build_config("sample", [f"train.steps={steps}", "train.eval_every=0",
                                   "train.checkpoint_every=0", 'models=["hstu"]', *overrides])


def sample_absent(steps: int) -> bool:
    """True (and says so) when the shared sample's file is absent: the script skips."""
    path = sample_config(steps).data.files[0]
    if os.path.exists(path):
        return False
    print(f"skipped: {path} is absent")
    return True


def sample_split(steps: int):
    """``(env, split)`` for the sample (one thread, a size-1 process group), or ``None`` when
    the sample's file is absent."""
    from torchrec_ascend.training.process_group import init_distributed
    from torchrec_ascend.training.experiment import prepare_task

    torch.set_num_threads(1)
    if sample_absent(steps):
        return None
    return init_distributed("cpu"), prepare_task(sample_config(steps)).split


def train_valid(cfg, split, env, peak_flops: float = 1e9) -> Dict[str, Any]:
    """Train ``cfg``'s HSTU on ``split``; the trainer's result plus ``seconds``."""
    from torchrec_ascend.training import RetrievalTask, Trainer
    from torchrec_ascend.training.console import Console

    tic = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        res = Trainer(cfg, RetrievalTask(cfg, split), env, out, "hstu", peak_flops=peak_flops,
                      progress=False, console=Console(False)).fit()
    res["seconds"] = time.perf_counter() - tic
    return res


def rel(a: float, b: Optional[float]) -> Optional[float]:
    """``a / b - 1`` (None where b is 0 or None)."""
    return a / b - 1 if b else None


def run_description(steps: int, seeds: Sequence[int], quick: bool) -> Dict[str, Any]:
    """The ``config`` entry of a quality script's JSON."""
    return {"config": "examples/kuairand/configs/sample.json", "models": ["hstu"],
            "steps": steps, "seeds": list(seeds), "world_size": 1, "threads": 1, "quick": quick}
