"""Data types of the hierarchical planner: links, tables, placed shards, errors.

The cost model (:mod:`.estimators`) prices a :class:`PlacedTable` — one table's workload
(:class:`TableWorkload`) plus the shards a plan gives it (:class:`ShardSpec`, each on a global rank).
Both planners' outputs convert to it: a TorchRec ``ShardingOption`` whose shards have ranks
(:meth:`PlacedTable.from_sharding_option`) and a TorchRec ``ShardingPlan`` with the tables'
specs (:func:`placed_tables_from_plan`), so TorchRec's own plans are priced with the same
constants as ours.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from torchrec.distributed.planner.types import PlannerError, PlannerErrorType, ShardingOption
from torchrec.distributed.types import ShardingPlan, ShardingType

__all__ = [
    "LinkSpec",
    "TableWorkload",
    "ShardSpec",
    "PlacedTable",
    "HierarchicalPlannerError",
    "OPTIMIZERS",
    "HOST_GROUP_TYPES",
    "placed_tables_from_plan",
    "format_bytes",
]

# optimizer state kept per table: (fp32 values per element, fp32 values per row)
OPTIMIZERS: Dict[str, Tuple[int, int]] = {
    "sgd": (0, 0),
    "rowwise_adagrad": (0, 1),
    "adagrad": (1, 0),
    "adam": (2, 0),
}
# sharding types whose shards must fill one host group (TorchRec's TWRW / GRID)
HOST_GROUP_TYPES = frozenset({ShardingType.TABLE_ROW_WISE.value, ShardingType.GRID_SHARD.value})


class HierarchicalPlannerError(PlannerError):
    """A plan could not be made (or ranks disagree); the message names the table, the memory it
    needs and the memory available.  A TorchRec ``PlannerError``, so code catching TorchRec's
    errors catches it."""

    def __init__(self, message: str,
                 error_type: PlannerErrorType = PlannerErrorType.INSUFFICIENT_STORAGE) -> None:
        super().__init__(message, error_type)


@dataclasses.dataclass(frozen=True)
class LinkSpec:
    """One link class: per-device bandwidth in each direction (bytes/s) and the latency of one
    collective call over it (seconds)."""

    bandwidth: float
    latency: float = 0.0

    def __post_init__(self) -> None:
        if not self.bandwidth > 0:
            raise ValueError(f"LinkSpec.bandwidth={self.bandwidth}: must be > 0 bytes/s")
        if not self.latency >= 0:
            raise ValueError(f"LinkSpec.latency={self.latency}: must be >= 0 s")


@dataclasses.dataclass(frozen=True)
class TableWorkload:
    """The workload of one embedding table, as the cost model needs it.

    ``pooling_factors``: mean ids per sample of each feature the table serves;
    ``batch_sizes``: per-rank batch of each feature; ``pooled``: EmbeddingBag-style output
    (one vector per sample and feature) or sequence output (one vector per id);
    ``weight_bytes`` / ``output_bytes``: element sizes of the weights and of the embeddings the
    collectives move; ``optimizer``: a key of :data:`OPTIMIZERS`."""

    module: str
    name: str
    rows: int
    dim: int
    pooling_factors: Tuple[float, ...]
    batch_sizes: Tuple[int, ...]
    pooled: bool = True
    weighted: bool = False
    weight_bytes: int = 4
    output_bytes: int = 4
    optimizer: str = "sgd"

    def __post_init__(self) -> None:
        if self.rows < 1 or self.dim < 1:
            raise ValueError(f"table {self.fqn}: rows={self.rows}, dim={self.dim} must be >= 1")
        if not self.pooling_factors or len(self.pooling_factors) != len(self.batch_sizes):
            raise ValueError(f"table {self.fqn}: pooling_factors {self.pooling_factors} and "
                             f"batch_sizes {self.batch_sizes} need one entry per feature")
        if any(p < 0 for p in self.pooling_factors) or any(b < 1 for b in self.batch_sizes):
            raise ValueError(f"table {self.fqn}: pooling factors must be >= 0 and batch sizes "
                             f">= 1, got {self.pooling_factors} / {self.batch_sizes}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"table {self.fqn}: optimizer={self.optimizer!r}: must be one of "
                             f"{sorted(OPTIMIZERS)}")

    @property
    def fqn(self) -> str:
        """``<module path>.<table>``, as TorchRec's ``ShardingOption.fqn`` (".t" at the top)."""
        return f"{self.module}.{self.name}"

    @functools.cached_property
    def samples(self) -> float:
        """Per-rank (sample, feature) pairs per step: the number of lengths sent, and of pooled
        output vectors."""
        return float(sum(self.batch_sizes))

    @functools.cached_property
    def ids(self) -> float:
        """Mean ids per rank and step over all the table's features."""
        return float(sum(b * p for b, p in zip(self.batch_sizes, self.pooling_factors)))

    @property
    def weight_size(self) -> int:
        """Bytes of the whole table's weights."""
        return self.rows * self.dim * self.weight_bytes


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """One shard: ``rows`` x ``cols`` at (``row_offset``, ``col_offset``) on global ``rank``."""

    rows: int
    cols: int
    row_offset: int
    col_offset: int
    rank: int


