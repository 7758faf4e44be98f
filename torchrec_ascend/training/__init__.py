"""The generative-recommender trainer as a library (and ``python -m torchrec_ascend.training``).

    from torchrec_ascend.training import load_config, run_experiment
    cfg, _ = load_config(overrides=["data.files=[\\"events.csv\\"]", "train.epochs=3"])
    results = run_experiment(cfg, out="runs/events")
    print(results["models"]["hstu"]["test"]["ndcg@10"])

Modules (one concern each): :mod:`.config` (typed configs, validation, overrides),
:mod:`.sources` (data source -> sequences), :mod:`.split` (leave-two-out), :mod:`.batches`
(deterministic batches, negatives, balance hook), :mod:`.evaluator` (full-corpus metrics),
:mod:`.checkpoint` (atomic DCP checkpoints), :mod:`.recorder` (log.jsonl, TensorBoard, plot),
:mod:`.distributed` (process group, DDP wrapper), :mod:`.pipelines` (DMP + train pipeline of ``train.pipeline``),
:mod:`.trainer` (``Trainer``), :mod:`.experiment` (a config end to end), :mod:`.cli`.
docs/training.md is the guide.
"""

from __future__ import annotations

from .config import (ConfigError, DataConfig, EvalConfig, ExperimentConfig, ModelConfig,
                     TrainConfig, apply_overrides, config_from_dict, load_config)
from .experiment import run_experiment
from .pipelines import make_pipeline
from .split import Split, leave_one_out, leave_two_out
from .trainer import Trainer

__all__ = [
    "ConfigError", "DataConfig", "EvalConfig", "ExperimentConfig", "ModelConfig",
    "Split", "TrainConfig", "Trainer", "apply_overrides", "config_from_dict", "leave_one_out",
    "leave_two_out", "load_config", "make_pipeline", "run_experiment",
]
