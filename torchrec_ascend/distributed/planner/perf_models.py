"""``HierarchicalPerfModel``: TorchRec ``PerfModel`` rating a partitioned plan; the planner
keeps the plan with the lowest rating.

``objective="time"``: the cost model's estimated step time (each phase's slowest rank on intra-
and inter-host links, plus the slowest rank's lookups).  ``objective="inter_host_bytes"``: the
inter-host bytes per step, the estimated step time breaking ties (it adds less than one byte's
worth for any step under 1000 s)."""

from __future__ import annotations

from typing import List

from torchrec.distributed.planner.types import PerfModel, ShardingOption

from .estimators import CostModel

__all__ = ["HierarchicalPerfModel"]

OBJECTIVES = ("time", "inter_host_bytes")


class HierarchicalPerfModel(PerfModel):
    def __init__(self, cost_model: CostModel, objective: str = "time") -> None:
        if objective not in OBJECTIVES:
            raise ValueError(f"objective={objective!r}: must be one of {OBJECTIVES}")
        self.cost_model = cost_model
        self.objective = objective

    def rate(self, plan: List[ShardingOption]) -> float:
        cost = self.cost_model.price_options(plan)
        if self.objective == "time":
            return cost.step_s
        return cost.inter_bytes + min(cost.step_s, 1e3) * 1e-3
