#!/usr/bin/env python
"""Markdown tables from a committed comparison file (``docs/results/movielens-1m.json``).

    python tools/results_table.py docs/results/movielens-1m.json

The file holds ``runs`` (label -> ``{"command", "results"}``, ``results`` being a trainer
``results.json``) and optionally ``published`` (label -> ``{"source", "test": {metric: value}}``);
a model without ``test`` (a periodic validation) prints its validation row only.  Printed: one
row per run x model x split (valid, test) and per most-popular baseline (once where runs share
it), then the published rows, then each run's HSTU test metrics relative to each published row.
A file with ``compare_to`` (a list of run labels, e.g. a reference run measured on the same
machine) also prints, for each of them, the HSTU test metrics and tokens/s of every other run
with the same number of epochs relative to it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional

METRICS = ("hr@10", "hr@50", "hr@200", "ndcg@10", "ndcg@50", "ndcg@200", "mrr")
NAMES = {"hstu": "HSTU", "sasrec": "SASRec-style", "most_popular": "most popular"}


def _cells(metrics: Dict[str, float]) -> List[str]:
    return [f"{metrics[m]:.4f}" if m in metrics else "" for m in METRICS]


def _row(cells: List[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def result_rows(doc: Dict[str, Any]) -> List[str]:
    """Rows of every run (models then baselines, valid then test) and of the published numbers."""
    head = ["run", "model", "split"] + [m.upper() for m in METRICS] + ["tokens/s", "epochs"]
    out = [_row(head), _row(["---"] * len(head))]
    seen = []  # a baseline identical to one printed already (same split, same data) is not repeated
    for label, run in doc["runs"].items():
        res = run["results"]
        epochs = res["config_values"]["train"].get("epochs")
        for model, r in res["models"].items():
            for split in ("valid", "test"):
                if r.get(split) is None:  # a periodic validation has no test; leave-one-out
                    continue              # has no validation
                tokens = f"{r['tokens_per_s']:,.0f}" if "tokens_per_s" in r else ""
                out.append(_row([label, NAMES.get(model, model), split] + _cells(r[split])
                                + [tokens, f"{epochs:g}" if epochs is not None else ""]))
        for name, r in res.get("baselines", {}).items():
            if (name, r) in seen:
                continue
            seen.append((name, r))
            for split in ("valid", "test"):
                if r.get(split) is None:
                    continue
                out.append(_row([label, NAMES.get(name, name), split] + _cells(r[split])
                                + ["", ""]))
    for label, pub in doc.get("published", {}).items():
        out.append(_row([label, pub.get("model", ""), "test"] + _cells(pub["test"])
                        + ["", f"{pub['epochs']:g}" if "epochs" in pub else ""]))
    return out


def ratio_rows(doc: Dict[str, Any], model: str = "hstu") -> List[str]:
    """Each run's ``model`` test metrics relative to each published row (ours / theirs - 1)."""
    pubs = doc.get("published", {})
    if not pubs:
        return []
    head = ["run", "vs"] + [m.upper() for m in METRICS]
    out = [_row(head), _row(["---"] * len(head))]
    seen = []  # a baseline identical to one printed already (same split, same data) is not repeated
    for label, run in doc["runs"].items():
        ours = run["results"]["models"].get(model)
        if ours is None or "test" not in ours:
            continue
        for plabel, pub in pubs.items():
            cells = [f"{ours['test'][m] / pub['test'][m] - 1:+.1%}"
                     if m in pub["test"] and m in ours["test"] else "" for m in METRICS]
            out.append(_row([label, plabel] + cells))
    return out


def _epochs(run: Dict[str, Any]) -> Optional[float]:
    return run["results"].get("config_values", {}).get("train", {}).get("epochs")


def run_ratio_rows(doc: Dict[str, Any], model: str = "hstu") -> List[str]:
    """``model`` test metrics and tokens/s of each run relative to each run named in
    ``compare_to`` with the same ``config_values.train.epochs`` (ours / theirs - 1; tokens/s as
    a factor)."""
    against = doc.get("compare_to", [])
    if not against:
        return []
    missing = [label for label in against if label not in doc["runs"]]
    if missing:
        raise ValueError(f"compare_to: {missing} are not labels of runs")
    head = ["run", "vs"] + [m.upper() for m in METRICS] + ["tokens/s"]
    out = [_row(head), _row(["---"] * len(head))]
    for base in against:
        theirs = doc["runs"][base]["results"]["models"][model]
        epochs = _epochs(doc["runs"][base])
        for label, run in doc["runs"].items():
            ours = run["results"]["models"].get(model)
            if label == base or ours is None or "test" not in ours or _epochs(run) != epochs:
                continue
            cells = [f"{ours['test'][m] / theirs['test'][m] - 1:+.1%}"
                     if m in ours["test"] and m in theirs["test"] else "" for m in METRICS]
            tok = (f"{ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}x"
                   if ours.get("tokens_per_s") and theirs.get("tokens_per_s") else "")
            out.append(_row([label, base] + cells + [tok]))
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="comparison JSON (runs + published)")
    args = ap.parse_args(argv)
    with open(args.file) as f:
        doc = json.load(f)
    print("\n".join(result_rows(doc)))
    for rows in (ratio_rows(doc), run_ratio_rows(doc)):
        if rows:
            print()
            print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
