"""``python -m torchrec_ascend.distributed.planner``: plan a table file for a cluster, offline.

    python -m torchrec_ascend.distributed.planner --tables tables.yaml --hosts 2 \\
        --devices-per-host 8 [--preset ascend-a2 | --topology topo.yaml] [--batch-size 512] \\
        [--objective time|inter_host_bytes] [--mode 1d|2d|auto --sync-every N] [--json] \
        [--plot plan.png]

Prints the explanation (per rank: tables, shards, memory, intra- / inter-host bytes, estimated
times; totals; per table) or, with ``--json``, the same as JSON with the TorchRec plan's
sharding types.  ``--mode 2d``: the 2-D plan (:mod:`.two_dim`: tables sharded inside each
host, replicated across hosts, synced every ``--sync-every`` steps); ``auto``: the better of
1-D and 2-D by the objective.  The table file format is in :mod:`.tables`, the topology file's in
:meth:`.topology.HierarchicalTopology.from_dict` (docs/planner.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from .planners import HierarchicalShardingPlanner
from .presets import PRESETS
from .proposers import OBJECTIVES
from .tables import build_module, default_sharders, load_tables, table_constraints
from .topology import HierarchicalTopology, ensure_device_name
from .two_dim import MODES, TwoDimShardingPlanner, choose_parallelism
from .types import HierarchicalPlannerError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torchrec_ascend.distributed.planner",
                                description="Plan embedding tables on hosts x devices.")
    p.add_argument("--tables", required=True, help="table file (.yaml / .yml / .json)")
    p.add_argument("--hosts", type=int, default=None, help="hosts (default 1, or the file's)")
    p.add_argument("--devices-per-host", type=int, default=None,
                   help="devices per host (default: the preset's, or the file's)")
    p.add_argument("--preset", default="ascend-a2", choices=sorted(PRESETS),
                   help="host kind when no --topology file is given (default ascend-a2)")
    p.add_argument("--topology", default=None, help="topology file (.yaml / .yml / .json)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="per-rank batch size (default: the table file's, else 512)")
    p.add_argument("--objective", default="time", choices=OBJECTIVES)
    p.add_argument("--mode", default="1d", choices=MODES + ("auto",),
                   help="1d: shard over all ranks (default); 2d: shard inside each host, "
                        "replicate across hosts; auto: the better of the two")
    p.add_argument("--sync-every", type=int, default=1,
                   help="2d: steps between replica syncs (default 1)")
    p.add_argument("--reserve", type=float, default=0.15,
                   help="fraction of device memory kept for the rest of the model (0.15)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--plot", default=None, help="also save per-rank bars to this PNG")
    return p


def _topology(args: argparse.Namespace) -> HierarchicalTopology:
    if args.topology:
        topo = HierarchicalTopology.from_file(args.topology)
        changes = {k: v for k, v in (("hosts", args.hosts),
                                     ("devices_per_host", args.devices_per_host)) if v is not None}
        return topo.replace(**changes) if changes else topo
    return HierarchicalTopology.from_preset(args.preset, hosts=args.hosts or 1,
                                            devices_per_host=args.devices_per_host)


def _check_counts(args: argparse.Namespace) -> None:
    for flag, value in (("--hosts", args.hosts), ("--devices-per-host", args.devices_per_host),
                        ("--batch-size", args.batch_size)):
        if value is not None and value < 1:
            raise ValueError(f"{flag}={value}: must be an integer >= 1")


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        _check_counts(args)
        topo = _topology(args)
        tables, file_batch = load_tables(args.tables)
        batch = args.batch_size if args.batch_size is not None else (file_batch or 512)
        ensure_device_name(topo.compute_device)
        kwargs = dict(batch_size=batch, constraints=table_constraints(tables),
                      objective=args.objective, reserve_fraction=args.reserve)
        module = build_module(tables)
        mode = args.mode
        if mode == "auto":
            choice = choose_parallelism(module, default_sharders(), topo,
                                        sync_every=args.sync_every, **kwargs)
            planner, plan, mode = choice.planner, choice.plan, choice.mode
        else:
            planner = (TwoDimShardingPlanner(topo, sync_every=args.sync_every, **kwargs)
                       if mode == "2d" else HierarchicalShardingPlanner(topo, **kwargs))
            plan = planner.plan(module, default_sharders())
    except (ValueError, OSError, HierarchicalPlannerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    explanation = planner.explain(plan)
    if args.plot:
        explanation.plot(args.plot)
    if args.json:
        doc = explanation.to_dict()
        doc["batch_size"] = batch
        doc["objective"] = args.objective
        doc["mode"] = mode
        if mode == "2d":
            doc["sync_every"] = args.sync_every
        print(json.dumps(doc, indent=2))
    else:
        sync = f", sync every {args.sync_every} steps" if mode == "2d" else ""
        print(f"per-rank batch {batch}, objective {args.objective}, mode {mode}{sync}")
        print(explanation.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
