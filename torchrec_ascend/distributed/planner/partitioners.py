"""``HierarchicalPartitioner``: gives every shard of a proposal a rank, host by host.

A :class:`Placer` holds the per-rank loads of what is placed so far (:class:`.estimators.Loads`)
and the memory left on each device.  Fixed layouts go first: data-parallel shard k and
row-wise shard k on rank k.  Then each placement unit — a table-row-wise / grid column group
fills one host (shard k on local rank k), a table-wise / column-wise shard one rank — heaviest
first (its estimated seconds alone, then memory, then table name and shard index), goes where
the estimated step time of everything placed so far (:func:`.estimators.link_time`) is least,
among the places with memory left for it; ties go to the smallest peak memory, then the lowest
rank.  Deterministic: the same proposal gives the same ranks on every process.  A unit that fits
nowhere raises TorchRec's ``PlannerError`` (the planner then asks the proposer for a smaller
layout) and is remembered in :attr:`HierarchicalPartitioner.last_failure`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from torchrec.distributed.planner.types import (
    Partitioner,
    PlannerError,
    PlannerErrorType,
    Shard,
    ShardingOption,
    Topology,
)
from torchrec.distributed.types import ShardingType

from .estimators import PHASES, CostModel, Loads, link_time
from .types import HOST_GROUP_TYPES, PlacedTable, ShardSpec, format_bytes

__all__ = ["HierarchicalPartitioner", "PartitionFailure", "Placer", "Unit", "units_of",
           "format_bytes"]

DP = ShardingType.DATA_PARALLEL.value
_FIXED = (DP, ShardingType.ROW_WISE.value)


@dataclasses.dataclass(frozen=True)
class PartitionFailure:
    """Why a unit did not fit: ``needed`` bytes on each of its ranks, ``available``: the most
    free memory any candidate place had (per rank), ``capacity``: memory per device after the
    storage reservation."""

    table: str
    sharding_type: str
    needed: int
    available: int
    capacity: int
    where: str

    def message(self) -> str:
        return (f"table {self.table!r} ({self.sharding_type}) needs {format_bytes(self.needed)} "
                f"on {self.where}, but at most {format_bytes(self.available)} is free on any "
                f"such place (memory per device after the reservation: "
                f"{format_bytes(self.capacity)})")


@dataclasses.dataclass
class Unit:
    """Shards of one option placed together: ``kind`` "fixed" (shard k on rank k), "host"
    (one column group on one host) or "rank" (one shard on one rank)."""

    option: ShardingOption
    shard_idx: Tuple[int, ...]
    kind: str

    def needs(self) -> List[int]:
        return [_bytes(self.option.shards[i].storage) for i in self.shard_idx]


def _bytes(storage) -> int:
    return int(max(storage.hbm, storage.ddr)) if storage is not None else 0


def units_of(so: ShardingOption, world_size: int, local_world_size: int) -> List[Unit]:
    """The placement units of one sharding option."""
    if so.sharding_type in _FIXED:
        if len(so.shards) != world_size:
            raise PlannerError(f"table {so.fqn}: {so.sharding_type} needs {world_size} shards, "
                               f"got {len(so.shards)}", PlannerErrorType.PARTITION)
        return [Unit(so, tuple(range(world_size)), "fixed")]
    if so.sharding_type in HOST_GROUP_TYPES:
        groups: Dict[int, List[int]] = defaultdict(list)
        for i, s in enumerate(so.shards):
            groups[int(s.offset[1])].append(i)
        out = []
        for col in sorted(groups):
            if len(groups[col]) != local_world_size:
                raise PlannerError(f"table {so.fqn}: {so.sharding_type} column group at {col} has "
                                   f"{len(groups[col])} shards; a host has {local_world_size} "
                                   "devices", PlannerErrorType.PARTITION)
            out.append(Unit(so, tuple(groups[col]), "host"))
        return out
    return [Unit(so, (i,), "rank") for i in range(len(so.shards))]


class Placer:
    """Loads and free memory of a partial placement; finds and commits places for units."""

    def __init__(self, cost_model: CostModel, free: np.ndarray) -> None:
        self.cost_model = cost_model
        topo = cost_model.topology
        W, L, H = topo.world_size, topo.devices_per_host, topo.hosts
        self.free = np.asarray(free, dtype=np.float64).copy()
        self.capacity = int(self.free.max(initial=0))
        self.link = np.zeros((len(PHASES), 4, W))
        self.compute = np.zeros(W)
        self.memory = np.zeros(W)
        self.groups: Dict[Tuple[str, str], bool] = {}  # collective groups, for latency
        r = np.arange(W)
        h, l = r // L, r % L
        # _perm[c][new rank] = canonical rank, for a unit moved to host c // L, local c % L
        self._rank_perm = np.stack([((h - c // L) % H) * L + (l - c % L) % L for c in range(W)])
        self._host_perm = self._rank_perm[::L]

    def copy(self) -> "Placer":
        other = copy.copy(self)
        other.free, other.link = self.free.copy(), self.link.copy()
        other.compute, other.memory = self.compute.copy(), self.memory.copy()
        other.groups = dict(self.groups)
        return other

    def time(self) -> float:
        """Estimated step seconds of what is placed, latencies included."""
        latency = sum(self.cost_model.latency(self.groups).values())
        return float(link_time(self.link, self.compute, self.cost_model.topology)) + latency

    def inter_bytes(self) -> float:
        """Inter-host bytes sent, all phases and ranks."""
        return float(self.link[:, 2, :].sum())

    def _placed(self, u: Unit, ranks: Sequence[int]) -> PlacedTable:
        so = u.option
        shards = tuple(ShardSpec(int(so.shards[i].size[0]), int(so.shards[i].size[1]),
                                 int(so.shards[i].offset[0]), int(so.shards[i].offset[1]), int(r))
                       for i, r in zip(u.shard_idx, ranks))
        return PlacedTable(self.cost_model.tables[so.fqn], so.sharding_type, so.compute_kernel,
                           shards)

    def canonical(self, u: Unit) -> Loads:
        """The unit's loads on rank 0 / host 0 (fixed units: where they go)."""
        so = u.option
        key = (self.cost_model.tables[so.fqn], so.sharding_type, so.compute_kernel, u.kind,
               tuple((tuple(so.shards[i].size), tuple(so.shards[i].offset)) for i in u.shard_idx))
        cache = self.cost_model.loads_cache
        if key not in cache:
            ranks = [0] if u.kind == "rank" else list(range(len(u.shard_idx)))
            cache[key] = self.cost_model.loads(self._placed(u, ranks))
        return cache[key]

    def candidates(self, u: Unit) -> Tuple[np.ndarray, np.ndarray]:
        """(perms [C, world], ranks [C, shards]) of every place for ``u``."""
        topo = self.cost_model.topology
        W, L = topo.world_size, topo.devices_per_host
        if u.kind == "fixed":
            return np.arange(W)[None, :], np.arange(W)[None, :]
        if u.kind == "host":
            return self._host_perm, np.arange(W).reshape(topo.hosts, L)
        return self._rank_perm, np.arange(W)[:, None]

    def best(self, u: Unit) -> Tuple[Optional[Tuple[np.ndarray, np.ndarray]], int]:
        """``(ranks, perm)`` of ``u``'s best place (None if no place has the memory) and the
        most free memory a candidate place offered."""
        perms, ranks = self.candidates(u)
        needs = np.array(u.needs(), dtype=np.float64)
        slack = (self.free[ranks] - needs[None, :]).min(1)
        most_free = int(self.free[ranks].min(1).max(initial=0))
        ok = np.nonzero(slack >= 0)[0]
        if ok.size == 0:
            return None, most_free
        canon = self.canonical(u)
        p = perms[ok]
        link = self.link[None] + np.moveaxis(canon.link[:, :, p], 2, 0)
        compute = self.compute[None] + canon.compute[p]
        memory = self.memory[None] + canon.memory[p]
        t = link_time(link, compute, self.cost_model.topology)
        i = ok[np.lexsort((ok, memory.max(1), np.round(t, 15)))[0]]
        return (ranks[i], perms[i]), most_free

    def commit(self, u: Unit, place: Tuple[np.ndarray, np.ndarray]) -> None:
        """Add ``u`` at ``place`` (from :meth:`best`): its canonical loads moved there (the
        topology's symmetry makes that exact)."""
        ranks, perm = place
        canon = self.canonical(u)
        self.link += canon.link[:, :, perm]
        self.compute += canon.compute[perm]
        self.memory += canon.memory[perm]
        for i, r in zip(u.shard_idx, ranks):
            self.free[r] -= _bytes(u.option.shards[i].storage)
        so = u.option
        key = ("", so.sharding_type) if so.sharding_type == DP else (so.path, so.sharding_type)
        weighted = bool(self.cost_model.tables[so.fqn].weighted)
        self.groups[key] = self.groups.get(key, False) or weighted

    def place(self, u: Unit) -> Optional[PartitionFailure]:
        """Place ``u`` at its best place (writing the shards' ranks); the failure if none."""
        place, most_free = self.best(u)
        if place is None:
            L = self.cost_model.topology.devices_per_host
            where = {"host": f"each of the {L} devices of one host", "rank": "one device",
                     "fixed": "every device"}[u.kind]
            return PartitionFailure(u.option.fqn, u.option.sharding_type, max(u.needs()),
                                    most_free, self.capacity, where)
        for i, r in zip(u.shard_idx, place[0]):
            u.option.shards[i].rank = int(r)
        self.commit(u, place)
        return None

    def try_options(self, options: Sequence[ShardingOption]) -> bool:
        """Place every unit of ``options`` as :class:`HierarchicalPartitioner` would (without
        writing ranks); False, leaving a partial placement, when one finds no memory."""
        topo = self.cost_model.topology
        units = [u for so in sorted(options, key=lambda s: s.fqn)
                 for u in units_of(so, topo.world_size, topo.devices_per_host)]
        for u in order_units(units, self):
            place, _ = self.best(u)
            if place is None:
                return False
            self.commit(u, place)
        return True

    def weight(self, u: Unit) -> Tuple[float, int]:
        """Sort key of a unit (heaviest first): its seconds alone, its memory."""
        c = self.canonical(u)
        return (float(link_time(c.link, c.compute, self.cost_model.topology)), max(u.needs()))


