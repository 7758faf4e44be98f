"""``explain``: a priced plan, per rank and in total, as a text table, as JSON, as a picture.

Per rank: its tables and shards, memory (weights + optimizer state + buffers, against the
device's memory), the intra- and inter-host bytes it sends per step, and its estimated
communication and lookup seconds.  Totals: bytes per step on each link class, the estimated
step communication time per phase, the peak memory.  Per table: sharding type, ranks, hosts,
memory and traffic.  Numbers are the cost model's (:mod:`.estimators`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from torchrec.distributed.types import ShardingPlan

from .estimators import TIME_PHASES, CostModel, PlanCost
from .topology import HierarchicalTopology
from .types import PlacedTable, TableWorkload, placed_tables_from_plan

__all__ = ["PlanExplanation", "explain"]

MB = 1e6
GiB = float(1 << 30)


@dataclasses.dataclass
class PlanExplanation:
    """A plan's cost, ready to read (:meth:`table`), to store (:meth:`to_dict`,
    :meth:`to_json`) or to look at (:meth:`plot`)."""

    topology: HierarchicalTopology
    cost: PlanCost
    placed: List[PlacedTable]

    def ranks(self) -> List[Dict[str, Any]]:
        topo, c = self.topology, self.cost
        rows = []
        for r in range(topo.world_size):
            tables = sorted({pt.table.fqn for pt in self.placed if r in pt.ranks})
            shards = sum(1 for pt in self.placed for s in pt.shards if s.rank == r)
            rows.append({
                "rank": r, "host": topo.host_of(r), "tables": tables, "shards": shards,
                "memory_bytes": float(c.memory[r]), "memory_capacity_bytes": topo.memory_bytes,
                "intra_host_bytes": float(c.intra_sent[r]),
                "inter_host_bytes": float(c.inter_sent[r]),
                "est_comm_s": float(c.comm_s[r]), "est_compute_s": float(c.compute_s[r]),
            })
        return rows

    def totals(self) -> Dict[str, Any]:
        c = self.cost
        return {
            "intra_host_bytes": c.intra_bytes, "inter_host_bytes": c.inter_bytes,
            "est_step_comm_s": c.step_comm_s, "est_step_s": c.step_s,
            "est_phase_s": dict(c.phase_s),
            "phase_intra_host_bytes": dict(c.phase_intra),
            "phase_inter_host_bytes": dict(c.phase_inter),
            "peak_rank_memory_bytes": c.peak_memory,
            "memory_capacity_bytes": self.topology.memory_bytes,
            "fits": bool(c.peak_memory <= self.topology.memory_bytes),
        }

    def to_dict(self) -> Dict[str, Any]:
        return {"topology": self.topology.to_dict(), "totals": self.totals(),
                "ranks": self.ranks(), "tables": [dict(t) for t in self.cost.tables]}

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def table(self, max_table_names: int = 4) -> str:
        """The explanation as aligned text (what ``print(explanation)`` shows)."""
        lines = [f"hierarchical plan on {self.topology.describe()}", ""]
        head = ["rank", "host", "shards", "memory GiB", "of GiB", "intra MB", "inter MB",
                "comm ms", "lookup ms", "tables"]
        body = []
        for r in self.ranks():
            names = r["tables"][:max_table_names]
            more = len(r["tables"]) - len(names)
            body.append([str(r["rank"]), str(r["host"]), str(r["shards"]),
                         f"{r['memory_bytes'] / GiB:.3f}",
                         f"{r['memory_capacity_bytes'] / GiB:.1f}",
                         f"{r['intra_host_bytes'] / MB:.3f}", f"{r['inter_host_bytes'] / MB:.3f}",
                         f"{r['est_comm_s'] * 1e3:.3f}", f"{r['est_compute_s'] * 1e3:.3f}",
                         ", ".join(names) + (f" +{more}" if more > 0 else "")])
        lines += _aligned(head, body)
        t = self.totals()
        phases = ", ".join(f"{p} {t['est_phase_s'][p] * 1e3:.3f}" for p in TIME_PHASES)
        lines += ["", f"per step: intra-host {t['intra_host_bytes'] / MB:.3f} MB, inter-host "
                      f"{t['inter_host_bytes'] / MB:.3f} MB; est. communication "
                      f"{t['est_step_comm_s'] * 1e3:.3f} ms ({phases} ms, backward with the "
                      f"gradient all-reduce); peak memory "
                      f"{t['peak_rank_memory_bytes'] / GiB:.3f} of "
                      f"{t['memory_capacity_bytes'] / GiB:.1f} GiB per device", ""]
        head = ["table", "sharding", "kernel", "hosts", "ranks", "memory GiB", "intra MB",
                "inter MB"]
        body = [[str(x["table"]), str(x["sharding_type"]), str(x["compute_kernel"]),
                 _span(x["hosts"]), _span(x["ranks"]), f"{x['memory_bytes'] / GiB:.3f}",
                 f"{x['intra_host_bytes'] / MB:.3f}", f"{x['inter_host_bytes'] / MB:.3f}"]
                for x in self.cost.tables]
        if any("mode" in x for x in self.cost.tables):  # a 2-D plan (two_dim.py)
            head.append("mode")
            for row, x in zip(body, self.cost.tables):
                row.append(str(x.get("mode", "")))
        lines += _aligned(head, body)
        return "\n".join(lines)

    __str__ = table

    def plot(self, path: str) -> str:
        """Per-rank memory (against the device's) and per-rank intra-/inter-host bytes sent,
        as bars, saved to ``path`` (PNG); returns ``path``."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ranks = self.ranks()
        x = [r["rank"] for r in ranks]
        fig, (ax0, ax1) = plt.subplots(2, 1, figsize=(max(6, 0.25 * len(x) + 3), 6),
                                       sharex=True)
        ax0.bar(x, [r["memory_bytes"] / GiB for r in ranks], color="tab:blue")
        ax0.axhline(self.topology.memory_bytes / GiB, color="tab:red", linestyle="--",
                    label="device memory")
        ax0.set_ylabel("memory GiB")
        ax0.legend(loc="upper right")
        intra = [r["intra_host_bytes"] / MB for r in ranks]
        inter = [r["inter_host_bytes"] / MB for r in ranks]
        ax1.bar(x, intra, color="tab:green", label="intra-host")
        ax1.bar(x, inter, bottom=intra, color="tab:orange", label="inter-host")
        ax1.set_ylabel("MB sent per step")
        ax1.set_xlabel("rank")
        ax1.legend(loc="upper right")
        for h in range(1, self.topology.hosts):
            for ax in (ax0, ax1):
                ax.axvline(h * self.topology.devices_per_host - 0.5, color="gray", linewidth=0.8)
        fig.suptitle(self.topology.describe(), fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path


def explain(plan: Union[ShardingPlan, Sequence[PlacedTable]], topology: HierarchicalTopology,
            tables: Optional[Mapping[str, TableWorkload]] = None, *,
            cost_model: Optional[CostModel] = None) -> PlanExplanation:
    """Price ``plan`` (a TorchRec ``ShardingPlan`` with the specs of its tables, keyed by fqn,
    or placed tables) on ``topology`` with ``cost_model`` (default: the default model)."""
    cm = cost_model if cost_model is not None else CostModel(topology)
    if cm.topology != topology:
        raise ValueError("explain: cost_model.topology differs from topology")
    if isinstance(plan, ShardingPlan):
        specs = tables if tables is not None else cm.tables
        placed = placed_tables_from_plan(plan, specs, topology.world_size)
    else:
        placed = list(plan)
    return PlanExplanation(topology, cm.price(placed), placed)


def _span(values: Sequence[int]) -> str:
    vals = sorted(values)
    if len(vals) > 2 and vals == list(range(vals[0], vals[-1] + 1)):
        return f"{vals[0]}-{vals[-1]}"
    return ",".join(str(v) for v in vals)


def _aligned(head: List[str], body: List[List[str]]) -> List[str]:
    widths = [max(len(head[i]), *(len(row[i]) for row in body)) if body else len(head[i])
              for i in range(len(head))]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in body]
    return out
