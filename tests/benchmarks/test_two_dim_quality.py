"""The pieces of benchmarks/two_dim_quality.py: its modes and the paired summary against the
``1d`` baseline (hand-computed), without training."""

import math
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks import two_dim_quality as tdq  # noqa: E402


def test_mode_overrides():
    assert tdq.mode_overrides("1d") == ["train.planner=hierarchical"]
    assert tdq.mode_overrides("2d_25") == ["train.planner=hierarchical_2d", "train.sync_every=25",
                                           "train.replica_merge=mean"]
    assert tdq.mode_overrides("2d_7_sum") == ["train.planner=hierarchical_2d",
                                              "train.sync_every=7", "train.replica_merge=sum"]
    for bad in ("2d", "2d_0", "2d_x", "3d_5", "sync", "2d_5_max", "2d_5_sum_x"):
        with pytest.raises(ValueError, match=f"mode '{bad}'"):
            tdq.mode_overrides(bad)


def _run(mode: str, seed: int, final: float, late: list, at200: float) -> dict:
    evals = [{"step": 100 * (i + 1), "ndcg@10": v} for i, v in enumerate(late)]
    return {"mode": mode, "seed": seed, "valid": {"ndcg@10": final, "ndcg@200": at200},
            "evals": evals}


def test_summary_is_paired_with_the_1d_baseline():
    # 300 steps: the plateau is the evaluations at steps >= 200 (the last two here)
    runs = [_run("1d", 0, 0.040, [0.01, 0.030, 0.050], 0.20),
            _run("2d_10", 0, 0.044, [0.02, 0.036, 0.036], 0.19),
            _run("1d", 1, 0.050, [0.01, 0.040, 0.060], 0.25),
            _run("2d_10", 1, 0.045, [0.03, 0.045, 0.045], 0.25)]
    s = tdq.summarize(runs, 300, baseline=tdq.BASELINE)
    final = s["final_ndcg@10"]["2d_10"]
    assert final["per_seed"] == pytest.approx({"0": 0.1, "1": -0.1})
    assert final["mean"] == pytest.approx(0.0, abs=1e-12)
    sd = math.sqrt(0.02)  # sample sd of (0.1, -0.1)
    assert final["sd"] == pytest.approx(sd)
    half = 12.706 * sd / math.sqrt(2)
    assert final["ci95"] == pytest.approx([-half, half])
    plateau = s["plateau_ndcg@10"]["2d_10"]["per_seed"]
    assert plateau == pytest.approx({"0": 0.036 / 0.040 - 1, "1": 0.045 / 0.050 - 1})
    assert s["final_ndcg@200"]["2d_10"]["per_seed"] == pytest.approx({"0": -0.05, "1": 0.0})
    assert "1d" not in s["final_ndcg@10"]
    assert s["final_ndcg@10"]["1d_seed_relative_std"] == pytest.approx(
        math.sqrt(0.00005) / 0.045)