@dataclasses.dataclass(frozen=True)
class PlacedTable:
    """A table with the sharding a plan gives it (data-parallel: one full shard per rank)."""

    table: TableWorkload
    sharding_type: str
    compute_kernel: str
    shards: Tuple[ShardSpec, ...]

    def __post_init__(self) -> None:
        valid = {t.value for t in ShardingType}
        if self.sharding_type not in valid:
            raise ValueError(f"table {self.table.fqn}: sharding_type={self.sharding_type!r}: "
                             f"must be one of {sorted(valid)}")
        if not self.shards:
            raise ValueError(f"table {self.table.fqn}: a placed table needs shards")

    @property
    def ranks(self) -> Tuple[int, ...]:
        return tuple(s.rank for s in self.shards)

    @staticmethod
    def from_sharding_option(so: ShardingOption, table: TableWorkload) -> "PlacedTable":
        """From a TorchRec sharding option whose shards have ranks (a partitioned plan)."""
        shards = []
        for shard in so.shards:
            if shard.rank is None:
                raise ValueError(f"table {so.fqn}: shard at offset {shard.offset} has no rank "
                                 "(partition the option first)")
            shards.append(ShardSpec(int(shard.size[0]), int(shard.size[1]), int(shard.offset[0]),
                                    int(shard.offset[1]), int(shard.rank)))
        return PlacedTable(table, so.sharding_type, so.compute_kernel, tuple(shards))


def placed_tables_from_plan(plan: ShardingPlan, tables: Mapping[str, TableWorkload],
                            world_size: int) -> List[PlacedTable]:
    """Every table of a TorchRec ``ShardingPlan`` with its spec (``tables`` keyed by fqn,
    ``<module path>.<table>``); a table of the plan without a spec is an error."""
    out: List[PlacedTable] = []
    for path in sorted(plan.plan):
        for name, ps in sorted(plan.plan[path].items()):  # type: ignore[union-attr]
            fqn = f"{path}.{name}"
            if fqn not in tables:
                raise ValueError(f"plan: table {fqn!r} has no TableWorkload (known: {sorted(tables)})")
            spec = tables[fqn]
            if ps.sharding_spec is None:  # data parallel: the whole table on each of its ranks
                ranks: Iterable[int] = ps.ranks if ps.ranks else range(world_size)
                shards = tuple(ShardSpec(spec.rows, spec.dim, 0, 0, int(r)) for r in ranks)
            else:
                shards = tuple(
                    ShardSpec(int(m.shard_sizes[0]), int(m.shard_sizes[1]),
                              int(m.shard_offsets[0]), int(m.shard_offsets[1]),
                              int(m.placement.rank()))
                    for m in ps.sharding_spec.shards)  # type: ignore[union-attr]
            out.append(PlacedTable(spec, ps.sharding_type, ps.compute_kernel, shards))
    return out


def format_bytes(n: float) -> str:
    """``n`` bytes as "1.50 GiB" / "12.0 MiB" / "3.2 KiB" / "17 B" (and the exact count)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit} ({int(n)} bytes)"
    return f"{int(n)} bytes"


def check_ranks(placed: Sequence[PlacedTable], world_size: int) -> None:
    """Every shard's rank lies in ``[0, world_size)``."""
    for pt in placed:
        bad = [r for r in pt.ranks if not 0 <= r < world_size]
        if bad:
            raise ValueError(f"table {pt.table.fqn}: ranks {bad} outside world_size={world_size}")


def optimizer_of(name: Optional[str]) -> str:
    """Validated optimizer key (``None`` = TBE's default, SGD)."""
    key = "sgd" if name is None else name
    if key not in OPTIMIZERS:
        raise ValueError(f"optimizer={name!r}: must be one of {sorted(OPTIMIZERS)}")
    return key
