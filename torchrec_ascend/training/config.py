"""The experiment's configuration: its sections, JSON / YAML loading and ``--set`` overrides.

    cfg, raw = load_config("path/to/config.json", overrides=["train.steps=100"])

An :class:`ExperimentConfig` has sections ``data`` (:class:`~.sources.DataConfig`), ``model``
(:class:`~torchrec_ascend.models.config.ModelConfig`), ``train`` (:class:`TrainConfig`) and
``eval`` (:class:`EvalConfig`), plus ``name``, ``description`` and ``models`` (the encoders to
train, ``hstu`` and / or ``sasrec``).  Each option's choices and rules belong to the component
that interprets it (``train.pipeline`` to :mod:`torchrec_ascend.distributed.train_pipeline`,
``train.planner`` to :mod:`torchrec_ascend.distributed.planner`, ...); this module composes
them (:mod:`torchrec_ascend.options`).  A bad value raises :class:`ConfigError` naming the key
and the rule, e.g. ``train.batch_size: 0 is not an integer >= 1``; an unknown key is an error
too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Union

from ..distributed.load_balance import BalanceMode, check_balance_options
from ..distributed.planner import PlannerKind, ReplicaMerge, TableSharding, check_planner_options
from ..distributed.train_pipeline import PipelineKind, check_pipeline_options
from ..models.config import Encoder, ModelConfig
from ..options import Key, OptionError, check_choice, convert, from_mapping, option, prefixed
from ..sampling import NegativesMode, SamplerName
from .lr_schedule import LrSchedule
from .precision import Precision
from .ranking.config import RANKING_METRICS, RankingConfig, RankingModel
from .retrieval.split import Holdout
from .sources import DataConfig
from .task import TaskKind

__all__ = [
    "ConfigError", "DataConfig", "TrainConfig", "EvalConfig", "ExperimentConfig", "ModelConfig",
    "CONFIG_DIR", "DEFAULT_EPOCHS", "apply_overrides", "config_from_dict", "load_config",
    "read_config_file",
]

ConfigError = OptionError
"""A config value breaks a rule: ``key`` (dotted path) and ``rule`` (what is wrong)."""

DEFAULT_EPOCHS = 5
CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


@dataclass
class TrainConfig:
    """How to train (per-rank batch; steps or epochs; optimisers; sampling; system switches).

    steps / epochs: give at most one (neither: ``DEFAULT_EPOCHS`` epochs); an epoch is one pass
    over the trainable users in global batches of ``batch_size x world`` users.  lr /
    weight_decay / clip_grad_norm: AdamW for the dense part (clip_grad_norm None or 0: no
    clipping); lr_schedule: ``constant`` or ``cosine`` (the dense lr from ``lr`` at the first
    step down to 0 after the run's last, :mod:`.lr_schedule`).  sparse_lr: row-wise Adagrad of
    the item table (fused into the backward).
    negatives / num_negatives / sampler / temperature: the sampled softmax's negatives and
    temperature.  negatives ``shared`` (default): one pool of ``num_negatives`` = R ids per step
    for every query (2048: chosen on the validation splits of the KuaiRand sample and ML-1M,
    docs/movielens.md); ``per_position``: ``num_negatives`` = K ids drawn for every query
    position on its own (Meta's reference protocol; a negative equal to the position's positive
    is masked).
    log_every / eval_every / checkpoint_every: in steps (0: never; evaluation and a checkpoint
    always happen at the end).  early_stopping_patience: stop after this many validation
    evaluations without improvement of ``eval.metric`` (0: never).  planner: ``torchrec``
    (TorchRec's EmbeddingShardingPlanner), ``hierarchical`` or ``hierarchical_2d`` (2-D
    parallelism: the table sharded inside each host and replicated across hosts, TorchRec's
    ``DMPCollection``; docs/planner.md); sync_every: with ``hierarchical_2d``, the steps between
    two merges of the hosts' replicas (1: every step); replica_merge: how (``mean``: their
    average, TorchRec's; ``sum``: the last merge plus every replica's change since, which
    with SGD and a sync every step is 1-D training for this loss scale; docs/planner.md);
    sharding: the tables' sharding type; pipeline: ``sync`` | ``sparse_dist`` | ``semi_async``
    (:func:`torchrec_ascend.distributed.make_train_pipeline`) and staleness: the bound ``k`` of
    :class:`torchrec_ascend.distributed.DistributedModelParallel` (``sync`` / ``sparse_dist``:
    0 only; ``semi_async``: any ``k >= 0``, 0 being synchronous); sync_warmup_steps: with
    ``staleness >= 1``, the first steps trained synchronously before the lookups run ahead
    (TorchRec's ``start_batch``; docs/semi_async.md); step_timeout_s: a step (a peer's
    collective included) that runs longer ends the job with a one-line error naming the rank
    and the step: ``"auto"`` (default) 600 s until steps have been timed, then the larger of
    30 s and 20 x the slowest of the last steps; a number of seconds; null: no limit (an
    evaluation or a checkpoint, collective too, gets the larger of 600 s and that).  balance:
    ``none`` | ``collator`` | ``all_to_all`` (torchrec_ascend.distributed.load_balance);
    prefetch: sample the next step's negatives in a background thread; balance_ahead (with
    ``all_to_all``): build and balance the next step's batch on a worker thread while this step
    trains (off the critical path, but it shares the GIL and the core: not faster end to end on
    a 2-core CPU host, docs/load_balance.md).  threads: intra-op threads (0: torch's default).
    peak_gemm_size: the GEMM that measures the MFU peak.  precision: ``fp32`` | ``bf16``
    (autocast mixed precision, fp32 master weights) | ``auto`` (bf16 where the device's bf16
    GEMM was measured faster, else fp32; :mod:`.precision`).
    """

    batch_size: int = option(32, min=1)
    steps: Optional[int] = option(None, min=1)
    epochs: Optional[float] = option(None, gt=0, finite=True)
    lr: float = option(1e-3, gt=0, finite=True)
    sparse_lr: float = option(0.05, gt=0, finite=True)
    weight_decay: float = option(0.0, min=0, finite=True)
    lr_schedule: LrSchedule = "constant"
    clip_grad_norm: Optional[float] = option(1.0, min=0, finite=True)
    negatives: NegativesMode = "shared"
    num_negatives: int = option(2048, min=1)
    sampler: SamplerName = "uniform"
    temperature: float = option(0.05, gt=0, finite=True)
    log_every: int = option(50, min=1)
    eval_every: int = option(0, min=0)
    checkpoint_every: int = option(0, min=0)
    keep_checkpoints: int = option(2, min=1)
    early_stopping_patience: int = option(0, min=0)
    sharding: TableSharding = "row_wise"
    planner: PlannerKind = "torchrec"
    sync_every: int = option(1, min=1)
    replica_merge: ReplicaMerge = "mean"
    pipeline: PipelineKind = "sparse_dist"
    staleness: int = option(0, min=0)
    sync_warmup_steps: int = option(0, min=0)
    step_timeout_s: Union[float, Literal["auto"], None] = option("auto", gt=0, finite=True)
    balance: BalanceMode = "none"
    prefetch: bool = True
    balance_ahead: bool = False
    seed: int = option(0, min=0)
    threads: int = option(0, min=0)
    peak_gemm_size: int = option(2048, min=16)
    precision: Precision = "fp32"

    def check(self, key: Key = prefixed("train")) -> None:
        """The rules across this section's fields (each owned by its component)."""
        if self.steps is not None and self.epochs is not None:
            raise ConfigError(key("steps"), f"{self.steps} given together with "
                                            f"{key('epochs')}={self.epochs}: set one of them")
        check_pipeline_options(self.pipeline, self.staleness, self.sync_warmup_steps, key=key)
        check_planner_options(self.planner, self.sync_every, self.replica_merge, self.pipeline,
                              key=key)
        check_balance_options(self.balance, self.balance_ahead, key=key)
        if self.early_stopping_patience and not self.eval_every:
            raise ConfigError(key("early_stopping_patience"),
                              f"needs {key('eval_every')} > 0 (early stopping watches periodic "
                              "validation)")


@dataclass
class EvalConfig:
    """Evaluation: cut-offs ``ks``, users per scoring batch, the number of validation users of
    periodic evaluations (None: all; the final validation and test use every user), the
    validation ``metric`` early stopping watches, and ``restore_best``: keep a checkpoint of
    the best periodic validation (``<out>/<model>/best/``) and compute the final validation and
    test with it (False: with the final model).  ``holdout``: ``leave_two_out`` (default:
    validation = second-to-last item, test = last, training sees neither) or ``leave_one_out``
    (Meta's reference protocol: training also sees the second-to-last item, test = last, no
    validation; for a side-by-side run with the reference once the settings are chosen, so
    periodic evaluation, early stopping and restore_best are refused)."""

    ks: List[int] = option(min=1, default_factory=lambda: [10, 50, 200])
    batch_size: int = option(256, min=1)
    eval_users: Optional[int] = option(None, min=1)
    metric: Optional[str] = None
    restore_best: bool = False
    holdout: Holdout = "leave_two_out"

    def metrics(self, task: TaskKind = "retrieval") -> List[str]:
        """The metric names early stopping may watch: retrieval's ``hr@K``, ``ndcg@K`` per
        cut-off and ``mrr``; ranking's ``mean_auc``, ``mean_gauc`` (or ``<task>.auc`` /
        ``<task>.gauc``)."""
        if task == "ranking":
            return list(RANKING_METRICS)
        return [f"hr@{k}" for k in self.ks] + [f"ndcg@{k}" for k in self.ks] + ["mrr"]

    def check(self, train: TrainConfig, task: TaskKind = "retrieval", key: Key = prefixed("eval"),
              train_key: Key = prefixed("train")) -> None:
        """The rules of this section, and those that involve the ``train`` section; an unset
        ``metric`` becomes the task's default (``ndcg@10``, ``mean_auc``)."""
        if not self.ks:
            raise ConfigError(key("ks"), "needs at least one cut-off")
        if self.restore_best and not train.eval_every:
            raise ConfigError(key("restore_best"), f"needs {train_key('eval_every')} > 0 (the "
                                                   "best model is chosen on periodic validation)")
        if self.metric is None:
            self.metric = "mean_auc" if task == "ranking" else "ndcg@10"
        per_task = task == "ranking" and self.metric.endswith((".auc", ".gauc"))
        if self.metric not in self.metrics(task) and not per_task:
            raise ConfigError(key("metric"), f"{self.metric!r} is not one of "
                                             f"{self.metrics(task)}"
                              + (" or <task>.auc / <task>.gauc" if task == "ranking" else ""))
        if self.holdout == "leave_one_out":
            for name, value in ((train_key("eval_every"), train.eval_every),
                                (train_key("early_stopping_patience"),
                                 train.early_stopping_patience),
                                (key("restore_best"), self.restore_best)):
                if value:
                    raise ConfigError(key("holdout"), f"'leave_one_out' has no validation split: "
                                                      f"{name} must be 0 / false (got {value!r})")


@dataclass
class ExperimentConfig:
    """``task``: ``retrieval`` or ``ranking``; ``models``: the models to train (retrieval:
    ``hstu`` / ``sasrec``, default ``["hstu"]``; ranking: ``hstu`` / ``dlrm``, default both:
    the DLRM baseline trains in the same run); the sections."""

    name: str = "default"
    description: str = ""
    task: TaskKind = "retrieval"
    models: Optional[List[str]] = None
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    ranking: RankingConfig = field(default_factory=RankingConfig)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def check(self) -> None:
        """Every rule of every section (:class:`ConfigError` naming the key); an unset
        ``models`` becomes the task's default."""
        if self.models is None:
            self.models = ["hstu", "dlrm"] if self.task == "ranking" else ["hstu"]
        if not self.models:
            raise ConfigError("models", "needs at least one model")
        kinds = RankingModel if self.task == "ranking" else Encoder
        for i, m in enumerate(self.models):
            check_choice(f"models[{i}]", m, kinds)
        if len(set(self.models)) != len(self.models):
            raise ConfigError("models", f"{self.models} names a model twice")
        self.data.check()
        self.model.check(tuple(self.models), prefixed("model"))
        self.train.check()
        self.eval.check(self.train, self.task)
        if self.task == "ranking":
            self.ranking.check(self.model.max_seq_len)


# -------------------------------------------------------------------------- loading
def config_from_dict(raw: Mapping[str, Any]) -> ExperimentConfig:
    """A validated :class:`ExperimentConfig` from a nested mapping (raises ConfigError)."""
    if not isinstance(raw, Mapping):
        raise ConfigError("config", f"expected a mapping of sections, got {type(raw).__name__}")
    hints = typing.get_type_hints(ExperimentConfig)
    for k in raw:
        if k not in hints:
            raise ConfigError(k, f"unknown key (known: {', '.join(sorted(hints))})")
    values = {name: (from_mapping(hints[name], value, prefixed(name), section=name)
                     if dataclasses.is_dataclass(hints[name]) else convert(name, value, hints[name]))
              for name, value in raw.items()}
    cfg = ExperimentConfig(**values)
    cfg.check()
    return cfg


def read_config_file(path: str) -> Dict[str, Any]:
    """A JSON (``.json``) or YAML (``.yaml`` / ``.yml``) config file as a dict."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ConfigError("config", f"cannot read {path!r}: {e.strerror}") from None
    try:
        if path.endswith((".yaml", ".yml")):
            import yaml

            raw = yaml.safe_load(text)
        else:
            raw = json.loads(text)
    except Exception as e:  # json.JSONDecodeError, yaml.YAMLError
        raise ConfigError("config", f"{path!r} does not parse: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError("config", f"{path!r} does not hold a mapping of sections")
    return raw


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_overrides(raw: Dict[str, Any], sets: Sequence[str]) -> Dict[str, Any]:
    """Apply ``key.path=value`` overrides in place (values parsed as JSON when they parse,
    else kept as strings); returns ``raw``."""
    for s in sets:
        key, eq, val = s.partition("=")
        if not eq or not key:
            raise ConfigError("--set", f"expected key.path=value, got {s!r}")
        node = raw
        parts = key.split(".")
        for i, p in enumerate(parts[:-1]):
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ConfigError(".".join(parts[:i + 1]), f"is a value, not a section ({s!r})")
            node = nxt
        node[parts[-1]] = _parse_value(val)
    return raw


def resolve_config_path(name_or_path: str, search_dirs: Sequence[str]) -> str:
    """A file path, or ``<dir>/<name>.{json,yaml,yml}`` in the first of ``search_dirs`` that has
    it."""
    if os.path.isfile(name_or_path):
        return name_or_path
    for d in search_dirs:
        for ext in (".json", ".yaml", ".yml"):
            p = os.path.join(d, name_or_path + ext)
            if os.path.isfile(p):
                return p
    names = sorted({os.path.splitext(f)[0] for d in search_dirs if os.path.isdir(d)
                    for f in os.listdir(d) if f.endswith((".json", ".yaml", ".yml"))})
    raise ConfigError("--config", f"{name_or_path!r} is neither a file nor one of {names}")


def load_config(name_or_path: Optional[str] = None, overrides: Sequence[str] = (),
                search_dirs: Sequence[str] = (CONFIG_DIR,), base: Optional[Mapping[str, Any]] = None
                ) -> Tuple[ExperimentConfig, Dict[str, Any]]:
    """Read a config (a path, a name in ``search_dirs`` -- default the package's ``configs/``
    folder --, or none: the defaults), merge it over
    ``base``, apply ``overrides`` and validate; returns the config and the raw dict."""
    raw: Dict[str, Any] = json.loads(json.dumps(dict(base or {})))
    if name_or_path:
        path = resolve_config_path(name_or_path, search_dirs)
        for k, v in read_config_file(path).items():
            if isinstance(v, dict) and isinstance(raw.get(k), dict):
                raw[k].update(v)
            else:
                raw[k] = v
        raw.setdefault("name", os.path.splitext(os.path.basename(path))[0])
    apply_overrides(raw, overrides)
    return config_from_dict(raw), raw
