#!/usr/bin/env python
"""docs/results/public-sets-reference-cpu.json: issue 30's side-by-side runs (Meta's reference
HSTU vs ours, trainer defaults and ``--config reference``, the reference's leave-one-out split)
on the public data sets of docs/datasets_public.md, one comparison per data set and epoch point,
plus the acceptance check of every cell.

    python tools/public_sets_results.py --runs RUNS --out docs/results/public-sets-reference-cpu.json \\
        --machine "2-core Intel Xeon ..." s3-lastfm:3,20 s3-toys:3 yelpb-t:3
    python tools/public_sets_results.py --table docs/results/public-sets-reference-cpu.json

``RUNS/<data>/`` holds ``ref-s<seed>/`` (``tools/reference_hstu_cpu.py --epochs E``, read at each
epoch point ``N <= E`` as ``ref-s<seed>@N``: its epoch-N evaluation, see
``tools/reference_comparison.py``) and ``ours-def-l1o-e<N>-s<seed>/`` /
``ours-ref-l1o-e<N>-s<seed>/`` (``python -m torchrec_ascend.training --data <data>.csv --epochs N
--threads 1 --set eval.holdout=leave_one_out --set train.seed=S [--config reference]``).  Only
finished runs are used (a reference run needs N evaluated epochs); the seeds found are listed.

Acceptance (issue 30), per cell = (data set, epoch point): ours with the trainer's defaults at or
above the reference's mean on each of HR@10, NDCG@10, HR@200, MRR (means over the seeds found);
``--config reference`` within 2% of the reference or above on each.  Tokens/s are each group's
whole-run means over its seeds; the runs were concurrent on a shared machine (not alternating),
so the ratio is indicative (docs/public_sets_reference_cpu.md).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from reference_comparison import build, group_summary, tables  # noqa: E402

CHECKED = ("hr@10", "ndcg@10", "hr@200", "mrr")
REF, DEF, REFCFG = "reference", "ours, defaults", "ours, --config reference"
OURS_CMD = ("python -m torchrec_ascend.training --data {data}.csv --epochs {e} --threads 1 "
            "--no-progress --set eval.holdout=leave_one_out --set train.seed=S{extra} --out {dir}")
REF_CMD = ("python tools/reference_hstu_cpu.py --reference generative-recommenders --ratings "
           "{data}.dat --epochs E --seed S --out {dir} (read at epoch {e})")


def _finished(d: str) -> bool:
    p = os.path.join(d, "results.json")
    if not os.path.exists(p):
        return False
    with open(p) as f:
        return bool(json.load(f).get("models"))


def _reference_runs(root: str, epochs: int) -> List[str]:
    out = []
    for d in sorted(glob.glob(os.path.join(root, "ref-s*"))):
        if not os.path.exists(os.path.join(d, "results.json")):
            continue
        with open(os.path.join(d, "results.json")) as f:
            done = json.load(f).get("epochs_done", 0)
        if done >= epochs:
            out.append(f"{d}@{epochs}")
    return out


def cell(runs: str, data: str, epochs: int, machine: str) -> Optional[Dict[str, Any]]:
    """The comparison of one (data set, epoch point), or None without reference runs."""
    root = os.path.join(runs, data)
    groups: Dict[str, Dict[str, Any]] = {}
    refs = _reference_runs(root, epochs)
    if not refs:
        return None
    groups[REF] = group_summary(REF_CMD.format(data=data, dir="ref-sS", e=epochs), refs)
    for label, kind, extra in ((DEF, "def", ""), (REFCFG, "ref", " --config reference")):
        dirs = [d for d in sorted(glob.glob(os.path.join(root, f"ours-{kind}-l1o-e{epochs}-s*")))
                if _finished(d)]
        if dirs:
            groups[label] = group_summary(OURS_CMD.format(data=data, e=epochs, extra=extra,
                                                          dir=f"ours-{kind}-l1o-e{epochs}-sS"),
                                          dirs)
    doc = build(groups, REF, f"{data} (docs/datasets_public.md), leave-one-out test",
                machine, None)
    doc["acceptance"] = acceptance(doc)
    return doc


def acceptance(doc: Dict[str, Any]) -> Dict[str, Any]:
    """Per group and checked metric: mean relative to the reference, and whether it passes."""
    out: Dict[str, Any] = {}
    ref_tps = statistics.fmean(r["tokens_per_s"] for r in doc["groups"][REF]["runs"])
    for label, bound in ((DEF, 0.0), (REFCFG, -0.02)):
        if label not in doc["relative_to_compare_to"]:
            continue
        rel = doc["relative_to_compare_to"][label]
        tps = statistics.fmean(r["tokens_per_s"] for r in doc["groups"][label]["runs"])
        out[label] = {"bound": bound, "seeds": len(doc["groups"][label]["runs"]),
                      "reference_seeds": len(doc["groups"][REF]["runs"]),
                      "metrics": {m: {"rel": rel[m]["rel"], "holds": rel[m]["rel"] >= bound}
                                  for m in CHECKED},
                      "tokens_per_s_ratio": tps / ref_tps}
    return out


def acceptance_rows(doc: Dict[str, Any]) -> List[str]:
    rows = ["| data | epochs | run | seeds (ours / reference) | " + " | ".join(
        m.upper() for m in CHECKED) + " | tokens/s ratio of these runs (not side by side: see the timing) |",
            "|---|---|---|---|" + "---|" * len(CHECKED) + "---|"]
    for key, c in doc["cells"].items():
        data, e = key.rsplit("/e", 1)
        for label, a in c["acceptance"].items():
            rows.append(f"| {data} | {e} | {label} | {a['seeds']} / {a['reference_seeds']} | " +
                        " | ".join(f"{100 * a['metrics'][m]['rel']:+.1f}% "
                                   + ("yes" if a["metrics"][m]["holds"] else "**no**")
                                   for m in CHECKED) + f" | {a['tokens_per_s_ratio']:.1f}x |")
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cells", nargs="*", metavar="DATA:E[,E]", help="data set and epoch points")
    ap.add_argument("--runs", help="the runs' root folder")
    ap.add_argument("--out", help="the JSON to write")
    ap.add_argument("--machine", default="")
    ap.add_argument("--timing", nargs=2, action="append", default=[], metavar=("DATA", "FILE"),
                    help="a timing.json of tools/reference_comparison.py time for DATA")
    ap.add_argument("--table", help="print the tables of a written JSON")
    args = ap.parse_args(argv)
    if args.table:
        with open(args.table) as f:
            doc = json.load(f)
        print("\n".join(acceptance_rows(doc)))
        for data, t in doc.get("timing", {}).items():
            print(f"\n### throughput, {data} (alternating runs)\n")
            print("\n".join(tables({"groups": {}, "relative_to_compare_to": {},
                                     "compare_to": "", "timing": t})[6:]))
        for key, c in doc["cells"].items():
            print(f"\n### {key}\n")
            print("\n".join(tables(c)))
        return 0
    if not (args.runs and args.out and args.cells):
        ap.error("give --runs, --out and DATA:E cells (or --table FILE)")
    cells = {}
    for spec in args.cells:
        data, eps = spec.split(":")
        for e in eps.split(","):
            c = cell(args.runs, data, int(e), args.machine)
            if c is not None:
                cells[f"{data}/e{e}"] = c
    timing = {}
    for data, path in args.timing:
        with open(path) as f:
            timing[data] = json.load(f)
    doc = {"what": __doc__.split("\n\n")[0], "machine": args.machine, "cells": cells,
           "timing": timing}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}: {len(cells)} cells")
    print("\n".join(acceptance_rows(doc)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
