"""The planner of a job by name (``train.planner``), and the rules of its options.

    planner = make_planner("hierarchical", compute_device="cpu", world_size=2,
                           local_world_size=2, constraints={"item_table": ["row_wise"]},
                           dense_bytes=16 * n_dense)
    plan = planner.collective_plan(model, sharders, pg)

``torchrec`` is TorchRec's own ``EmbeddingShardingPlanner`` (over the same topology, through
TorchRec's ``Topology``), ``hierarchical`` the two-level planner of this package
(:class:`~.planners.HierarchicalShardingPlanner`), ``hierarchical_2d`` 2-D parallelism
(:class:`~.two_dim.TwoDimShardingPlanner`: each table sharded inside a host, replicated across
hosts, the replicas merged every ``sync_every`` steps).
"""

from __future__ import annotations

from typing import Any, Dict, Literal, Sequence

from ...options import Key, OptionError, check_choice, choices
from .collection import ReplicaMerge
from .planners import HierarchicalShardingPlanner
from .storage_reservations import DeviceMemoryReservation
from .topology import HierarchicalTopology
from .two_dim import TwoDimShardingPlanner

__all__ = ["PlannerKind", "PLANNER_KINDS", "TableSharding", "TABLE_SHARDINGS",
           "check_planner_options", "make_planner"]

PlannerKind = Literal["torchrec", "hierarchical", "hierarchical_2d"]
"""``train.planner``: TorchRec's planner, the hierarchical one, or 2-D parallelism."""
PLANNER_KINDS = choices(PlannerKind)

TableSharding = Literal["row_wise", "table_wise"]
"""How the trainer lets the planner shard a table (TorchRec ``ShardingType`` values)."""
TABLE_SHARDINGS = choices(TableSharding)

DENSE_RESERVE = 0.15
"""Share of each device's memory kept from the tables besides the dense part's estimate."""


def check_planner_options(planner: PlannerKind, sync_every: int = 1,
                          replica_merge: ReplicaMerge = "mean", pipeline: str = "sync",
                          key: Key = str) -> None:
    """The planner options' rules, in one place: ``sync_every`` != 1 and ``replica_merge`` !=
    ``"mean"`` only with ``hierarchical_2d`` (the others keep no replicas), and 2-D parallelism
    runs synchronous pipelines only (TorchRec's ``DMPCollection``)."""
    check_choice(key("planner"), planner, PlannerKind)
    check_choice(key("replica_merge"), replica_merge, ReplicaMerge)
    if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
        raise OptionError(key("sync_every"), f"{sync_every!r} is not an integer >= 1")
    if sync_every != 1 and planner != "hierarchical_2d":
        raise OptionError(key("sync_every"), f"{sync_every} needs {key('planner')}="
                                             f"'hierarchical_2d' (planner {planner!r} keeps no "
                                             "replicas to sync)")
    if replica_merge != "mean" and planner != "hierarchical_2d":
        raise OptionError(key("replica_merge"), f"{replica_merge!r} needs {key('planner')}="
                                                f"'hierarchical_2d' (planner {planner!r} keeps "
                                                "no replicas to merge)")
    if planner == "hierarchical_2d" and pipeline == "semi_async":
        raise OptionError(key("pipeline"), f"'semi_async' does not run with {key('planner')}="
                                           "'hierarchical_2d' (2-D parallelism runs TorchRec's "
                                           "DMPCollection: use 'sync' or 'sparse_dist')")


def make_planner(kind: PlannerKind, *, compute_device: str, world_size: int,
                 local_world_size: int, constraints: Dict[str, Sequence[TableSharding]],
                 dense_bytes: int = 0, sync_every: int = 1) -> Any:
    """The planner ``kind`` for a job of ``world_size`` ranks (``local_world_size`` per host)
    on ``compute_device``; ``constraints``: the sharding types each table may take; the memory
    reservation keeps :data:`DENSE_RESERVE` of each device plus ``dense_bytes`` (the dense
    part's parameters, gradients and optimizer state) away from the tables."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import ParameterConstraints

    check_planner_options(kind, sync_every, key=str)
    for table, types in constraints.items():
        for t in types:
            check_choice(f"constraints[{table!r}]", t, TableSharding)
    topo = HierarchicalTopology.from_env(
        compute_device=compute_device,
        environ={"WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(local_world_size)})
    reserve = DeviceMemoryReservation(min(0.9, DENSE_RESERVE + dense_bytes / topo.memory_bytes))
    torchrec_constraints = {t: ParameterConstraints(sharding_types=list(types))
                            for t, types in constraints.items()}
    if kind == "hierarchical_2d":
        return TwoDimShardingPlanner(topology=topo, constraints=torchrec_constraints,
                                     storage_reservation=reserve, sync_every=sync_every)
    if kind == "hierarchical":
        return HierarchicalShardingPlanner(topology=topo, constraints=torchrec_constraints,
                                           storage_reservation=reserve)
    return EmbeddingShardingPlanner(topology=topo.to_torchrec(), constraints=torchrec_constraints,
                                    storage_reservation=reserve)
