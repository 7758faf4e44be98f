"""tools/results_table.py: rows and ratios from a comparison file, computed by hand here."""

from __future__ import annotations

import importlib
import os

import pytest



def _tool():
    """tools/results_table.py as a module (the repository root is on sys.path under ``python -m pytest``)."""
    return importlib.import_module("tools.results_table")


def _metrics(x):
    return {m: x for m in ("hr@10", "hr@50", "hr@200", "ndcg@10", "ndcg@50", "ndcg@200", "mrr")}


def _run(x, tokens):
    pop = {"valid": _metrics(0.01), "test": _metrics(0.02)}
    return {"command": "c", "results": {
        "config_values": {"train": {"epochs": 20.0}},
        "models": {"hstu": {"valid": _metrics(x), "test": _metrics(x / 2), "tokens_per_s": tokens}},
        "baselines": {"most_popular": pop}}}


def test_rows_ratios_and_shared_baseline_once():
    tool = _tool()
    doc = {"runs": {"a": _run(0.4, 1234.4), "b": _run(0.3, 99.6)},
           "published": {"ref": {"model": "HSTU", "epochs": 101,
                                 "test": {"hr@10": 0.25, "ndcg@10": 0.1}}}}
    rows = tool.result_rows(doc)
    assert rows[2] == ("| a | HSTU | valid | 0.4000 | 0.4000 | 0.4000 | 0.4000 | 0.4000 | 0.4000 | "
                       "0.4000 | 1,234 | 20 |")
    assert rows[3].startswith("| a | HSTU | test | 0.2000 |")
    assert sum("most popular" in r for r in rows) == 2  # valid + test, once for both runs
    assert rows[-1] == "| ref | HSTU | test | 0.2500 |  |  | 0.1000 |  |  |  |  | 101 |"
    ratios = tool.ratio_rows(doc)
    # a: test 0.2 vs 0.25 -> -20.0%; vs 0.1 -> +100.0%; b: 0.15 vs 0.25 -> -40.0%, vs 0.1 -> +50.0%
    assert ratios[2] == "| a | ref | -20.0% |  |  | +100.0% |  |  |  |"
    assert ratios[3] == "| b | ref | -40.0% |  |  | +50.0% |  |  |  |"


def test_run_ratios_against_a_measured_run():
    tool = _tool()
    other = _run(0.9, 1.0)
    other["results"]["config_values"]["train"]["epochs"] = 5.0  # not compared: other epochs
    doc = {"runs": {"ref": _run(0.4, 100.0), "a": _run(0.5, 350.0), "c": other,
                    "b": _run(0.2, 50.0)},
           "compare_to": ["ref"]}
    assert tool.ratio_rows(doc) == []  # nothing published
    rows = tool.run_ratio_rows(doc)
    # test metrics are valid / 2: a 0.25 vs 0.2 -> +25.0%, b 0.1 vs 0.2 -> -50.0%
    assert rows[2] == "| a | ref |" + " +25.0% |" * 7 + " 3.50x |"
    assert rows[3] == "| b | ref |" + " -50.0% |" * 7 + " 0.50x |"
    assert len(rows) == 4
    assert tool.run_ratio_rows({"runs": doc["runs"]}) == []
    with pytest.raises(ValueError, match=r"compare_to: \['x'\] are not labels of runs"):
        tool.run_ratio_rows({"runs": doc["runs"], "compare_to": ["x"]})
