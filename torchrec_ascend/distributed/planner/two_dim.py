"""2-D sparse parallelism: tables sharded inside each host, replicated across hosts.

TorchRec 1.8's ``DMPCollection`` runs one ``ShardingPlan`` made for a *sharding group* of
``L`` ranks on every group of the job; with ``use_inter_host_allreduce=True`` a group is one
host (ranks ``h L .. h L + L - 1``), so every embedding all-to-all stays on intra-host links,
and each shard has a replica on the same local rank of every other host.  Every ``sync_every``
steps ``DMPCollection.sync()`` averages the replicas' weights and optimizer states over those
``H`` ranks (inter-host links).  Between syncs the replicas drift: each host's copy steps with
its own host's gradients only, so this is a different training algorithm from 1-D sharding;
with SGD and a sync after every step it equals 1-D training (TorchRec divides a sharded
table's gradient by the sharding group's size, the sync averages the ``H`` hosts: the mean of
all ranks' gradients, as the all-to-all backward over the world gives).  Data-parallel tables
stay 1-D: a replica on every rank, gradients all-reduced over the whole world every step (DDP
over the global process group, as TorchRec's data-parallel sharding does inside a
``DMPCollection``).

:class:`ReplicatedCostModel` prices a host group's placed tables for the whole world: the
group's intra-host traffic on every host, plus the replica sync (``2 S (H - 1) / H`` bytes
sent per rank for a shard of ``S`` bytes of weights + optimizer state, every ``sync_every``
steps, counted per step) and the data-parallel all-reduces, in the ``grad_sync`` phase.
:class:`TwoDimShardingPlanner` is :class:`.planners.HierarchicalShardingPlanner` on the host
group with that model: it picks, per table, 2-D sharding (table-, row-, column-wise inside the
host) or a 1-D replica (data parallel), by the same objective.  :func:`choose_parallelism`
plans a model both ways (1-D over the world, 2-D) and keeps the better.  :mod:`.collection`
builds the ``DMPCollection``.  docs/planner.md, "2-D parallelism".
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np
from torch import nn
from torchrec.distributed.types import ModuleSharder, ShardingPlan

from .estimators import DP, PHASES, CostModel, Loads, PlanCost, allreduce_matrix
from .explain import PlanExplanation
from .planners import HierarchicalShardingPlanner, TopologyLike, resolve_topology
from .topology import HierarchicalTopology
from .types import (HOST_GROUP_TYPES, OPTIMIZERS, HierarchicalPlannerError, PlacedTable,
                    ShardSpec, TableWorkload)

__all__ = [
    "MODES",
    "group_topology",
    "ReplicatedCostModel",
    "TwoDimShardingPlanner",
    "ParallelismChoice",
    "choose_parallelism",
]

MODES = ("1d", "2d")


def group_topology(topology: HierarchicalTopology) -> HierarchicalTopology:
    """One host of ``topology``: the sharding group a 2-D plan is made for."""
    return topology.replace(hosts=1)


class ReplicatedCostModel(CostModel):
    """The cost model of a 2-D plan (module docstring).

    Its :attr:`topology` is the host group (``group_topology(world)``: what TorchRec's planner
    places shards on); :meth:`traffic` and :meth:`price` report on :attr:`world`, every host
    running the group's plan; :meth:`loads` gives the group's ranks (host 0's, all hosts
    alike) with their inter-host sync bytes."""

    def __init__(self, world: HierarchicalTopology, sync_every: int = 1, *,
                 index_bytes: int = 8, length_bytes: int = 8, buffer_copies: int = 2,
                 bwd_compute_multiplier: float = 2.0) -> None:
        if not isinstance(sync_every, int) or isinstance(sync_every, bool) or sync_every < 1:
            raise ValueError(f"sync_every={sync_every!r}: must be an integer >= 1 (steps "
                             "between replica syncs)")
        super().__init__(group_topology(world), index_bytes=index_bytes,
                         length_bytes=length_bytes, buffer_copies=buffer_copies,
                         bwd_compute_multiplier=bwd_compute_multiplier)
        self.world = world
        self.sync_every = sync_every
        same = world.same_host()
        self._intra = same & ~np.eye(world.world_size, dtype=bool)
        self._inter = ~same

    def supports(self, sharding_type: str) -> bool:
        """table-row-wise and grid span hosts; inside one host they are row- and column-wise"""
        return sharding_type not in HOST_GROUP_TYPES

    @property
    def price_topology(self) -> HierarchicalTopology:
        return self.world

    # ------------------------------------------------------------------ one table

    @staticmethod
    def sync_bytes(table: TableWorkload, shard: ShardSpec) -> float:
        """Bytes one replica of ``shard`` all-reduces per sync: weights and the fp32 optimizer
        state (``DMPCollection.sync`` averages both)."""
        per_el, per_row = OPTIMIZERS[table.optimizer]
        return float(shard.rows * shard.cols * (table.weight_bytes + 4 * per_el)
                     + 4 * per_row * shard.rows)

    def replica_ranks(self, rank: int) -> List[int]:
        """The world ranks holding the replicas of group rank ``rank`` (one per host)."""
        L = self.topology.devices_per_host
        return [h * L + rank for h in range(self.world.hosts)]

    def traffic(self, pt: PlacedTable) -> Dict[str, np.ndarray]:
        """``{phase: [world, world] bytes}``: the group's traffic on every host, the replica
        sync per step in ``grad_sync``; a data-parallel table's all-reduce over the world."""
        W, H = self.world.world_size, self.world.hosts
        if pt.sharding_type == DP:
            m = {p: np.zeros((W, W)) for p in PHASES}
            m["grad_sync"] = allreduce_matrix(float(pt.table.weight_size), self.world)
            return m
        group = super().traffic(pt)
        m = {p: np.kron(np.eye(H), group[p]) for p in PHASES}
        for s in pt.shards:
            m["grad_sync"] += allreduce_matrix(self.sync_bytes(pt.table, s) / self.sync_every,
                                               self.world, self.replica_ranks(s.rank))
        return m

    def loads(self, pt: PlacedTable) -> Loads:
        full = super().loads(pt)
        return Loads(full.link[..., :self.topology.world_size], full.compute, full.memory)

    def replicate(self, pt: PlacedTable) -> PlacedTable:
        """``pt`` on the world: every shard on each of its replicas' ranks."""
        if pt.sharding_type == DP:
            s = pt.shards[0]
            shards = tuple(dataclasses.replace(s, rank=r) for r in range(self.world.world_size))
        else:
            shards = tuple(dataclasses.replace(s, rank=r)
                           for s in pt.shards for r in self.replica_ranks(s.rank))
        return dataclasses.replace(pt, shards=shards)

    # ------------------------------------------------------------------ whole plans

    def rank_memory(self, pt: PlacedTable) -> np.ndarray:
        return np.tile(self.memory(pt), self.world.hosts)

    def rank_compute(self, pt: PlacedTable) -> np.ndarray:
        return np.tile(self.compute(pt), self.world.hosts)

    def split_pairs(self) -> np.ndarray:
        return self._intra.copy()  # the KJT all-to-all runs inside each host group

    def table_row(self, pt: PlacedTable, total: np.ndarray) -> Dict[str, object]:
        row = super().table_row(pt, total)
        row["ranks"] = sorted(set(self.replicate(pt).ranks))
        row["hosts"] = list(range(self.world.hosts))
        row["mode"] = "1d" if pt.sharding_type == DP else "2d"
        return row

    def latency(self, groups: Mapping[Tuple[str, str], bool]) -> Dict[str, float]:
        """The group's all-to-alls at intra-host latency; the data-parallel all-reduce and the
        two sync all-reduces (weights, optimizer state; per step: divided by ``sync_every``)
        at inter-host latency (when there is more than one host)."""
        out = super().latency(groups)  # one host: every call at intra-host latency
        if self.world.hosts > 1:
            extra = self.world.inter_host.latency - self.world.intra_host.latency
            if any(stype == DP for _, stype in groups):
                out["backward"] += extra
            if any(stype != DP for _, stype in groups):
                out["backward"] += 2 * self.world.inter_host.latency / self.sync_every
        return out


