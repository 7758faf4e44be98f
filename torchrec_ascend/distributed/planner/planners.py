"""``HierarchicalShardingPlanner``: TorchRec's ``EmbeddingShardingPlanner`` with the
hierarchical cost model injected at TorchRec's own extension points.

TorchRec's ``EmbeddingEnumerator`` enumerates each table's sharding options (respecting the
``ParameterConstraints``) and asks :class:`.estimators.HierarchicalShardEstimator` for their
memory and cost; :class:`.proposers.HierarchicalProposer` chooses options by inter-host bytes,
then step time; :class:`.partitioners.HierarchicalPartitioner` places shards host by host;
:class:`.perf_models.HierarchicalPerfModel` rates plans;
:class:`.storage_reservations.DeviceMemoryReservation` keeps a fraction of every device's
memory.  TorchRec's planning loop (``EmbeddingShardingPlanner.plan``) runs them unchanged.

``collective_plan`` plans on every rank (the result is deterministic), then all ranks compare
outcomes: if any rank failed, every rank raises :class:`.types.HierarchicalPlannerError` with
that rank's reason (TorchRec plans on rank 0 and broadcasts, and hangs when rank 0 fails).
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Callable, Dict, List, Optional, Union

import torch.distributed as dist
from torch import nn
from torchrec.distributed.comm import get_local_size
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import (
    ParameterConstraints,
    PlannerError,
    ShardingOption,
    Stats,
    StorageReservation,
    Topology,
)
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import ModuleSharder, ShardingPlan

from .estimators import CostModel, HierarchicalShardEstimator
from .explain import PlanExplanation, explain
from .partitioners import HierarchicalPartitioner, free_memory
from .perf_models import HierarchicalPerfModel
from .proposers import HierarchicalProposer
from .storage_reservations import DeviceMemoryReservation
from .topology import HierarchicalTopology, device_name_known
from .types import HOST_GROUP_TYPES, HierarchicalPlannerError, PlacedTable

__all__ = ["HierarchicalShardingPlanner", "plan_digest", "resolve_topology"]

TopologyLike = Union[HierarchicalTopology, Topology, None]


class HierarchicalShardingPlanner(EmbeddingShardingPlanner):
    """A sharding planner that keeps embedding traffic inside hosts.

    Args:
        topology: a :class:`HierarchicalTopology`, a TorchRec ``Topology`` (hosts of its
            ``local_world_size`` devices), or None (:meth:`HierarchicalTopology.from_env`).
        batch_size: per-rank batch size (TorchRec's default, 512, when None).
        constraints: TorchRec ``ParameterConstraints`` per table name (sharding types, compute
            kernels, pooling factors, batch sizes per feature, ...).
        optimizer: the tables' optimizer for the memory model ("sgd", "rowwise_adagrad",
            "adagrad", "adam"); None infers it per table (``apply_optimizer_in_backward``'s
            class, else the sharder's fused optimizer, else TBE's default SGD).
        reserve_fraction: memory fraction of each device kept for the rest of the model
            (ignored when ``storage_reservation`` is given).
        objective: "time" (least estimated step time, inter-host links priced at their
            bandwidth; within ``tolerance`` of it, fewest inter-host bytes) or
            "inter_host_bytes" (fewest inter-host bytes; within ``tolerance`` of them, fastest).
        tolerance: the relative slack of the objective's first criterion traded for the second
            (default 0.01).
        max_evaluations, index_bytes, length_bytes, buffer_copies: proposer and cost model knobs
            (:class:`.proposers.HierarchicalProposer`, :class:`.estimators.CostModel`).
        storage_reservation, stats, debug, callbacks, timeout_seconds: as TorchRec's
            ``EmbeddingShardingPlanner`` (``stats`` defaults to none: :meth:`explain` reports).
        cost_model: a :class:`.estimators.CostModel` on ``topology`` to price with (default:
            one built from the knobs above; :class:`.two_dim.TwoDimShardingPlanner` passes
            its replicated model).
    """

    def __init__(
        self,
        topology: TopologyLike = None,
        batch_size: Optional[int] = None,
        constraints: Optional[Dict[str, ParameterConstraints]] = None,
        *,
        optimizer: Optional[str] = None,
        reserve_fraction: float = 0.15,
        objective: str = "time",
        tolerance: float = 0.01,
        max_evaluations: int = 400,
        index_bytes: int = 8,
        length_bytes: int = 8,
        buffer_copies: int = 2,
        storage_reservation: Optional[StorageReservation] = None,
        stats: Optional[Union[Stats, List[Stats]]] = None,
        debug: bool = False,
        callbacks: Optional[List[Callable[[List[ShardingOption]], List[ShardingOption]]]] = None,
        timeout_seconds: Optional[int] = None,
        cost_model: Optional[CostModel] = None,
    ) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: must be >= 1")
        if constraints is not None and not isinstance(constraints, dict):
            raise ValueError(f"constraints: must be a dict of table name -> "
                             f"ParameterConstraints, got {type(constraints).__name__}")
        htopo = resolve_topology(topology)
        trc_topology = topology if isinstance(topology, Topology) else htopo.to_torchrec()
        if not device_name_known(htopo.compute_device):
            raise ValueError(
                f"compute_device={htopo.compute_device!r}: torch does not know this device, so "
                "TorchRec cannot write the plan's placements; import torch_npu (or enable the "
                "simulated npu), or call torchrec_ascend.distributed.planner.topology."
                "ensure_device_name('npu') to plan an NPU cluster from this machine")
        self.topology: HierarchicalTopology = htopo  # what the ShardingPlan's ranks cover
        self.world_topology: HierarchicalTopology = htopo  # the job's ranks (collective_plan)
        if cost_model is None:
            cost_model = CostModel(htopo, index_bytes=index_bytes, length_bytes=length_bytes,
                                   buffer_copies=buffer_copies)
        elif cost_model.topology != htopo:
            raise ValueError("cost_model: its topology differs from the planner's topology")
        self.cost_model = cost_model
        estimator = HierarchicalShardEstimator(trc_topology, constraints,
                                               cost_model=self.cost_model, optimizer=optimizer)
        super().__init__(
            topology=trc_topology,
            batch_size=batch_size,
            enumerator=EmbeddingEnumerator(topology=trc_topology,
                                           batch_size=batch_size or _default_batch(),
                                           constraints=constraints, estimator=[estimator]),
            storage_reservation=(storage_reservation if storage_reservation is not None
                                 else DeviceMemoryReservation(reserve_fraction)),
            proposer=HierarchicalProposer(self.cost_model, objective, max_evaluations,
                                          tolerance),
            partitioner=HierarchicalPartitioner(self.cost_model),
            performance_model=HierarchicalPerfModel(self.cost_model, objective),
            stats=stats if stats is not None else [],
            constraints=constraints,
            debug=debug,
            callbacks=callbacks,
            timeout_seconds=timeout_seconds,
        )

    # ------------------------------------------------------------------ planning

    def plan(self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]]) -> ShardingPlan:
        """TorchRec's planning loop with our components; a plan that cannot fit raises
        :class:`HierarchicalPlannerError` naming the table, the memory it needs and the memory
        available."""
        reserved = self._storage_reservation.reserve(
            topology=self._topology, batch_size=self._batch_size, module=module,
            sharders=sharders, constraints=self._constraints)
        for proposer in self._proposers:
            if isinstance(proposer, HierarchicalProposer):
                proposer.free = free_memory(reserved, self.topology.compute_device)
        quiet = _DropDataParallelSpecWarning()
        root = logging.getLogger()
        root.addFilter(quiet)
        try:
            return super().plan(module, sharders)
        except PlannerError as e:
            if isinstance(e, HierarchicalPlannerError):
                raise
            failure = self._partitioner.last_failure  # type: ignore[attr-defined]
            if failure is None:
                raise HierarchicalPlannerError(str(e), e.error_type) from e
            raise HierarchicalPlannerError(
                f"no sharding plan fits {self.topology.describe()}: {failure.message()}; "
                f"{self._num_proposals} proposals tried, down to each table's least-memory "
                "option (more devices or memory, a smaller batch or fewer constraints would "
                "help)") from e
        finally:
            root.removeFilter(quiet)

    def collective_plan(self, module: nn.Module,
                        sharders: Optional[List[ModuleSharder[nn.Module]]] = None,
                        pg: Optional[dist.ProcessGroup] = None) -> ShardingPlan:
        """Plan on every rank of ``pg`` and check that all ranks agree; any rank's failure is
        raised on every rank (module docstring)."""
        if pg is None:
            if not dist.is_initialized():
                raise ValueError("collective_plan: no process group given and torch.distributed "
                                 "is not initialized (use plan() in a single process)")
            pg = dist.GroupMember.WORLD
        sharders = get_default_sharders() if sharders is None else sharders
        plan: Optional[ShardingPlan] = None
        error: Optional[BaseException] = None
        try:
            if pg.size() != self.world_topology.world_size:
                raise ValueError(f"collective_plan: the process group has {pg.size()} ranks, "
                                 f"the topology {self.world_topology.world_size}")
            plan = self.plan(module, sharders)
            self._check_local_world_size(plan)
        except Exception as e:  # reported to every rank below
            error = e
        mine = (dist.get_rank(pg), None if error is None else f"{type(error).__name__}: {error}",
                None if plan is None else plan_digest(plan))
        gathered: List[Optional[tuple]] = [None] * pg.size()
        dist.all_gather_object(gathered, mine, group=pg)
        failed = [(r, msg) for r, msg, _ in gathered if msg is not None]  # type: ignore[misc]
        if failed:
            ranks = [r for r, _ in failed]
            raise HierarchicalPlannerError(
                f"planning failed on rank(s) {ranks}; rank {failed[0][0]}: {failed[0][1]}") \
                from error
        digests = {d for _, _, d in gathered}  # type: ignore[misc]
        if len(digests) != 1:
            raise HierarchicalPlannerError(
                "ranks computed different sharding plans: the module, sharders, constraints or "
                "topology differ between ranks")
        assert plan is not None
        return plan

    def _check_local_world_size(self, plan: ShardingPlan) -> None:
        types = {ps.sharding_type  # type: ignore[union-attr]
                 for mp in plan.plan.values() for ps in mp.values()}
        if not types & HOST_GROUP_TYPES:
            return
        local = get_local_size(self.topology.world_size)
        if local != self.topology.local_world_size:
            raise ValueError(
                f"the plan uses {sorted(types & HOST_GROUP_TYPES)}, which TorchRec runs over "
                f"LOCAL_WORLD_SIZE={local} devices per host, but the topology has "
                f"{self.topology.local_world_size}: set LOCAL_WORLD_SIZE (torchrun does) or plan "
                "for the job's real devices per host")

    # ------------------------------------------------------------------ reporting

    def inter_host_bytes_bound(self) -> float:
        """After :meth:`plan`: the fewest inter-host bytes per step any plan of the enumerated
        options can have (:meth:`.proposers.HierarchicalProposer.inter_host_bytes_bound`)."""
        proposer = self._proposers[0]
        if not isinstance(proposer, HierarchicalProposer) or not proposer._tables:
            raise ValueError("inter_host_bytes_bound: plan() has not run")
        return proposer.inter_host_bytes_bound()

    def placed_tables(self, plan: Optional[ShardingPlan] = None) -> List[PlacedTable]:
        """The last plan's tables with their shards (or ``plan``'s, for tables this planner
        enumerated)."""
        if plan is None:
            if self._best_plan is None:
                raise ValueError("placed_tables: plan() has not produced a plan yet")
            return [self.cost_model.placed(so) for so in self._best_plan]
        return explain(plan, self.topology, cost_model=self.cost_model).placed

    def explain(self, plan: Optional[ShardingPlan] = None) -> PlanExplanation:
        """Per-rank and total memory, traffic and time of ``plan`` (default: the last plan);
        ``print()`` it for a table, ``.to_json()`` for JSON, ``.plot(path)`` for a picture."""
        return explain(self.placed_tables(plan), self.topology, cost_model=self.cost_model)


def resolve_topology(topology: TopologyLike) -> HierarchicalTopology:
    """A :class:`HierarchicalTopology` from one, from a TorchRec ``Topology`` (hosts of its
    ``local_world_size`` devices) or from the environment (None)."""
    if isinstance(topology, Topology):
        return HierarchicalTopology.from_torchrec(topology)
    if isinstance(topology, HierarchicalTopology):
        return topology
    if topology is None:
        return HierarchicalTopology.from_env()
    raise ValueError(f"topology: must be a HierarchicalTopology, a TorchRec Topology or "
                     f"None, got {type(topology).__name__}")


class _DropDataParallelSpecWarning(logging.Filter):
    """TorchRec's ``validate_rank_assignment`` logs "Sharding spec not found for <table>" for
    every data-parallel table (they have no sharding spec by design): nothing to act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Sharding spec not found for ")


def plan_digest(plan: ShardingPlan) -> str:
    """A hash of everything that places a plan's shards (types, kernels, ranks, shards)."""
    doc = {}
    for path in sorted(plan.plan):
        for name, ps in sorted(plan.plan[path].items()):  # type: ignore[union-attr]
            shards = None
            if ps.sharding_spec is not None:
                shards = [(list(m.shard_sizes), list(m.shard_offsets), str(m.placement))
                          for m in ps.sharding_spec.shards]  # type: ignore[union-attr]
            doc[f"{path}.{name}"] = [ps.sharding_type, ps.compute_kernel, ps.ranks, shards]
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _default_batch() -> int:
    from torchrec.distributed.planner.constants import BATCH_SIZE

    return BATCH_SIZE