def order_units(units: Sequence[Unit], placer: Placer) -> List[Unit]:
    """Fixed units first, then the heaviest (module docstring); a total, deterministic order."""
    fixed = [u for u in units if u.kind == "fixed"]
    weights = {id(u): placer.weight(u) for u in units if u.kind != "fixed"}
    movable = sorted((u for u in units if u.kind != "fixed"),
                     key=lambda u: (-weights[id(u)][0], -weights[id(u)][1], u.option.fqn,
                                    u.shard_idx))
    return fixed + movable


def _with_own_shards(so: ShardingOption) -> ShardingOption:
    """A copy of ``so`` whose shards (and only they) are its own, to write ranks into (a deep
    copy, as TorchRec's partitioners make, costs more than the rest of the search)."""
    out = copy.copy(so)
    out.shards = [Shard(size=s.size, offset=s.offset, storage=s.storage, perf=s.perf)
                  for s in so.shards]
    return out


def free_memory(storage_constraint: Topology, compute_device: str) -> np.ndarray:
    """Memory per device of a (reserved) TorchRec topology: DDR on cpu, else HBM."""
    return np.array([d.storage.ddr if compute_device == "cpu" else d.storage.hbm
                     for d in storage_constraint.devices], dtype=np.float64)


class HierarchicalPartitioner(Partitioner):
    """Host-aware placement priced by ``cost_model`` (module docstring)."""

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        self.last_failure: Optional[PartitionFailure] = None

    def partition(self, proposal: List[ShardingOption],
                  storage_constraint: Topology) -> List[ShardingOption]:
        topo = self.cost_model.topology
        W, L = topo.world_size, topo.devices_per_host
        if storage_constraint.world_size != W:
            raise ValueError(f"storage_constraint.world_size={storage_constraint.world_size} "
                             f"!= the cost model's world size {W}")
        plan = [_with_own_shards(so) for so in proposal]
        placer = Placer(self.cost_model, free_memory(storage_constraint, topo.compute_device))
        units = [u for so in sorted(plan, key=lambda s: s.fqn) for u in units_of(so, W, L)]
        for u in order_units(units, placer):
            failure = placer.place(u)
            if failure is not None:
                self.last_failure = failure
                raise PlannerError(failure.message(), PlannerErrorType.PARTITION)
        self.last_failure = None
        return plan
