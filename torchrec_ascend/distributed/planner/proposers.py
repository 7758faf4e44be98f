"""``HierarchicalProposer``: which sharding option each table takes, chosen by cost.

Each table's options are first priced alone (:func:`.estimators.canonical_placement`).  An
assignment (one option per table) is then evaluated exactly as the partitioner will place it
(:class:`.partitioners.Placer`, same order, same memory): its estimated step time and
inter-host bytes, or "does not fit".  Three starts are evaluated:

* greedy: heaviest table first (its fastest option's seconds alone), each table takes the
  option that, placed next to the tables chosen so far, leaves the best objective value;
* each table's best option alone for the objective (time, then inter-host bytes);
* each table's fewest-inter-host-bytes option.

If none fits, the greedy start shrinks first: one table at a time moves to an option that
needs less memory (the move that costs the least time, or inter-host bytes, alone per byte
saved) until the assignment fits.  A local search then runs from every start that fits (the
evaluation budget shared): table by table (heaviest first) it tries each other option (best
alone first) and keeps a move when the whole assignment gets better.  Better, for
``objective="time"``: among assignments within ``tolerance`` (default 1%) of the fastest seen,
fewer inter-host bytes, then faster; otherwise faster.  For ``"inter_host_bytes"`` the other way
round.  A search stops after a sweep without a move or at its budget of ``max_evaluations``;
the best result is the one proposal (TorchRec's loop partitions and rates it); when nothing
fits, the shrunk assignment is (its failure is the one reported).  Deterministic.

Compute kernels the cost model does not price (UVM, caching, key-value) are left out, and so
are options with an empty shard (a row-wise table with fewer rows than ranks: fbgemm's CPU
embedding kernel fails on a table of zero rows); a table left with no option is a
:class:`ValueError`.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import numpy as np
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner.types import Enumerator, Proposer, ShardingOption, Topology

from .estimators import CostModel, canonical_placement
from .partitioners import Placer
from .perf_models import OBJECTIVES

__all__ = ["HierarchicalProposer", "PRICED_KERNELS"]

PRICED_KERNELS = frozenset({EmbeddingComputeKernel.DENSE.value, EmbeddingComputeKernel.FUSED.value,
                            EmbeddingComputeKernel.QUANT.value})
# between equally priced options, the simpler layout
_TYPE_ORDER = {"data_parallel": 0, "table_wise": 1, "table_row_wise": 2, "column_wise": 3,
               "row_wise": 4, "table_column_wise": 5, "grid_shard": 6}
_REL = 1e-9  # relative difference below which two estimates are equal

Choice = Dict[str, int]
Value = Tuple[float, float]


@dataclasses.dataclass(frozen=True)
class _Priced:
    option: ShardingOption
    inter: float
    time: float
    peak: float
    total: float
    order: int

    @property
    def pressure(self) -> float:
        """Memory weight: the largest shard plus the mean per rank."""
        return self.peak + self.total


class HierarchicalProposer(Proposer):
    def __init__(self, cost_model: CostModel, objective: str = "time",
                 max_evaluations: int = 400, tolerance: float = 0.01) -> None:
        if objective not in OBJECTIVES:
            raise ValueError(f"objective={objective!r}: must be one of {OBJECTIVES}")
        if not 0 <= tolerance < 1:
            raise ValueError(f"tolerance={tolerance}: must be in [0, 1)")
        self.tolerance = tolerance
        self._fastest = self._fewest = float("inf")
        if max_evaluations < 1:
            raise ValueError(f"max_evaluations={max_evaluations}: must be >= 1")
        self.cost_model = cost_model
        self.objective = objective
        self.max_evaluations = max_evaluations
        self.free: Optional[np.ndarray] = None  # memory per device; the planner sets it
        self.evaluations = 0
        self._tables: List[str] = []
        self._options: Dict[str, List[_Priced]] = {}
        self._queue: List[Choice] = []

    # ------------------------------------------------------------------ Proposer API

    def load(self, search_space: List[ShardingOption],
             enumerator: Optional[Enumerator] = None) -> None:
        self._tables, self._options, self._queue = [], {}, []
        self.evaluations = 0
        self._fastest = self._fewest = float("inf")
        by_table: Dict[str, List[ShardingOption]] = {}
        for so in search_space:
            by_table.setdefault(so.fqn, []).append(so)
        for fqn in sorted(by_table):
            self._options[fqn] = self._price_alone(fqn, by_table[fqn])
            self._tables.append(fqn)
        if not self._tables:
            return
        starts = [self._greedy(),
                  {t: min(self._options[t], key=self._key).order for t in self._tables},
                  {t: min(self._options[t], key=self._inter_key).order for t in self._tables}]
        valued = [(self._evaluate(c), c) for c in starts]
        feasible = [(v, c) for v, c in valued if v is not None]
        if feasible:  # a local search from every start that fits; the best result wins
            results = []
            for i, (v, c) in enumerate(feasible):
                budget = self.evaluations + (self.max_evaluations - self.evaluations) \
                    // (len(feasible) - i)
                results.append(self._local_search(v, c, budget))
            best = results[0]
            for r in results[1:]:
                if self._better(r[0], best[0]):
                    best = r
            self._queue.append(best[1])
        else:  # the smallest layout: its failure is the one worth reporting
            self._queue.append(self._shrink(starts[0]))

    def inter_host_bytes_bound(self) -> float:
        """The fewest inter-host bytes per step any plan of the loaded options can have: each
        table's least (placement does not change a table's inter-host bytes, by the topology's
        symmetry), memory ignored, the collectives' splits exchange left out."""
        cm = self.cost_model
        inter = cm._inter
        total = 0.0
        for fqn in self._tables:
            total += min(
                float(sum((m * inter).sum() for m in cm.traffic(canonical_placement(
                    cm.tables[fqn], p.option.sharding_type, p.option.compute_kernel,
                    [(s.size, s.offset) for s in p.option.shards], cm.topology)).values()))
                for p in self._options[fqn])
        return total

    def propose(self) -> Optional[List[ShardingOption]]:
        if not self._queue:
            return None
        choice = self._queue.pop(0)
        return [self._options[t][choice[t]].option for t in self._tables]

    def feedback(self, partitionable: bool, plan: Optional[List[ShardingOption]] = None,
                 perf_rating: Optional[float] = None,
                 storage_constraint: Optional[Topology] = None) -> None:
        """The proposals were evaluated in :meth:`load`; TorchRec's loop keeps the best."""

    # ------------------------------------------------------------------ pricing

    def _price_alone(self, fqn: str, opts: List[ShardingOption]) -> List[_Priced]:
        cm = self.cost_model
        priced_opts = [so for so in opts if so.compute_kernel in PRICED_KERNELS]
        if not priced_opts:
            kernels = sorted({so.compute_kernel for so in opts})
            raise ValueError(f"table {fqn}: compute kernels {kernels} are not priced by the "
                             f"hierarchical cost model (priced: {sorted(PRICED_KERNELS)}); allow "
                             "one of those in its ParameterConstraints")
        supported = [so for so in priced_opts if cm.supports(so.sharding_type)]
        if not supported:
            types = sorted({so.sharding_type for so in priced_opts})
            raise ValueError(f"table {fqn}: sharding types {types} are not supported by "
                             f"{type(cm).__name__} ({cm.supports.__doc__.strip()}); allow "
                             "another in its ParameterConstraints")
        priced_opts = supported
        runnable = [so for so in priced_opts if all(min(s.size) > 0 for s in so.shards)]
        if not runnable:
            types = sorted({so.sharding_type for so in priced_opts})
            raise ValueError(f"table {fqn}: every allowed option ({types}) has an empty shard "
                             f"(table {list(priced_opts[0].tensor.shape)} on "
                             f"{cm.topology.world_size} ranks); allow a sharding type that keeps "
                             "rows on every shard (table_wise, data_parallel)")
        priced_opts = runnable
        kept: Dict[tuple, _Priced] = {}
        for so in priced_opts:
            pt = canonical_placement(cm.tables[fqn], so.sharding_type, so.compute_kernel,
                                     [(s.size, s.offset) for s in so.shards], cm.topology)
            cost = cm.price([pt])
            mem = cm.memory(pt)
            p = _Priced(so, cost.inter_bytes, cost.step_s, float(mem.max()),
                        float(mem.sum()) / cm.topology.world_size, 0)
            # one column shard is a table-wise table: keep one of equal layouts, the simplest
            same = (p.inter, p.time, p.peak, p.total, len(so.shards), so.compute_kernel)
            if same not in kept or self._time_key(p) < self._time_key(kept[same]):
                kept[same] = p
        ordered = sorted(kept.values(), key=lambda p: (_TYPE_ORDER.get(p.option.sharding_type,
                                                                       99), p.time, p.inter))
        return [dataclasses.replace(p, order=i) for i, p in enumerate(ordered)]

    def _placer(self) -> Placer:
        W = self.cost_model.topology.world_size
        return Placer(self.cost_model, self.free if self.free is not None else np.full(W, np.inf))

    def _evaluate(self, choice: Choice) -> Optional[Value]:
        """(time, inter-host bytes) of ``choice`` placed as the partitioner places it; None if
        it does not fit."""
        self.evaluations += 1
        placer = self._placer()
        if not placer.try_options([self._options[t][choice[t]].option for t in self._tables]):
            return None
        self._fastest = min(self._fastest, placer.time())
        self._fewest = min(self._fewest, placer.inter_bytes())
        return placer.time(), placer.inter_bytes()

    def _order(self, v: Value) -> tuple:
        """Sort key of an evaluated assignment.  "time": within ``tolerance`` of the fastest
        seen, fewer inter-host bytes first, then faster; the rest by time.  "inter_host_bytes":
        within ``tolerance`` of the fewest inter-host bytes seen, faster first; the rest by
        inter-host bytes."""
        t, inter = v
        if self.objective == "inter_host_bytes":
            if inter <= self._fewest * (1 + self.tolerance):
                return (0.0, t, inter)
            return (1.0, inter, t)
        if t <= self._fastest * (1 + self.tolerance):
            return (0.0, inter, t)
        return (1.0, t, inter)

    def _better(self, a: Value, b: Value) -> bool:
        """``a`` sorts before ``b`` (floats equal within a relative 1e-9 count as equal)."""
        for x, y in zip(self._order(a), self._order(b)):
            if x < y * (1 - _REL) - 1e-300:
                return True
            if x > y * (1 + _REL) + 1e-300:
                return False
        return False

    # ------------------------------------------------------------------ keys

    @staticmethod
    def _time_key(p: _Priced) -> tuple:
        return (p.time, p.inter, p.pressure, _TYPE_ORDER.get(p.option.sharding_type, 99),
                p.option.compute_kernel, p.order)

    @staticmethod
    def _inter_key(p: _Priced) -> tuple:
        return (p.inter, p.time, p.pressure, _TYPE_ORDER.get(p.option.sharding_type, 99),
                p.option.compute_kernel, p.order)

    def _key(self, p: _Priced) -> tuple:
        """The objective's order of one table's options (alone)."""
        return self._time_key(p) if self.objective == "time" else self._inter_key(p)

    def _weight_order(self) -> List[str]:
        """Tables, heaviest first: their fastest option's seconds alone, then name."""
        return sorted(self._tables, key=lambda t: (-min(p.time for p in self._options[t]), t))

    # ------------------------------------------------------------------ search

    def _greedy(self) -> Choice:
        placer = self._placer()
        choice: Choice = {}
        for fqn in self._weight_order():
            best = None
            for p in self._options[fqn]:
                trial = placer.copy()
                if not trial.try_options([p.option]):
                    continue
                value = (trial.time(), trial.inter_bytes())
                key = self._order(value) + self._key(p)
                if best is None or key < best[0]:
                    best = (key, p.order, trial)
            if best is None:  # nothing fits next to the others: the smallest (then shrink)
                choice[fqn] = min(self._options[fqn], key=lambda p: (p.pressure, p.order)).order
                continue
            choice[fqn] = best[1]
            placer = best[2]
        return choice

    def _local_search(self, value: Value, choice: Choice,
                      budget: Optional[int] = None) -> Tuple[Value, Choice]:
        """Moves from ``choice`` until a sweep keeps none or ``budget`` evaluations are spent."""
        limit = min(self.max_evaluations, budget if budget is not None else self.max_evaluations)
        choice = dict(choice)
        moved = True
        while moved and self.evaluations < limit:
            moved = False
            for fqn in self._weight_order():
                alts = sorted((p for p in self._options[fqn] if p.order != choice[fqn]),
                              key=self._key)
                for p in alts:
                    if self.evaluations >= limit:
                        return value, choice
                    trial = dict(choice, **{fqn: p.order})
                    v = self._evaluate(trial)
                    if v is not None and self._better(v, value):
                        choice, value, moved = trial, v, True
                        break
        return value, choice

    def _shrink(self, choice: Choice) -> Choice:
        """Move tables to smaller options until ``choice`` fits (or no move is left)."""
        choice = dict(choice)
        while self.evaluations < self.max_evaluations:
            best = None
            for fqn in self._tables:
                cur = self._options[fqn][choice[fqn]]
                for p in self._options[fqn]:
                    saved = cur.pressure - p.pressure
                    if saved <= 0:
                        continue
                    cost = p.time - cur.time if self.objective == "time" else p.inter - cur.inter
                    key = (max(0.0, cost) / saved, -saved, fqn, p.order)
                    if best is None or key < best[0]:
                        best = (key, fqn, p.order)
            if best is None:
                break
            choice[best[1]] = best[2]
            value = self._evaluate(choice)
            if value is not None:
                return self._local_search(value, choice)[1]
        return choice
