"""tools/public_sets_results.py: cells built from hand-made run folders (a reference run read at an
earlier epoch, ours' two groups) and the acceptance rule against hand computations."""

from __future__ import annotations

import importlib
import json

import pytest

METRICS = ("hr@10", "hr@50", "hr@200", "ndcg@10", "ndcg@50", "ndcg@200", "mrr")


def _tool():
    return importlib.import_module("tools.public_sets_results")


def _m(v):
    return {m: v for m in METRICS}


def _reference(folder, seed, values, tps=100.0):
    folder.mkdir(parents=True)
    evals = [{"epoch": k + 1, "tokens_per_s": tps, "train_s": 1.0, **_m(v)}
             for k, v in enumerate(values)]
    (folder / "results.json").write_text(json.dumps({
        "seed": seed, "epochs_done": len(values), "config_values": {"train": {"epochs": 20.0}},
        "models": {"hstu": {"test": _m(values[-1]), "tokens_per_s": tps,
                            "tokens_per_s_mean": tps, "evals": evals}}}))


def _ours(folder, seed, value, tps, epochs=3.0):
    (folder / "hstu").mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({
        "config_values": {"train": {"epochs": epochs, "seed": seed}},
        "models": {"hstu": {"test": _m(value), "valid": None, "tokens_per_s": tps}}}))
    rows = [{"step": s, "step_ms": 10.0} for s in range(1, 11)] + [{"step": 10,
                                                                    "tokens_per_s": tps}]
    (folder / "hstu" / "log.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_cell_and_acceptance(tmp_path):
    t = _tool()
    root = tmp_path / "d"
    # reference: two seeds; at epoch 3 their values are 0.10 and 0.12 (mean 0.11); one run
    # has only 2 epochs and is not used at epoch 3
    _reference(root / "ref-s42", 42, [0.01, 0.05, 0.10, 0.3])
    _reference(root / "ref-s43", 43, [0.02, 0.06, 0.12, 0.3])
    _reference(root / "ref-s44", 44, [0.02, 0.06])
    _ours(root / "ours-def-l1o-e3-s0", 0, 0.11, 400.0)     # equal: holds (bound 0)
    _ours(root / "ours-ref-l1o-e3-s0", 0, 0.1089, 250.0)   # -1%: holds (bound -2%)
    _ours(root / "ours-ref-l1o-e3-s1", 1, 0.1081, 350.0)   # mean 0.1085: -1.4%: holds
    c = t.cell(str(tmp_path), "d", 3, "m")
    assert [r["dir"] for r in c["groups"]["reference"]["runs"]] == ["ref-s42@3", "ref-s43@3"]
    a = c["acceptance"]
    d = a["ours, defaults"]
    assert d["metrics"]["hr@10"]["rel"] == pytest.approx(0.0, abs=1e-12)
    assert d["metrics"]["hr@10"]["holds"] and d["tokens_per_s_ratio"] == pytest.approx(4.0)
    r = a["ours, --config reference"]
    assert r["metrics"]["mrr"]["rel"] == pytest.approx(0.1085 / 0.11 - 1)
    assert r["metrics"]["mrr"]["holds"] and r["seeds"] == 2 and r["reference_seeds"] == 2
    assert r["tokens_per_s_ratio"] == pytest.approx(3.0)
    _ours(root / "ours-def-l1o-e3-s1", 1, 0.10, 400.0)     # mean 0.105 < 0.11: fails
    c = t.cell(str(tmp_path), "d", 3, "m")
    assert not c["acceptance"]["ours, defaults"]["metrics"]["ndcg@10"]["holds"]
    assert t.cell(str(tmp_path), "d", 5, "m") is None   # no reference run has 5 epochs
