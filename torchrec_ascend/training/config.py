"""Typed experiment configuration: dataclasses, JSON / YAML loading, ``--set`` overrides and
validation of every value before any work starts.

    cfg = load_config("path/to/config.json", overrides=["train.steps=100", "model.dropout=0.1"])

An :class:`ExperimentConfig` has sections ``data`` (:class:`DataConfig`), ``model``
(:class:`~torchrec_ascend.models.config.ModelConfig`), ``train`` (:class:`TrainConfig`) and
``eval`` (:class:`EvalConfig`), plus ``name``, ``description`` and ``models`` (the encoders to
train, ``hstu`` and / or ``sasrec``).  A bad value raises :class:`ConfigError` naming the key and
the rule, e.g. ``train.batch_size: 0 is not an integer >= 1``; an unknown key is an error too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..models.config import ENCODERS, NORMALIZATIONS, ModelConfig

__all__ = [
    "ConfigError", "DataConfig", "TrainConfig", "EvalConfig", "ExperimentConfig", "ModelConfig",
    "CONFIG_DIR", "DATA_SOURCES", "PLANNERS", "BALANCE_MODES", "NEGATIVE_MODES", "DEFAULT_EPOCHS",
    "apply_overrides",
    "config_from_dict", "load_config", "read_config_file",
]

DATA_SOURCES = ("table", "kuairand", "synthetic")
PLANNERS = ("torchrec", "hierarchical", "hierarchical_2d")
REPLICA_MERGES = ("mean", "sum")  # TwoDimModelParallel.MERGES
BALANCE_MODES = ("none", "collator", "all_to_all")
SHARDINGS = ("row_wise", "table_wise")
SAMPLERS = ("uniform", "popularity", "in_batch", "mixed")
NEGATIVE_MODES = ("shared", "per_position")
DEFAULT_EPOCHS = 5
CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


class ConfigError(ValueError):
    """A config value breaks a rule: ``key`` (dotted path) and ``rule`` (what is wrong)."""

    def __init__(self, key: str, rule: str) -> None:
        super().__init__(f"{key}: {rule}")
        self.key, self.rule = key, rule


@dataclass
class DataConfig:
    """Where the interactions come from.

    source: ``table`` (any user / item / timestamp table: CSV, TSV or Parquet; columns named by
    user_col / item_col / time_col, optional 0/1 action_cols and a positive rule over them,
    id_type / time_unit / sep / format as :class:`torchrec_ascend.datasets.TableSpec`),
    ``kuairand`` (official KuaiRand logs or the shared sample; positive: a rule over KuaiRand
    actions, default clicks) or ``synthetic`` (the built-in KuaiRand-format generator,
    ``synthetic`` = :class:`torchrec_ascend.datasets.SyntheticConfig` fields).  min_len: users
    with fewer positives are dropped (>= 3: one history item, a validation and a test item).
    cache_dir: preprocessed sequences are cached there; num_buckets: preprocessing partitions.
    """

    source: str = "table"
    files: List[str] = field(default_factory=list)
    user_col: str = "user_id"
    item_col: str = "item_id"
    time_col: str = "timestamp"
    time_unit: str = "s"
    sep: Optional[str] = None
    format: Optional[str] = None
    action_cols: List[str] = field(default_factory=list)
    positive: Optional[Dict[str, List[str]]] = None
    id_type: str = "auto"
    min_len: int = 3
    cache_dir: str = "data_cache"
    num_buckets: int = 32
    synthetic: Dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainConfig:
    """How to train (per-rank batch; steps or epochs; optimisers; sampling; system switches).

    steps / epochs: give at most one (neither: ``DEFAULT_EPOCHS`` epochs); an epoch is one pass
    over the trainable users in global batches of ``batch_size x world`` users.  lr /
    weight_decay / clip_grad_norm: AdamW for the dense part (clip_grad_norm None or 0: no
    clipping).  sparse_lr: row-wise Adagrad of the item table (fused into the backward).
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
    sharding: the table's sharding type; pipeline: ``sync`` | ``sparse_dist`` | ``semi_async``
    (:func:`torchrec_ascend.distributed.make_train_pipeline`) and staleness: the bound ``k`` of
    :class:`torchrec_ascend.distributed.DistributedModelParallel` (``sync`` / ``sparse_dist``:
    0 only; ``semi_async``: any ``k >= 0``, 0 being synchronous); sync_warmup_steps: with
    ``staleness >= 1``, the first steps trained synchronously before the lookups run ahead
    (TorchRec's ``start_batch``; docs/semi_async.md); step_timeout_s: a step that
    runs longer ends the process with a clear error (null: no limit); balance:
    ``none`` | ``collator`` | ``all_to_all`` (torchrec_ascend.distributed.load_balance);
    prefetch: sample the next step's negatives in a background thread; balance_ahead (with
    ``all_to_all``): build and balance the next step's batch on a worker thread while this step
    trains (off the critical path, but it shares the GIL and the core: not faster end to end on
    a 2-core CPU host, docs/load_balance.md).  threads: intra-op
    threads (0: torch's default).  peak_gemm_size: the GEMM that measures the MFU peak.
    precision: ``fp32`` | ``bf16`` (autocast mixed precision, fp32 master weights) | ``auto``
    (bf16 where the device's bf16 GEMM was measured faster, else fp32; :mod:`.precision`).
    """

    batch_size: int = 32
    steps: Optional[int] = None
    epochs: Optional[float] = None
    lr: float = 1e-3
    sparse_lr: float = 0.05
    weight_decay: float = 0.0
    clip_grad_norm: Optional[float] = 1.0
    negatives: str = "shared"
    num_negatives: int = 2048
    sampler: str = "uniform"
    temperature: float = 0.05
    log_every: int = 50
    eval_every: int = 0
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    early_stopping_patience: int = 0
    sharding: str = "row_wise"
    planner: str = "torchrec"
    sync_every: int = 1
    replica_merge: str = "mean"
    pipeline: str = "sparse_dist"
    staleness: int = 0
    sync_warmup_steps: int = 0
    step_timeout_s: Optional[float] = None
    balance: str = "none"
    prefetch: bool = True
    balance_ahead: bool = False
    seed: int = 0
    threads: int = 0
    peak_gemm_size: int = 2048
    precision: str = "fp32"


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

    ks: List[int] = field(default_factory=lambda: [10, 50, 200])
    batch_size: int = 256
    eval_users: Optional[int] = None
    metric: str = "ndcg@10"
    restore_best: bool = False
    holdout: str = "leave_two_out"


@dataclass
class ExperimentConfig:
    name: str = "default"
    description: str = ""
    models: List[str] = field(default_factory=lambda: ["hstu"])
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


_SECTIONS = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig, "eval": EvalConfig}


# -------------------------------------------------------------------------- typed conversion
def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return f"{_describe(args[0])} or null"
    if origin in (list, List):
        return f"a list of {_describe(typing.get_args(tp)[0])}"
    if origin in (dict, Dict):
        return "a mapping"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp)))


def _convert(key: str, value: Any, tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        if value is None:
            return None
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(key, value, args[0])
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif origin in (list, List):
        if isinstance(value, (list, tuple)):
            inner = typing.get_args(tp)[0]
            return [_convert(f"{key}[{i}]", v, inner) for i, v in enumerate(value)]
    elif origin in (dict, Dict):
        if isinstance(value, Mapping):
            return dict(value)
    raise ConfigError(key, f"{value!r} is not {_describe(tp)}")


def _section(name: str, cls: type, raw: Any) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(name, f"expected a mapping of keys, got {raw!r}")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    for k in raw:
        if k not in known:
            raise ConfigError(f"{name}.{k}", f"unknown key (known: {', '.join(known)})")
    return cls(**{k: _convert(f"{name}.{k}", v, hints[k]) for k, v in raw.items()})


# -------------------------------------------------------------------------- rules
def _positive_int(key: str, v: int, minimum: int = 1) -> None:
    if v < minimum:
        raise ConfigError(key, f"{v} is not an integer >= {minimum}")


def _one_of(key: str, v: str, allowed: Sequence[str]) -> None:
    if v not in allowed:
        raise ConfigError(key, f"{v!r} is not one of {list(allowed)}")


def _validate(cfg: ExperimentConfig) -> None:
    if not cfg.models:
        raise ConfigError("models", "needs at least one encoder")
    for i, m in enumerate(cfg.models):
        _one_of(f"models[{i}]", m, ENCODERS)
    if len(set(cfg.models)) != len(cfg.models):
        raise ConfigError("models", f"{cfg.models} names an encoder twice")
    d = cfg.data
    _one_of("data.source", d.source, DATA_SOURCES)
    if d.source in ("table", "kuairand") and not d.files:
        raise ConfigError("data.files", f"source {d.source!r} needs at least one file")
    _positive_int("data.min_len", d.min_len, 3)
    _positive_int("data.num_buckets", d.num_buckets)
    _one_of("data.time_unit", d.time_unit, ("s", "ms"))
    _one_of("data.id_type", d.id_type, ("auto", "int", "str"))
    if d.format is not None:
        _one_of("data.format", d.format, ("csv", "tsv", "parquet"))
    if d.sep is not None and (len(d.sep) != 1 or d.sep in '"\r\n'):
        raise ConfigError("data.sep", f"{d.sep!r} is not one character other than a quote or a "
                                      "line break")
    if d.positive is not None:
        bad = set(d.positive) - {"any_of", "none_of"}
        if bad:
            raise ConfigError("data.positive",
                              f"unknown keys {sorted(bad)} (known: any_of, none_of)")
        if d.source == "table" and not d.action_cols:
            raise ConfigError("data.positive", "a positive rule needs data.action_cols")
    if d.synthetic and d.source != "synthetic":
        raise ConfigError("data.synthetic", f"only used with source 'synthetic', not {d.source!r}")
    if d.source == "synthetic":
        from ..datasets import SyntheticConfig

        known = [f.name for f in dataclasses.fields(SyntheticConfig)]
        for k in d.synthetic:
            if k not in known:
                raise ConfigError(f"data.synthetic.{k}", f"unknown key (known: {', '.join(known)})")
        try:
            SyntheticConfig(**d.synthetic)
        except (TypeError, ValueError) as e:
            raise ConfigError("data.synthetic", str(e)) from None

    m = cfg.model
    for k in ("embedding_dim", "num_layers", "num_heads", "attention_dim", "linear_dim",
              "num_time_buckets"):
        _positive_int(f"model.{k}", getattr(m, k))
    _positive_int("model.max_seq_len", m.max_seq_len, 2)
    if not 0.0 <= m.dropout < 1.0:
        raise ConfigError("model.dropout", f"{m.dropout} is not in [0, 1)")
    _one_of("model.normalization", m.normalization, NORMALIZATIONS)
    if m.attn_alpha is not None and not m.attn_alpha > 0:
        raise ConfigError("model.attn_alpha", f"{m.attn_alpha} is not > 0")
    if m.sasrec_heads is not None:
        _positive_int("model.sasrec_heads", m.sasrec_heads)
    if m.sasrec_ffn_dim is not None:
        _positive_int("model.sasrec_ffn_dim", m.sasrec_ffn_dim)
    if "sasrec" in cfg.models and m.embedding_dim % m.sasrec_num_heads:
        raise ConfigError("model.sasrec_heads", f"{m.sasrec_num_heads} heads do not divide "
                                                f"model.embedding_dim={m.embedding_dim}")

    t = cfg.train
    _positive_int("train.batch_size", t.batch_size)
    if t.steps is not None and t.epochs is not None:
        raise ConfigError("train.steps", f"{t.steps} given together with train.epochs="
                                         f"{t.epochs}: set one of them")
    if t.steps is not None:
        _positive_int("train.steps", t.steps)
    if t.epochs is not None and not t.epochs > 0:
        raise ConfigError("train.epochs", f"{t.epochs} is not > 0")
    for k in ("lr", "sparse_lr", "temperature"):
        if not getattr(t, k) > 0:
            raise ConfigError(f"train.{k}", f"{getattr(t, k)} is not > 0")
    if t.weight_decay < 0:
        raise ConfigError("train.weight_decay", f"{t.weight_decay} is not >= 0")
    if t.clip_grad_norm is not None and t.clip_grad_norm < 0:
        raise ConfigError("train.clip_grad_norm", f"{t.clip_grad_norm} is not >= 0 (or null)")
    _one_of("train.negatives", t.negatives, NEGATIVE_MODES)
    _positive_int("train.num_negatives", t.num_negatives)
    _one_of("train.sampler", t.sampler, SAMPLERS)
    for k in ("log_every", "eval_every", "checkpoint_every", "early_stopping_patience",
              "threads", "seed"):
        _positive_int(f"train.{k}", getattr(t, k), 0)
    _positive_int("train.log_every", t.log_every)
    _positive_int("train.keep_checkpoints", t.keep_checkpoints)
    _positive_int("train.peak_gemm_size", t.peak_gemm_size, 16)
    _one_of("train.sharding", t.sharding, SHARDINGS)
    _one_of("train.planner", t.planner, PLANNERS)
    _positive_int("train.sync_every", t.sync_every, 1)
    if t.sync_every != 1 and t.planner != "hierarchical_2d":
        raise ConfigError("train.sync_every", f"{t.sync_every} needs train.planner="
                                              f"'hierarchical_2d' (planner {t.planner!r} keeps "
                                              "no replicas to sync)")
    from .pipelines import KINDS

    _one_of("train.pipeline", t.pipeline, KINDS)
    _positive_int("train.staleness", t.staleness, 0)
    if t.staleness and t.pipeline != "semi_async":
        raise ConfigError("train.staleness", f"{t.staleness} needs train.pipeline='semi_async' "
                                             f"(pipeline {t.pipeline!r} is synchronous: 0 only)")
    _one_of("train.replica_merge", t.replica_merge, REPLICA_MERGES)
    if t.replica_merge != "mean" and t.planner != "hierarchical_2d":
        raise ConfigError("train.replica_merge", f"{t.replica_merge!r} needs train.planner="
                                                 f"'hierarchical_2d' (planner {t.planner!r} "
                                                 "keeps no replicas to merge)")
    if t.planner == "hierarchical_2d" and t.pipeline == "semi_async":
        raise ConfigError("train.pipeline", "'semi_async' does not run with train.planner="
                                            "'hierarchical_2d' (2-D parallelism runs TorchRec's "
                                            "DMPCollection: use 'sync' or 'sparse_dist')")
    _positive_int("train.sync_warmup_steps", t.sync_warmup_steps, 0)
    if t.sync_warmup_steps and not t.staleness:
        raise ConfigError("train.sync_warmup_steps",
                          f"{t.sync_warmup_steps} needs train.staleness >= 1 (at staleness 0 "
                          "every step is synchronous)")
    if t.step_timeout_s is not None and not t.step_timeout_s > 0:
        raise ConfigError("train.step_timeout_s", f"{t.step_timeout_s} is not > 0 (or null)")
    _one_of("train.balance", t.balance, BALANCE_MODES)
    if t.balance_ahead and t.balance != "all_to_all":
        raise ConfigError("train.balance_ahead", f"needs train.balance='all_to_all' (got {t.balance!r})")
    from .precision import PRECISIONS

    _one_of("train.precision", t.precision, PRECISIONS)
    if t.early_stopping_patience and not t.eval_every:
        raise ConfigError("train.early_stopping_patience",
                          "needs train.eval_every > 0 (early stopping watches periodic validation)")

    e = cfg.eval
    if not e.ks:
        raise ConfigError("eval.ks", "needs at least one cut-off")
    for i, k in enumerate(e.ks):
        _positive_int(f"eval.ks[{i}]", k)
    _positive_int("eval.batch_size", e.batch_size)
    if e.eval_users is not None:
        _positive_int("eval.eval_users", e.eval_users)
    if e.restore_best and not t.eval_every:
        raise ConfigError("eval.restore_best", "needs train.eval_every > 0 (the best model is "
                                               "chosen on periodic validation)")
    allowed = [f"hr@{k}" for k in e.ks] + [f"ndcg@{k}" for k in e.ks] + ["mrr"]
    _one_of("eval.metric", e.metric, allowed)
    from .split import HOLDOUTS

    _one_of("eval.holdout", e.holdout, HOLDOUTS)
    if e.holdout == "leave_one_out":
        for key, value in (("train.eval_every", t.eval_every),
                           ("train.early_stopping_patience", t.early_stopping_patience),
                           ("eval.restore_best", e.restore_best)):
            if value:
                raise ConfigError("eval.holdout", f"'leave_one_out' has no validation split: "
                                                  f"{key} must be 0 / false (got {value!r})")


# -------------------------------------------------------------------------- loading
def config_from_dict(raw: Mapping[str, Any]) -> ExperimentConfig:
    """A validated :class:`ExperimentConfig` from a nested mapping (raises ConfigError)."""
    if not isinstance(raw, Mapping):
        raise ConfigError("config", f"expected a mapping of sections, got {type(raw).__name__}")
    top = {f.name for f in dataclasses.fields(ExperimentConfig)}
    for k in raw:
        if k not in top:
            raise ConfigError(k, f"unknown key (known: {', '.join(sorted(top))})")
    cfg = ExperimentConfig(
        name=_convert("name", raw.get("name", "default"), str),
        description=_convert("description", raw.get("description", ""), str),
        models=_convert("models", raw.get("models", ["hstu"]), List[str]),
        **{name: _section(name, cls, raw.get(name)) for name, cls in _SECTIONS.items()})
    _validate(cfg)
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
