"""Hierarchical sparse parallelism: a two-level sharding planner on TorchRec's planner API.

Shaped like ``torchrec.distributed.planner``: :mod:`.types` (links, tables, placed shards,
errors), :mod:`.presets` and :mod:`.topology` (hosts x devices, links, memory), :mod:`.estimators`
(the cost model and TorchRec's ``ShardEstimator``), :mod:`.proposers`, :mod:`.partitioners`,
:mod:`.perf_models`, :mod:`.storage_reservations`, :mod:`.planners` (the planner), :mod:`.explain`,
:mod:`.tables` (table files for the CLI), :mod:`.collective_bytes` (counting the bytes collectives
move), :mod:`.factory` (the planner of ``train.planner`` by name), :mod:`.two_dim` (2-D parallelism: tables sharded inside a host, replicated across hosts,
synced every N steps) and :mod:`.collection` (TorchRec's ``DMPCollection`` running a 2-D plan),
and the CLI (``python -m torchrec_ascend.distributed.planner``).  docs/planner.md.

    from torchrec_ascend.distributed.planner import (HierarchicalShardingPlanner,
                                                     HierarchicalTopology)
    topo = HierarchicalTopology.from_env(compute_device="npu")
    planner = HierarchicalShardingPlanner(topology=topo, constraints=constraints)
    plan = planner.collective_plan(module, sharders, pg)
    print(planner.explain(plan))
"""

from .estimators import CostModel, HierarchicalShardEstimator, PlanCost, allreduce_matrix
from .collection import ReplicaMerge, TwoDimModelParallel, two_dim_model
from .factory import (PLANNER_KINDS, TABLE_SHARDINGS, PlannerKind, TableSharding,
                      check_planner_options, make_planner)
from .explain import PlanExplanation, explain
from .partitioners import HierarchicalPartitioner, PartitionFailure
from .perf_models import HierarchicalPerfModel
from .planners import HierarchicalShardingPlanner, plan_digest
from .presets import PRESETS, DevicePreset
from .proposers import HierarchicalProposer
from .storage_reservations import DeviceMemoryReservation
from .topology import HierarchicalTopology
from .two_dim import (ParallelismChoice, ReplicatedCostModel, TwoDimShardingPlanner,
                      choose_parallelism)
from .types import (
    HierarchicalPlannerError,
    LinkSpec,
    PlacedTable,
    ShardSpec,
    TableWorkload,
    placed_tables_from_plan,
)

__all__ = [
    "HierarchicalShardingPlanner",
    "HierarchicalTopology",
    "HierarchicalPlannerError",
    "LinkSpec",
    "DevicePreset",
    "PRESETS",
    "TableWorkload",
    "ShardSpec",
    "PlacedTable",
    "placed_tables_from_plan",
    "CostModel",
    "PlanCost",
    "allreduce_matrix",
    "HierarchicalShardEstimator",
    "HierarchicalProposer",
    "HierarchicalPartitioner",
    "PartitionFailure",
    "HierarchicalPerfModel",
    "DeviceMemoryReservation",
    "PlanExplanation",
    "explain",
    "plan_digest",
    "TwoDimShardingPlanner",
    "ReplicatedCostModel",
    "ParallelismChoice",
    "choose_parallelism",
    "TwoDimModelParallel",
    "two_dim_model",
    "ReplicaMerge",
    "PlannerKind",
    "PLANNER_KINDS",
    "TableSharding",
    "TABLE_SHARDINGS",
    "check_planner_options",
    "make_planner",
]
