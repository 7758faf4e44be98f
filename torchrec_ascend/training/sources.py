"""The data source of a config -> per-user positive sequences (``datasets.Sequences``).

* ``table``: any user / item / timestamp table (CSV, TSV, Parquet) through
  :func:`torchrec_ascend.datasets.load_table_sequences` (streaming, bounded memory, cached);
* ``kuairand``: the official KuaiRand logs (or the shared sample) through
  :func:`torchrec_ascend.datasets.load_kuairand`;
* ``synthetic``: the built-in KuaiRand-format generator (files written once into the cache).

In a multi-rank job rank 0 builds the cache first; a data error there is raised on every rank
(:func:`~.distributed.raise_on_every_rank`), then the other ranks read the finished cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Literal, Optional, TypeVar

import torch.distributed as dist

from ..datasets import (PositiveRule, Sequences, SyntheticConfig, TableSpec, generate,
                        load_kuairand, load_table_sequences)
from ..datasets.preprocess import expand_paths
from ..datasets.table import TableOptions
from ..options import Key, OptionError, check_choice, option, prefixed
from .process_group import raise_on_every_rank

__all__ = ["DataSource", "DataConfig", "table_spec", "check_source", "load_sequences",
           "rank_zero_first", "synthetic_files"]

T = TypeVar("T")

DataSource = Literal["table", "kuairand", "synthetic"]
"""``data.source``: a generic table, the official KuaiRand logs, or the built-in generator."""


@dataclass
class DataConfig(TableOptions):
    """Where the interactions come from (the trainer's ``data`` section).

    source: ``table`` (any user / item / timestamp table: CSV, TSV or Parquet; the reading
    options are :class:`~torchrec_ascend.datasets.table.TableOptions`' fields, embedded here:
    user_col / item_col / time_col, optional 0/1 action_cols and a positive rule over them,
    id_type / time_unit / sep / format), ``kuairand`` (official KuaiRand logs or the shared
    sample; positive: a rule over KuaiRand actions, default clicks) or ``synthetic`` (the
    built-in KuaiRand-format generator, ``synthetic`` = :class:`torchrec_ascend.datasets.
    SyntheticConfig` fields).  min_len: users with fewer positives are dropped (>= 3: one history
    item, a validation and a test item).  cache_dir: preprocessed sequences are cached there;
    num_buckets: preprocessing partitions.  user_features / item_features (ranking): a file of
    side features per user / item (KuaiRand's ``user_features_*.csv`` and
    ``video_features_basic_*.csv``; for a table, a CSV whose ``user_col`` / ``item_col`` column
    holds the ids and every other column is a feature).
    """

    source: DataSource = "table"
    files: List[str] = field(default_factory=list)
    user_features: Optional[str] = None
    item_features: Optional[str] = None
    min_len: int = option(3, min=3)
    cache_dir: str = "data_cache"
    num_buckets: int = option(32, min=1)
    synthetic: Dict[str, Any] = field(default_factory=dict)

    def check(self, key: Key = prefixed("data")) -> None:
        """Every rule of the data options that needs no data read (:class:`OptionError`)."""
        check_choice(key("source"), self.source, DataSource)
        if self.source in ("table", "kuairand") and not self.files:
            raise OptionError(key("files"), f"source {self.source!r} needs at least one file")
        if self.synthetic and self.source != "synthetic":
            raise OptionError(key("synthetic"), f"only used with source 'synthetic', not "
                                                f"{self.source!r}")
        if self.source == "table":
            self.check_options(key)
        elif self.source == "kuairand":
            _kuairand_rule(self, key)
        else:
            _synthetic_config(self, key)


def table_spec(d: DataConfig) -> TableSpec:
    """The :class:`TableSpec` of a ``table`` source."""
    options = {f.name: getattr(d, f.name) for f in dataclasses.fields(TableOptions)}
    return TableSpec(list(d.files), **options)


def _kuairand_rule(d: DataConfig, key: Key = prefixed("data")) -> PositiveRule:
    try:
        return PositiveRule.from_config(d.positive or {"any_of": ["click"]})
    except ValueError as e:
        raise OptionError(key("positive"), str(e)) from None


def _synthetic_config(d: DataConfig, key: Key = prefixed("data")) -> SyntheticConfig:
    known = [f.name for f in dataclasses.fields(SyntheticConfig)]
    for k in d.synthetic:
        if k not in known:
            raise OptionError(key(f"synthetic.{k}"), f"unknown key (known: {', '.join(known)})")
    try:
        return SyntheticConfig(**d.synthetic)
    except (TypeError, ValueError) as e:
        raise OptionError(key("synthetic"), str(e)) from None


def check_source(d: DataConfig) -> None:
    """Everything about the source that can be checked without reading data."""
    d.check()


def synthetic_files(d: DataConfig) -> Dict[str, str]:
    """The built-in generator's KuaiRand-format files for ``d.synthetic`` (written once into
    the cache): ``log_standard``, ``user_features``, ``video_features``, ..."""
    syn = _synthetic_config(d)
    key = hashlib.sha256(json.dumps(d.synthetic, sort_keys=True).encode()).hexdigest()[:12]
    folder = os.path.join(d.cache_dir, f"synthetic-{key}")
    names = {"log_standard": f"log_standard_{syn.tag}.csv",
             "user_features": f"user_features_{syn.tag}.csv",
             "video_features": f"video_features_basic_{syn.tag}.csv"}
    paths = {k: os.path.join(folder, v) for k, v in names.items()}
    if not os.path.isfile(paths["log_standard"]):
        generate(folder, syn)
    return {k: p for k, p in paths.items() if os.path.isfile(p)}


def _load(d: DataConfig, progress: bool) -> Sequences:
    kw = {"num_buckets": d.num_buckets}
    if d.source == "table":
        return load_table_sequences(table_spec(d), d.cache_dir, d.min_len, progress=progress, **kw)
    files = ([synthetic_files(d)["log_standard"]] if d.source == "synthetic"
             else expand_paths(d.files))
    return load_kuairand(files, d.cache_dir, _kuairand_rule(d), d.min_len, progress=progress, **kw)


def rank_zero_first(load: Callable[[bool], T], progress: bool = False) -> T:
    """``load(progress)`` on rank 0 first (it builds the cache; its data error is raised on
    every rank), then on the other ranks (they read the finished cache).  Collective when a
    process group of several ranks is initialised."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return load(progress)
    r = dist.get_rank()
    first = raise_on_every_rank(lambda: load(progress) if r == 0 else None)
    return first if r == 0 else load(False)


def load_sequences(d: DataConfig, progress: bool = False) -> Sequences:
    """The positive sequences of ``d`` (collective when a process group is initialised)."""
    check_source(d)
    return rank_zero_first(lambda p: _load(d, p), progress)