class TwoDimShardingPlanner(HierarchicalShardingPlanner):
    """:class:`.planners.HierarchicalShardingPlanner` for 2-D parallelism (module docstring).

    ``topology`` is the whole job's (hosts x devices); :meth:`plan` returns the ``ShardingPlan``
    of one host group (ranks ``0 .. devices_per_host - 1``), which ``DMPCollection`` (see
    :func:`.collection.two_dim_model`) runs on every host.  ``sync_every``: steps between
    replica syncs, priced per step.  Table-row-wise and grid are not offered (inside one host
    they are row-wise and column-wise).  Every other argument is the base planner's.
    :meth:`explain` reports on the whole world, each table's ``mode`` "2d" (sharded in the
    host, replicated across hosts) or "1d" (data parallel)."""

    def __init__(self, topology: TopologyLike = None, batch_size: Optional[int] = None,
                 constraints=None, *, sync_every: int = 1, index_bytes: int = 8,
                 length_bytes: int = 8, buffer_copies: int = 2, **kwargs) -> None:
        world = resolve_topology(topology)
        cost_model = ReplicatedCostModel(world, sync_every, index_bytes=index_bytes,
                                         length_bytes=length_bytes, buffer_copies=buffer_copies)
        super().__init__(cost_model.topology, batch_size, constraints, cost_model=cost_model,
                         **kwargs)
        self.world_topology = world

    @property
    def sharding_group_size(self) -> int:
        """Ranks of one sharding group (``DMPCollection``'s ``sharding_group_size``)."""
        return self.topology.world_size

    @property
    def sync_every(self) -> int:
        return self.cost_model.sync_every  # type: ignore[attr-defined]

    def explain(self, plan: Optional[ShardingPlan] = None) -> PlanExplanation:
        """The group plan (default: the last) priced on the whole world."""
        cm: ReplicatedCostModel = self.cost_model  # type: ignore[assignment]
        placed = self.placed_tables(plan)
        return PlanExplanation(self.world_topology, cm.price(placed),
                               [cm.replicate(pt) for pt in placed])


