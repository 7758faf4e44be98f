"""tools/reference_comparison.py: its statistics against hand computations, its tokens/s reading of
both result formats, the alternating timer on a fake runner, and the file / table it builds."""

from __future__ import annotations

import importlib
import json
import math
import subprocess

import pytest

METRICS = ("hr@10", "hr@50", "hr@200", "ndcg@10", "ndcg@50", "ndcg@200", "mrr")


def _tool():
    return importlib.import_module("tools.reference_comparison")


def _metrics(v):
    return {m: v for m in METRICS}


def _ours(folder, seed, test, valid, windows, epochs=3.0):
    """Our trainer's results.json + hstu/log.jsonl: ``windows`` = [(last step, tokens/s)], every
    step 100 ms."""
    (folder / "hstu").mkdir(parents=True)
    res = {"config": "name", "config_values": {"train": {"epochs": epochs, "seed": seed}},
           "models": {"hstu": {"test": _metrics(test), "valid": _metrics(valid),
                               "tokens_per_s": windows[-1][1]}}}
    (folder / "results.json").write_text(json.dumps(res))
    rows = [{"step": 0, "precision": "fp32"}]
    prev = 0
    for last, tps in windows:
        rows += [{"step": s, "step_ms": 100.0} for s in range(prev + 1, last + 1)]
        rows.append({"step": last, "tokens_per_s": tps})
        prev = last
    (folder / "hstu" / "log.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(folder)


def _reference(folder, seed, test, tps, epochs=3.0):
    folder.mkdir(parents=True)
    res = {"seed": seed, "config_values": {"train": {"epochs": epochs}},
           "models": {"hstu": {"test": _metrics(test), "tokens_per_s": tps + 1.0,
                               "tokens_per_s_mean": tps}}}
    (folder / "results.json").write_text(json.dumps(res))
    return str(folder)


def test_mean_se_and_relative_difference_match_hand_computation():
    t = _tool()
    m, se = t.mean_se([1.0, 2.0, 6.0])
    assert m == pytest.approx(3.0)
    assert se == pytest.approx(math.sqrt(7.0) / math.sqrt(3.0))  # stdev sqrt(((4+1+9)/2)) = sqrt(7)
    assert t.mean_se([5.0]) == (5.0, 0.0)
    rel, rel_se = t.relative_difference([1.1, 1.3], [1.0, 1.0])
    assert rel == pytest.approx(0.2)
    # se_a = 0.1 / sqrt(2) ... stdev([1.1, 1.3]) = 0.1414, / sqrt(2) = 0.1; se_b = 0
    assert rel_se == pytest.approx(1.2 * (0.1 / 1.2))
    with pytest.raises(ValueError, match="baseline's mean is 0"):
        t.relative_difference([1.0], [0.0])


def test_tokens_per_s_weights_our_windows_by_seconds_and_reads_the_reference_mean(tmp_path):
    t = _tool()
    # window 1: 10 steps (1 s) at 1000 tokens/s; window 2: 30 steps (3 s) at 3000 -> 10000/4
    ours = _ours(tmp_path / "o", 0, 0.1, 0.1, [(10, 1000.0), (40, 3000.0)])
    assert t.run_tokens_per_s(ours) == pytest.approx(10000.0 / 4.0)
    ref = _reference(tmp_path / "r", 42, 0.1, 777.0)
    assert t.run_tokens_per_s(ref) == 777.0


def test_build_groups_seeds_and_compares_at_equal_epochs(tmp_path):
    t = _tool()
    ref = t.group_summary("ref cmd", [_reference(tmp_path / "r0", 42, 0.10, 100.0),
                                      _reference(tmp_path / "r1", 43, 0.20, 100.0)])
    ours = t.group_summary("our cmd", [_ours(tmp_path / "o0", 0, 0.30, 0.2, [(5, 400.0)]),
                                       _ours(tmp_path / "o1", 1, 0.15, 0.1, [(5, 400.0)])])
    assert [r["seed"] for r in ref["runs"]] == [42, 43] and [r["seed"] for r in ours["runs"]] == [0, 1]
    assert ref["test_mean"]["mrr"] == pytest.approx(0.15) and "valid_mean" not in ref
    assert ours["valid_mean"]["hr@10"] == pytest.approx(0.15)
    doc = t.build({"reference": ref, "ours": ours}, "reference", "data", "machine", None)
    d = doc["relative_to_compare_to"]["ours"]["ndcg@10"]
    assert d["rel"] == pytest.approx(0.225 / 0.15 - 1.0)
    want_se = 1.5 * math.sqrt((0.075 / 0.225) ** 2 + (0.05 / 0.15) ** 2)
    assert d["rel_se"] == pytest.approx(want_se)
    lines = t.tables(doc)
    assert any(l.startswith("| ours | reference | +50.0% ± ") for l in lines)
    assert "| reference | test | 2 | 3 | 0.1500 ± 0.0500 |" in "\n".join(lines)
    single = t.build({"reference": t.group_summary("c", [str(tmp_path / "r0")]),
                      "ours": t.group_summary("c", [str(tmp_path / "o0")])}, "reference", "d", "m", None)
    text = "\n".join(t.tables(single))
    assert "| reference | test | 1 | 3 | 0.1000 | " in text and "±" not in text  # no spread of one
    late = t.group_summary("our cmd", [_ours(tmp_path / "o9", 0, 0.3, 0.2, [(5, 1.0)], epochs=5.0)])
    with pytest.raises(ValueError, match="compare at equal epochs"):
        t.build({"reference": ref, "ours": late}, "reference", "d", "m", None)
    with pytest.raises(ValueError, match="--compare-to: no group 'nope'"):
        t.build({"reference": ref}, "nope", "d", "m", None)


def test_time_commands_alternates_order_and_takes_the_median_ratio(tmp_path):
    t = _tool()
    speed = {"ref": [100.0, 200.0, 100.0], "ours": [500.0, 600.0, 1000.0]}
    calls = []

    def runner(line, shell, stdout, stderr):  # writes the run folder its command names
        label, out = line.split()[0], line.split()[1]
        r = sum(1 for c in calls if c == label)
        calls.append(label)
        import pathlib
        if label == "ref":
            _reference(pathlib.Path(out), 42, 0.1, speed[label][r])
        else:
            _ours(pathlib.Path(out), 0, 0.1, 0.1, [(4, speed[label][r])])
        return subprocess.CompletedProcess(line, 0)

    res = t.time_commands([("ref", "ref {out}"), ("ours", "ours {out}")], 3, str(tmp_path), runner)
    assert calls == ["ref", "ours", "ours", "ref", "ref", "ours"]
    assert res["ratio_to_first"]["ours"] == pytest.approx(5.0)  # median of 5, 3, 10
    assert res["tokens_per_s_median"] == {"ref": 100.0, "ours": 600.0}
    with pytest.raises(ValueError, match="labels must be distinct"):
        t.time_commands([("a", "x {out}"), ("a", "y {out}")], 1, str(tmp_path), runner)

    def failing(line, shell, stdout, stderr):
        return subprocess.CompletedProcess(line, 3)

    with pytest.raises(RuntimeError, match="exit status 3"):
        t.time_commands([("ref", "ref {out}")], 1, str(tmp_path), failing)


def test_reference_run_read_at_an_earlier_epoch(tmp_path):
    """``DIR@N``: the epoch-N evaluation, tokens/s over the first N epochs (weighted by their
    training seconds), N epochs; fewer evaluations than N, or ours, is an error."""
    t = _tool()
    folder = tmp_path / "ref"
    folder.mkdir()
    evals = [{"epoch": k + 1, "tokens_per_s": tps, "train_s": s, **_metrics(v)}
             for k, (tps, s, v) in enumerate([(100.0, 1.0, 0.1), (400.0, 3.0, 0.2),
                                             (50.0, 10.0, 0.3)])]
    res = {"seed": 42, "config_values": {"train": {"epochs": 3.0}},
           "models": {"hstu": {"test": _metrics(0.3), "tokens_per_s": 50.0,
                               "tokens_per_s_mean": 99.0, "evals": evals}}}
    (folder / "results.json").write_text(json.dumps(res))
    at2 = t.load_run(f"{folder}@2")
    assert at2["models"]["hstu"]["test"] == _metrics(0.2)
    assert at2["config_values"]["train"]["epochs"] == 2.0
    assert t.run_tokens_per_s(f"{folder}@2") == pytest.approx((100.0 * 1 + 400.0 * 3) / 4)
    g = t.group_summary("cmd", [f"{folder}@2"])
    assert g["epochs"] == 2.0 and g["runs"][0]["dir"] == "ref@2"
    assert g["test_mean"]["hr@10"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="needs a reference run with >= 4"):
        t.load_run(f"{folder}@4")
    with pytest.raises(ValueError, match="expected DIR@N"):
        t.load_run(f"{folder}@0")
