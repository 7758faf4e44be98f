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

import hashlib
import json
import os
import re
from typing import Optional

import torch.distributed as dist

from ..datasets import (PositiveRule, Sequences, SyntheticConfig, TableSpec, generate,
                        load_kuairand, load_table_sequences)
from ..datasets.preprocess import expand_paths
from .config import ConfigError, DataConfig
from .distributed import raise_on_every_rank

__all__ = ["table_spec", "check_source", "load_sequences"]


def table_spec(d: DataConfig) -> TableSpec:
    """The :class:`TableSpec` of a ``table`` source (ConfigError on a bad combination)."""
    try:
        return TableSpec(files=list(d.files), user_col=d.user_col, item_col=d.item_col,
                         time_col=d.time_col, time_unit=d.time_unit, sep=d.sep, format=d.format,
                         action_cols=list(d.action_cols), positive=d.positive, id_type=d.id_type)
    except ValueError as e:  # "TableSpec.<field>: rule" -> ConfigError("data.<field>", rule)
        m = re.match(r"TableSpec(?:\.(\w+))?: (.*)", str(e), re.S)
        if m is None:
            raise ConfigError("data", str(e)) from None
        raise ConfigError("data" + (f".{m.group(1)}" if m.group(1) else ""), m.group(2)) from None


def _kuairand_rule(d: DataConfig) -> PositiveRule:
    try:
        return PositiveRule.from_config(d.positive or {"any_of": ["click"]})
    except ValueError as e:
        raise ConfigError("data.positive", str(e)) from None


def check_source(d: DataConfig) -> None:
    """Everything about the source that can be checked without reading data."""
    if d.source == "table":
        table_spec(d)
    elif d.source == "kuairand":
        _kuairand_rule(d)


def _synthetic_files(d: DataConfig) -> list:
    syn = SyntheticConfig(**d.synthetic)
    key = hashlib.sha256(json.dumps(d.synthetic, sort_keys=True).encode()).hexdigest()[:12]
    folder = os.path.join(d.cache_dir, f"synthetic-{key}")
    path = os.path.join(folder, f"log_standard_{syn.tag}.csv")
    if not os.path.isfile(path):
        generate(folder, syn)
    return [path]


def _load(d: DataConfig, progress: bool) -> Sequences:
    kw = {"num_buckets": d.num_buckets}
    if d.source == "table":
        return load_table_sequences(table_spec(d), d.cache_dir, d.min_len, progress=progress, **kw)
    files = _synthetic_files(d) if d.source == "synthetic" else expand_paths(d.files)
    return load_kuairand(files, d.cache_dir, _kuairand_rule(d), d.min_len, progress=progress, **kw)


def load_sequences(d: DataConfig, progress: bool = False, rank: Optional[int] = None) -> Sequences:
    """The positive sequences of ``d`` (collective when a process group is initialised)."""
    check_source(d)
    multi = dist.is_initialized() and dist.get_world_size() > 1
    r = rank if rank is not None else (dist.get_rank() if dist.is_initialized() else 0)
    if not multi:
        return _load(d, progress)
    first = raise_on_every_rank(lambda: _load(d, progress) if r == 0 else None)
    return first if r == 0 else _load(d, False)
