"""Multi-task ranking as a :class:`~..task.Task`: the HSTU ranker (``hstu``) and TorchRec's DLRM
(``dlrm``) trained on the same examples, evaluated per task (AUC / GAUC / NE) on a time split,
next to the no-history CTR baseline.

:func:`prepare_ranking` reads a config's data into :class:`~.data.RankingData`: KuaiRand logs
(official or the shared sample; the context columns present in every file) or a table with
label columns (``data.action_cols``) and context columns (``data.context_cols``), the side
feature files, the tasks.
"""

from __future__ import annotations

import copy
import zlib
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from torch import nn

from ...datasets import EventLog, preprocess, read_user_features, read_video_features
from ...datasets.features import SideFeatures, side_features
from ...datasets.preprocess import expand_paths
from ...datasets.reader import detect_format, read_feature_table
from ...datasets.table import preprocess_table
from ...models.dlrm_ranker import DLRMRanker, dlrm_features
from ...models.generative_ranker import GenerativeRanker, RankerSpec
from ...models.generative_retrieval import init_table, table_weights
from ...options import OptionError
from ..balancing import RankShare
from ..sources import DataConfig, rank_zero_first, synthetic_files, table_spec
from ..task import Task
from .baselines import ctr_baseline
from .batches import ExampleBuilder, RankingBatches
from .data import (KUAIRAND_CONTEXT, KUAIRAND_OUTCOMES, WATCH_TIME_COLUMN, RankingData,
                   TaskSpec, TimeSplit, kuairand_tasks)
from .evaluator import RankingEvaluator

__all__ = ["RankingTask", "prepare_ranking"]

KUAIRAND_UTC_OFFSET = 8.0  # KuaiRand's dates are Beijing's


def _kuairand_log(files: List[str], d: DataConfig, progress: bool) -> EventLog:
    cols = [set(detect_format(p).columns) for p in files]
    present = [c for c in KUAIRAND_CONTEXT + KUAIRAND_OUTCOMES if all(c in s for s in cols)]
    return EventLog.load(preprocess(files, d.cache_dir, num_buckets=d.num_buckets,
                                    progress=progress, context=present))


def _side(path: Optional[str], reader, ids: np.ndarray, key: str) -> Optional[SideFeatures]:
    if not path:
        return None
    if ids.dtype.kind not in "iu":
        raise OptionError(key, "side features need integer ids in the interactions")
    return side_features(reader(path), ids)


def prepare_ranking(cfg: Any, progress: bool = False) -> RankingData:
    """The config's data as :class:`RankingData` (module docstring; collective in a
    multi-rank job: rank 0 builds the cache)."""
    d, r = cfg.data, cfg.ranking
    d.check()
    if d.source == "table" and not d.action_cols:
        raise OptionError("data.action_cols", "ranking needs label columns (--label-cols, "
                                              "0/1 columns of the table)")
    user_file, item_file = d.user_features, d.item_features
    if d.source == "table":
        spec = table_spec(d)
        log = rank_zero_first(lambda p: EventLog.load(preprocess_table(
            spec, d.cache_dir, num_buckets=d.num_buckets, progress=p)), progress)
        tasks = [TaskSpec(name, i) for i, name in enumerate(d.action_cols)]
        context, outcomes = list(d.context_cols), []
        offset = 0.0 if r.utc_offset_hours is None else r.utc_offset_hours

        def user_reader(p):
            return read_feature_table(p, d.user_col, _header(p))

        def item_reader(p):
            return read_feature_table(p, d.item_col, _header(p))
    else:
        def load(p: bool) -> EventLog:  # rank 0 first: it writes the synthetic files too
            files = ([synthetic_files(d)["log_standard"]] if d.source == "synthetic"
                     else expand_paths(d.files))
            return _kuairand_log(files, d, p)

        log = rank_zero_first(load, progress)
        if d.source == "synthetic":  # written by now
            syn = synthetic_files(d)
            user_file = user_file or syn.get("user_features")
            item_file = item_file or syn.get("video_features")
        tasks = kuairand_tasks(log.meta.get("log_kinds", ["official"]))
        present = log.meta.get("context_columns", [])
        context = [c for c in KUAIRAND_CONTEXT if c in present]
        outcomes = [c for c in KUAIRAND_OUTCOMES if c in present]
        offset = KUAIRAND_UTC_OFFSET if r.utc_offset_hours is None else r.utc_offset_hours
        user_reader, item_reader = read_user_features, read_video_features
    user_side = _side(user_file, user_reader, np.asarray(log.user_ids), "data.user_features")
    item_side = _side(item_file, item_reader, np.asarray(log.item_ids), "data.item_features")
    split = TimeSplit(r.test_days, r.valid_days, offset)
    where = ", ".join(log.meta.get("files", [])) or "data"
    data = RankingData(log, tasks, split, context, outcomes, user_side, item_side, where)
    data.tasks = _chosen_tasks(data, r.tasks)
    return data