@dataclasses.dataclass
class ParallelismChoice:
    """The outcome of :func:`choose_parallelism`: ``mode`` ("1d" or "2d"), its planner and
    plan, and both priced plans (``costs[mode]``; a mode whose plan did not fit is missing,
    its error in ``errors``)."""

    mode: str
    planner: HierarchicalShardingPlanner
    plan: ShardingPlan
    costs: Dict[str, PlanCost]
    errors: Dict[str, str]


def _objective_key(cost: PlanCost, objective: str) -> Tuple[float, float]:
    if objective == "inter_host_bytes":
        return (cost.inter_bytes, cost.step_s)
    return (cost.step_s, cost.inter_bytes)


def choose_parallelism(module: nn.Module, sharders: List[ModuleSharder[nn.Module]],
                       topology: TopologyLike = None, *, sync_every: int = 1,
                       **kwargs) -> ParallelismChoice:
    """Plan ``module`` 1-D (over the world) and 2-D (per host, replicas synced every
    ``sync_every`` steps) with the same arguments (``kwargs``: the planners' ``batch_size``,
    ``constraints``, ``objective``, ...); keep the better by the objective (time first, or
    inter-host bytes first); when one does not fit, the other; when neither, raise the 2-D
    planner's :class:`.types.HierarchicalPlannerError`."""
    objective = kwargs.get("objective", "time")
    planners = {"1d": HierarchicalShardingPlanner(topology, **kwargs),
                "2d": TwoDimShardingPlanner(topology, sync_every=sync_every, **kwargs)}
    plans: Dict[str, ShardingPlan] = {}
    costs: Dict[str, PlanCost] = {}
    errors: Dict[str, str] = {}
    last: Optional[HierarchicalPlannerError] = None
    for mode in MODES:
        try:
            plans[mode] = planners[mode].plan(module, sharders)
        except HierarchicalPlannerError as e:
            errors[mode], last = str(e), e
            continue
        costs[mode] = planners[mode].explain().cost
    if not plans:
        assert last is not None
        raise last
    mode = min(costs, key=lambda m: (_objective_key(costs[m], objective), MODES.index(m)))
    return ParallelismChoice(mode, planners[mode], plans[mode], costs, errors)
