"""Table files for the CLI and the benchmark: a YAML / JSON list of tables -> a meta-device
TorchRec module, its ``ParameterConstraints`` and sharders.

    batch_size: 512            # per rank (optional)
    tables:
      - {name: item, rows: 32038725, dim: 64, pooling: 1024, pooled: false}
      - {name: user, rows: 27285, dim: 64}                   # pooled, one id per sample
      - {name: tags, rows: 1000, dim: 16, pooling: [3, 5]}    # two features

Keys: ``name``, ``rows``, ``dim`` (required); ``pooling`` (mean ids per sample, one number or
one per feature; default 1); ``features`` (names, or a count; default one feature
``<name>``); ``pooled`` (true: EmbeddingBagCollection; false: EmbeddingCollection; default
true); ``sharding_types`` / ``compute_kernels`` (TorchRec constraint values).  Pooled tables
form one ``EmbeddingBagCollection`` ``ebc``; sequence tables one ``EmbeddingCollection`` per
dimension (TorchRec requires a common dimension): ``ec`` when there is one, else ``ec_<dim>``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn
from torchrec import (EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection,
                      EmbeddingConfig)
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import ModuleSharder

from .topology import load_mapping

__all__ = ["TableRow", "parse_tables", "load_tables", "build_module", "table_constraints",
           "default_sharders"]

_KEYS = {"name", "rows", "dim", "pooling", "features", "pooled", "sharding_types",
         "compute_kernels"}


def _sharding_types() -> List[str]:
    from torchrec.distributed.types import ShardingType

    return [t.value for t in ShardingType]


def _compute_kernels() -> List[str]:
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel

    return [k.value for k in EmbeddingComputeKernel]


_KNOWN = {"sharding_types": _sharding_types, "compute_kernels": _compute_kernels}


@dataclasses.dataclass(frozen=True)
class TableRow:
    """One table of a table file."""

    name: str
    rows: int
    dim: int
    pooling: Tuple[float, ...]
    features: Tuple[str, ...]
    pooled: bool = True
    sharding_types: Optional[Tuple[str, ...]] = None
    compute_kernels: Optional[Tuple[str, ...]] = None


def _table(i: int, d: Mapping[str, Any]) -> TableRow:
    where = f"tables[{i}]"
    if not isinstance(d, Mapping):
        raise ValueError(f"{where}: must be a mapping, got {d!r}")
    unknown = set(d) - _KEYS
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(_KEYS)})")
    for key in ("name", "rows", "dim"):
        if key not in d:
            raise ValueError(f"{where}: missing {key!r}")
    name = str(d["name"])
    rows, dim = d["rows"], d["dim"]
    for key, v in (("rows", rows), ("dim", dim)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{where} ({name}): {key}={v!r} must be an integer >= 1")
    feats = d.get("features", 1)
    if isinstance(feats, int) and not isinstance(feats, bool):
        if feats < 1:
            raise ValueError(f"{where} ({name}): features={feats} must be >= 1")
        features = (name,) if feats == 1 else tuple(f"{name}_{k}" for k in range(feats))
    elif isinstance(feats, (list, tuple)) and feats and all(isinstance(f, str) for f in feats):
        features = tuple(feats)
    else:
        raise ValueError(f"{where} ({name}): features must be a count or a list of names, "
                         f"got {feats!r}")
    pooling = d.get("pooling", 1.0)
    pf = tuple(float(p) for p in pooling) if isinstance(pooling, (list, tuple)) \
        else (float(pooling),) * len(features)
    if len(pf) != len(features) or any(p < 0 for p in pf):
        raise ValueError(f"{where} ({name}): pooling {pooling!r} must be >= 0, one value or one "
                         f"per feature ({len(features)})")
    pooled = d.get("pooled", True)
    if not isinstance(pooled, bool):
        raise ValueError(f"{where} ({name}): pooled={pooled!r} must be true or false")

    def names(key: str) -> Optional[Tuple[str, ...]]:
        v = d.get(key)
        if v is None:
            return None
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
            raise ValueError(f"{where} ({name}): {key} must be a list of strings, got {v!r}")
        known = _KNOWN[key]()
        bad = [x for x in v if x not in known]
        if bad:
            raise ValueError(f"{where} ({name}): {key} {bad} are not TorchRec's (known: "
                             f"{', '.join(known)})")
        return tuple(v)

    return TableRow(name, rows, dim, pf, features, pooled, names("sharding_types"),
                    names("compute_kernels"))


def parse_tables(doc: Mapping[str, Any]) -> Tuple[List[TableRow], Optional[int]]:
    """Tables and the optional per-rank ``batch_size`` of a parsed table file."""
    unknown = set(doc) - {"tables", "batch_size"}
    if unknown:
        raise ValueError(f"table file: unknown keys {sorted(unknown)} (known: batch_size, tables)")
    raw = doc.get("tables")
    if not isinstance(raw, list) or not raw:
        raise ValueError("table file: 'tables' must be a non-empty list")
    rows = [_table(i, d) for i, d in enumerate(raw)]
    seen: Dict[str, int] = {}
    for r in rows:
        if r.name in seen:
            raise ValueError(f"table file: table name {r.name!r} appears twice")
        seen[r.name] = 1
    feats = [f for r in rows for f in r.features]
    if len(set(feats)) != len(feats):
        raise ValueError("table file: feature names must be unique across tables")
    batch = doc.get("batch_size")
    if batch is not None and (not isinstance(batch, int) or isinstance(batch, bool) or batch < 1):
        raise ValueError(f"table file: batch_size={batch!r} must be an integer >= 1")
    return rows, batch


def load_tables(path: str) -> Tuple[List[TableRow], Optional[int]]:
    """:func:`parse_tables` of a ``.yaml`` / ``.yml`` / ``.json`` file."""
    return parse_tables(load_mapping(path, "table"))


class _Tables(nn.Module):
    """Holds the collections of a table file (only for planning: built on ``meta``)."""


def build_module(tables: Sequence[TableRow], device: torch.device = torch.device("meta")
                 ) -> nn.Module:
    """A module with ``ebc`` (pooled tables) and ``ec`` / ``ec_<dim>`` (sequence tables)."""
    module = _Tables()
    pooled = [t for t in tables if t.pooled]
    if pooled:
        module.ebc = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                                       feature_names=list(t.features)) for t in pooled],
            device=device)
    dims = sorted({t.dim for t in tables if not t.pooled})
    for dim in dims:
        attr = "ec" if len(dims) == 1 else f"ec_{dim}"
        setattr(module, attr, EmbeddingCollection(
            tables=[EmbeddingConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                                    feature_names=list(t.features))
                    for t in tables if not t.pooled and t.dim == dim],
            device=device))
    return module


def table_constraints(tables: Sequence[TableRow]) -> Dict[str, ParameterConstraints]:
    """Pooling factors (and sharding types / kernels where given) per table."""
    return {t.name: ParameterConstraints(
        pooling_factors=list(t.pooling),
        sharding_types=list(t.sharding_types) if t.sharding_types else None,
        compute_kernels=list(t.compute_kernels) if t.compute_kernels else None)
        for t in tables}


def default_sharders() -> List[ModuleSharder[nn.Module]]:
    return [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