def _header(path: str) -> List[str]:
    from ...datasets.csv_stream import read_header

    return list(read_header(path).columns)


def _chosen_tasks(data: RankingData, names: List[str]) -> List[TaskSpec]:
    by_name = {t.name: t for t in data.tasks}
    if names:
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise OptionError("ranking.tasks", f"{unknown} are not tasks of the data (its "
                                               f"tasks: {sorted(by_name)})")
        return [by_name[n] for n in names]
    counts = data.task_counts("train")
    both = [t for t in data.tasks if 0 < counts[t.name][0] < counts[t.name][1]]
    if not both:
        raise OptionError("ranking.tasks", "no task has both classes in the training days")
    return both


class RankingTask(Task):
    """Ranking on ``data`` with the config ``cfg`` (module docstring)."""

    name = "ranking"

    def __init__(self, cfg: Any, data: RankingData) -> None:
        self.cfg, self.data = cfg, data
        r = cfg.ranking
        self.spec = RankerSpec(
            num_items=data.num_items, num_users=data.num_users,
            user_features=dict(zip(data.user_side.names, data.user_side.cardinalities))
            if data.user_side is not None else {},
            item_features=dict(zip(data.item_side.names, data.item_side.cardinalities))
            if data.item_side is not None else {},
            context={c.name: c.cardinality for c in data.context},
            outcomes=tuple(c.name for c in data.context if c.outcome))
        self.item_stats: Optional[np.ndarray] = None
        self.user_stats: Optional[np.ndarray] = None
        if r.item_stats:
            self.item_stats = data.item_statistics(r.item_stats_smoothing)
        if r.user_stats:
            self.user_stats = data.user_statistics(r.item_stats_smoothing)
        self.spec.item_stats = sum(s.shape[1] for s in (self.item_stats, self.user_stats)
                                   if s is not None)
        self.targets: Optional[np.ndarray] = None  # the watch-time regression target
        if r.watch_time_weight > 0:
            if data.watch_time is None:
                raise OptionError("ranking.watch_time_weight", f"needs the data's watch-time "
                                                               f"column ({WATCH_TIME_COLUMN}, "
                                                               f"milliseconds); {data.source} "
                                                               "has none")
            self.targets = data.watch_time
        self.task_names = [t.name for t in data.tasks]
        self.weights = [float(r.task_weights.get(n, 1.0)) for n in self.task_names]
        c = self.spec.contextual_tokens
        per_token = 2 if r.layout == "interleaved" else 1
        self.max_history = max(0, (cfg.model.max_seq_len - c - r.max_candidates) // per_token)
        splits = ("train", "valid", "test") + (("train+valid",) if r.refit else ())
        self.examples = {w: data.examples(w, r.max_candidates, self.max_history)
                         for w in splits}
        # DLRM sees no sequence: one impression per example, the same rows on every rank
        # (TorchRec's pooled sharded tables need equal batches across ranks)
        self.impressions = {w: data.examples(w, 1, 0) for w in splits}
        self.training_split = "train"
        self._builders: Dict[str, ExampleBuilder] = {}
        self._evaluators: Dict[str, RankingEvaluator] = {}

    def builder(self, kind: str) -> ExampleBuilder:
        if kind not in self._builders:
            self._builders[kind] = ExampleBuilder(self.data, self.spec, kind,
                                                  self.cfg.ranking.layout, self.item_stats,
                                                  self.user_stats, self.targets)
        return self._builders[kind]

    def examples_of(self, kind: str) -> Dict[str, Any]:
        return self.impressions if kind == "dlrm" else self.examples

    def evaluator(self, kind: str) -> RankingEvaluator:
        if kind not in self._evaluators:
            self._evaluators[kind] = RankingEvaluator(
                self.builder(kind), self.examples_of(kind), self.task_names,
                self.cfg.eval.batch_size, equal_batches=kind == "dlrm")
        return self._evaluators[kind]

    @property
    def has_valid(self) -> bool:
        return self.training_split == "train"

    def refit_task(self) -> Optional["RankingTask"]:
        """With ``ranking.refit``: this task training on ``train+valid`` (the same data,
        builders and evaluators; no validation of its own)."""
        if not self.cfg.ranking.refit:
            return None
        view = copy.copy(self)
        view.training_split = "train+valid"
        return view

    def build_model(self, kind: str, compute_dtype: torch.dtype) -> nn.Module:
        r, m = self.cfg.ranking, self.cfg.model
        if kind == "dlrm":
            return DLRMRanker(self.spec, m.table_dim, self.weights, r.dlrm_dense_dims,
                              r.dlrm_over_dims, target_weight=r.watch_time_weight)
        return GenerativeRanker(self.spec, m, self.weights, r.layout, r.head_dims,
                                compute_dtype=compute_dtype, target_weight=r.watch_time_weight,
                                head_stats=r.head_stats)

    def sparse_lr(self, kind: str, configured: float) -> float:
        """DLRM's tables train at ``ranking.dlrm_sparse_lr`` (its own best on validation)."""
        return self.cfg.ranking.dlrm_sparse_lr if kind == "dlrm" else configured

    def sharders(self) -> List[Any]:
        from torchrec.distributed.embedding import EmbeddingCollectionSharder
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

        return [EmbeddingCollectionSharder(), EmbeddingBagCollectionSharder()]

    def table_names(self, kind: str) -> List[str]:
        return dlrm_features(self.spec) if kind == "dlrm" else list(self.spec.tables())

    def init_tables(self, model: nn.Module, seed: int) -> None:
        rows = {name: r for name, (r, _) in self.spec.tables().items()}
        for name, weight in table_weights(model).items():
            salt = zlib.crc32(name.encode()) % 1_000_003
            init_table(weight, max(rows[name], 1), self.cfg.model.table_dim, seed * 7 + salt)

    def batches(self, kind: str, rank: int, world: int,
                balance_group: Optional[Any]) -> RankingBatches:
        t = self.cfg.train
        cost = None
        if t.balance != "none":
            from ...distributed.load_balance import HSTUCostModel

            m = self.cfg.model
            cost = HSTUCostModel.from_flops(m.num_layers, m.embedding_dim, m.num_heads,
                                            m.attention_dim, m.linear_dim, backward=True)
        share = RankShare(t.balance, cost, rank, world, t.batch_size, balance_group)
        return RankingBatches(self.builder(kind), self.examples_of(kind)[self.training_split],
                              t.batch_size * world, t.seed, share, ahead=t.balance_ahead)

    def evaluate(self, model: nn.Module, which: str, share: Any,
                 device: torch.device) -> Dict[str, Any]:
        kind = "dlrm" if isinstance(model, DLRMRanker) else "hstu"
        return self.evaluator(kind).evaluate(model, which, share[kind], device)

    def eval_share(self, which: str, rank: int, world: int, limit: Optional[int] = None) -> Any:
        """Per model kind, this rank's batches of ``which`` (``limit``: that many examples)."""
        return {k: self.evaluator(k).share(which, rank, world, limit) for k in ("hstu", "dlrm")}

    def data_summary(self) -> Dict[str, Any]:
        d = self.data
        return {"users": d.num_users, "items": d.num_items,
                "impressions": {w: int((d.period == p).sum())
                                for w, p in (("train", 0), ("valid", 1), ("test", 2))},
                "examples": {w: len(e) for w, e in self.examples.items()},
                "days": d.split_days, "duplicates_dropped": d.duplicates_dropped,
                "tasks": {t: {w: d.task_counts(w)[t][0] for w in ("train", "valid", "test")}
                          for t in self.task_names},
                "max_history": self.max_history,
                "watch_time_missing": (int(np.isnan(self.targets).sum())
                                       if self.targets is not None else None),
                "side_features": {"user": list(self.spec.user_features),
                                  "item": list(self.spec.item_features),
                                  "context": list(self.spec.context)}}

    def describe(self) -> str:
        s = self.data_summary()
        imp, days = s["impressions"], s["days"]
        rates = ", ".join(f"{t} {s['tasks'][t]['train'] / max(imp['train'], 1):.3f}"
                          for t in self.task_names)
        dup = (f"; {s['duplicates_dropped']:,} exact duplicate rows (user, item, time) dropped"
               if s["duplicates_dropped"] else "")
        return (f"ranking data: {s['users']:,} users, {s['items']:,} items; impressions train "
                f"{imp['train']:,} ({days['train'][0]}..{days['train'][-1]}), valid "
                f"{imp['valid']:,} ({', '.join(days['valid'])}), test {imp['test']:,} "
                f"({', '.join(days['test'])}); {len(self.examples['train']):,} training examples "
                f"(<= {self.cfg.ranking.max_candidates} candidates, history <= "
                f"{self.max_history}); tasks (training positive rate): {rates}{dup}")

    def baselines(self, rank: int, world: int) -> Dict[str, Dict[str, Any]]:
        r = self.cfg.ranking
        fit_on = {"valid": "train", "test": "train+valid" if r.refit else "train"}
        return {"ctr": {w: ctr_baseline(self.data, w, r.ctr_smoothing, fit_on[w])
                        for w in ("valid", "test")}}
