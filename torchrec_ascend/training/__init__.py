"""The generative-recommender trainer as a library (and ``python -m torchrec_ascend.training``).

    from torchrec_ascend.training import load_config, run_experiment
    cfg, _ = load_config(overrides=["data.files=[\\"events.csv\\"]", "train.epochs=3"])
    results = run_experiment(cfg, out="runs/events")
    print(results["models"]["hstu"]["test"]["ndcg@10"])

Modules (one concern each): :mod:`.config` (the experiment's sections, loading, overrides),
:mod:`.sources` (the ``data`` section -> sequences), :mod:`.task` (what the trainer needs from a
task), :mod:`.retrieval` (next-item retrieval: split, batches, evaluator, task),
:mod:`.balancing` (a rank's share of a jagged batch), :mod:`.trainer` (``Trainer``, any task),
:mod:`.checkpoint` (atomic, verified DCP checkpoints), :mod:`.run_folder` (one run per output
folder), :mod:`.recorder` (log.jsonl, TensorBoard, plot), :mod:`.console` (messages and the
progress bar), :mod:`.process_group`, :mod:`.pipelines` (DMP + train pipeline of
``train.pipeline``), :mod:`.precision`, :mod:`.experiment` (a config end to end), :mod:`.cli`.
docs/training.md is the guide.
"""

from __future__ import annotations

from .config import (ConfigError, DataConfig, EvalConfig, ExperimentConfig, ModelConfig,
                     TrainConfig, apply_overrides, config_from_dict, load_config)
from .experiment import run_experiment
from .pipelines import make_pipeline
from .retrieval import RetrievalTask, Split, leave_one_out, leave_two_out
from .task import Task
from .trainer import NonFiniteTrainingError, Trainer

__all__ = [
    "ConfigError", "DataConfig", "EvalConfig", "ExperimentConfig", "ModelConfig",
    "NonFiniteTrainingError", "RetrievalTask", "Split", "Task", "TrainConfig", "Trainer",
    "apply_overrides", "config_from_dict", "leave_one_out", "leave_two_out", "load_config",
    "make_pipeline", "run_experiment",
]
