"""The ranking task under the trainer, in process groups: 2 gloo ranks x batch 4 equal 1 process
x batch 8 (losses and metrics within 1e-5), the simulated npu equals cpu, a resumed run equals
an uninterrupted one, the DLRM baseline and both layouts train; results.json has every task."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch

pytest.importorskip("torchrec")

from torchrec_ascend import device as _device  # noqa: E402
from torchrec_ascend.testing import simulated_npu  # noqa: E402
from torchrec_ascend.testing.multiprocess import run_multiprocess  # noqa: E402
from torchrec_ascend.training import Trainer, config_from_dict  # noqa: E402
from torchrec_ascend.training.console import Console  # noqa: E402
from torchrec_ascend.training.process_group import init_distributed  # noqa: E402
from torchrec_ascend.training.ranking import RankingTask, prepare_ranking  # noqa: E402
from torchrec_ascend.training.refit import refit, refit_config  # noqa: E402
from torchrec_ascend.options import OptionError  # noqa: E402

STEPS = 4
TOL = 1e-5


def tiny_config(cache: str, **train):
    t = {"batch_size": 8, "steps": STEPS, "log_every": 2, "seed": 3, "peak_gemm_size": 64,
         "sparse_lr": 0.05}
    t.update(train)
    layout = t.pop("layout", "summed")
    watch = t.pop("watch_time_weight", 0.0)
    return config_from_dict({
        "task": "ranking", "models": ["hstu"],
        "data": {"source": "synthetic", "cache_dir": cache,
                 "synthetic": {"num_users": 60, "num_items": 80, "num_clusters": 5,
                               "mean_len": 10, "max_len": 30, "random_log_rows": 10, "seed": 5}},
        "model": {"embedding_dim": 8, "num_layers": 1, "num_heads": 2, "attention_dim": 4,
                  "linear_dim": 4, "max_seq_len": 24, "dropout": t.pop("dropout", 0.0)},
        "ranking": {"max_candidates": 3, "head_dims": [8], "layout": layout,
                    "watch_time_weight": watch,
                    "dlrm_dense_dims": [8], "dlrm_over_dims": [8]},
        "train": t, "eval": {"batch_size": 16}})


def run_one(out: str, cache: str, kind: str = "hstu", device_type: str = "cpu",
            resume: bool = False, **train) -> dict:
    if device_type != "cpu":
        os.environ[_device.ENV_DEVICE] = device_type
    env = init_distributed(device_type)
    cfg = tiny_config(cache, **train)
    task = RankingTask(cfg, prepare_ranking(cfg))
    trainer = Trainer(cfg, task, env, out, kind, peak_flops=1e9, progress=False,
                      console=Console(False), resume=resume)
    res = trainer.fit()
    return {"losses": [v for _, v in res["history"]["loss"]], "valid": res["valid"],
            "test": res["test"], "world": env.world_size,
            "device": str(next(trainer.model.parameters()).device.type)}


def _worker(rank: int, world: int, out: str, cache: str, device_type: str, runs: list) -> list:
    return [run_one(os.path.join(out, f"run{i}"), cache, device_type=device_type, **r)
            for i, r in enumerate(runs)]


def _run(tmp_path, world: int, runs: list, device_type: str = "cpu") -> list:
    return run_multiprocess(_worker, world, (str(tmp_path), str(tmp_path / "cache"), device_type,
                                             runs), device_type=device_type)[0]


def _same(a: dict, b: dict, tol: float = TOL) -> None:
    assert len(a["losses"]) == len(b["losses"]) == STEPS
    np.testing.assert_allclose(a["losses"], b["losses"], rtol=tol, atol=tol)
    for split in ("valid", "test"):
        for task, m in a[split].items():
            if isinstance(m, dict):
                for k in ("auc", "gauc", "ne", "logloss"):
                    if m[k] is None:
                        assert b[split][task][k] is None
                    else:
                        assert b[split][task][k] == pytest.approx(m[k], abs=1e-4), (split, task, k)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("rank-ref"), 1,
                [{}, {"layout": "interleaved"}, {"kind": "dlrm"}, {"dropout": 0.1}])


def test_single_process_trains_every_kind(reference):
    for r in reference[:3]:
        assert len(r["losses"]) == STEPS and all(np.isfinite(r["losses"]))
        for split in ("valid", "test"):
            assert r[split]["mean_auc"] is not None and 0 <= r[split]["mean_auc"] <= 1
            assert r[split]["is_click"]["count"] > 0
    # the layouts and the models differ (the comparisons below are not vacuous)
    assert abs(reference[0]["losses"][-1] - reference[1]["losses"][-1]) > 1e-4
    assert abs(reference[0]["losses"][-1] - reference[2]["losses"][-1]) > 1e-4
    assert abs(reference[0]["losses"][-1] - reference[3]["losses"][-1]) > 1e-4


@pytest.mark.slow
def test_two_ranks_equal_one_process(tmp_path, reference):
    two = _run(tmp_path, 2, [{"batch_size": 4}, {"batch_size": 4, "kind": "dlrm"},
                             {"batch_size": 4, "balance": "all_to_all"}])
    _same(reference[0], two[0])
    _same(reference[2], two[1])
    _same(reference[0], two[2])


@pytest.mark.slow
@pytest.mark.skipif(not (_device.torch_npu_available() or simulated_npu.available()),
                    reason="needs torch_npu or the built simulated npu")
def test_simulated_npu_matches_cpu(tmp_path, reference):
    (npu,) = _run(tmp_path, 1, [{}], device_type="npu")
    assert npu["device"] == "npu"
    _same(reference[0], npu)


def _resume_worker(rank: int, world: int, out: str, cache: str) -> dict:
    run_one(out, cache, steps=2, checkpoint_every=2)
    return run_one(out, cache, resume=True)


def test_resume_equals_uninterrupted(tmp_path, reference):
    """Train 2 steps with a checkpoint, then resume to 4: every loss and metric equals the
    uninterrupted 4-step run (data order, dropout and tables are functions of the step)."""
    (resumed,) = run_multiprocess(_resume_worker, 1, (str(tmp_path / "run"),
                                                      str(tmp_path / "cache")))
    np.testing.assert_array_equal(resumed["losses"], reference[0]["losses"])
    assert resumed["test"]["is_click"]["auc"] == reference[0]["test"]["is_click"]["auc"]


def test_each_model_trains_its_tables_at_its_sparse_lr(tmp_path):
    env = init_distributed("cpu")
    cfg = tiny_config(str(tmp_path / "cache"), sparse_lr=0.02)
    cfg.ranking.dlrm_sparse_lr = 0.07
    task = RankingTask(cfg, prepare_ranking(cfg))
    for kind, lr in (("hstu", 0.02), ("dlrm", 0.07)):
        trainer = Trainer(cfg, task, env, str(tmp_path / kind), kind, peak_flops=1e9,
                          progress=False, console=Console(False))
        lrs = [g["lr"] for g in trainer.dmp.fused_optimizer.param_groups]
        assert lrs and lrs == pytest.approx([lr] * len(lrs)), kind


def _fit_and_refit(out: str, cache: str, **train):
    env = init_distributed("cpu")
    cfg = tiny_config(cache, steps=6, eval_every=2, **train)
    cfg.eval.restore_best = True
    cfg.ranking.refit = True
    task = RankingTask(cfg, prepare_ranking(cfg))
    first = Trainer(cfg, task, env, out, "hstu", peak_flops=1e9, progress=False,
                    console=Console(False))
    res = first.fit()
    res.pop("history")
    return task, first, res, refit(cfg, task, env, out, "hstu", 1e9, first, dict(res),
                                   Console(False), progress=False)


def test_refit_trains_on_train_and_valid_for_the_chosen_share(tmp_path):
    task, first, res, merged = _fit_and_refit(str(tmp_path / "run"), str(tmp_path / "cache"))
    view = task.refit_task()
    assert view is not None and not view.has_valid and task.has_valid
    n_first, n_refit = len(task.examples["train"]), len(task.examples["train+valid"])
    assert n_refit > n_first
    per_epoch = view.batches("hstu", 0, 1, None).steps_per_epoch
    assert per_epoch == n_refit // 8 > first.batches.steps_per_epoch  # full batches
    r = merged["refit"]
    chosen = res["restored_step"] or res["steps"]
    assert r["chosen_step"] == chosen and r["of_steps"] == 6
    # train.steps = 6 is 6 / (first epoch's steps) epochs of the larger data, stopped at the
    # same share
    want_total = math.ceil(6 / first.batches.steps_per_epoch * per_epoch)
    assert r["schedule_steps"] == want_total and r["steps_per_epoch"] == per_epoch
    assert r["steps"] == max(1, round(chosen / 6 * want_total))
    logged = [json.loads(x)["step"] for x in open(tmp_path / "run" / "hstu" / "refit" / "log.jsonl")
              if '"loss"' in x]
    assert logged == list(range(1, r["steps"] + 1))
    assert merged["valid"] == res["valid"] and r["test_without_refit"] == res["test"]
    assert merged["test"]["is_click"]["logloss"] != res["test"]["is_click"]["logloss"]
    assert merged["test"]["is_click"]["count"] == res["test"]["is_click"]["count"]


def _refit_worker(rank: int, world: int, out: str, cache: str, batch: int) -> dict:
    return _fit_and_refit(out, cache, batch_size=batch)[3]


@pytest.mark.slow
def test_refit_two_ranks_equal_one_process(tmp_path):
    """The refit under 2 gloo ranks x batch 4 equals 1 process x batch 8: the same chosen step,
    refit steps and test metrics (within 1e-4)."""
    (one,) = run_multiprocess(_refit_worker, 1, (str(tmp_path / "one"), str(tmp_path / "c1"), 8))
    two = run_multiprocess(_refit_worker, 2, (str(tmp_path / "two"), str(tmp_path / "c2"), 4))[0]
    assert {k: v for k, v in two["refit"].items() if k != "test_without_refit"} == \
        {k: v for k, v in one["refit"].items() if k != "test_without_refit"}
    for task, m in one["test"].items():
        if isinstance(m, dict) and m.get("auc") is not None:
            assert two["test"][task]["auc"] == pytest.approx(m["auc"], abs=1e-4), task
            assert two["test"][task]["logloss"] == pytest.approx(m["logloss"], abs=1e-4), task


def test_refit_config_drops_validation_and_keeps_the_epochs(tmp_path):
    cfg = tiny_config(str(tmp_path), steps=10, eval_every=5, early_stopping_patience=2)
    cfg.eval.restore_best = True
    out = refit_config(cfg, steps_per_epoch=4)
    assert out.train.steps is None and out.train.epochs == 2.5
    assert out.train.eval_every == 0 and out.train.early_stopping_patience == 0
    assert not out.eval.restore_best and cfg.train.steps == 10 and cfg.eval.restore_best


def test_a_refit_without_the_option_is_refused(tmp_path):
    cfg = tiny_config(str(tmp_path / "cache"))
    task = RankingTask(cfg, prepare_ranking(cfg))
    assert task.refit_task() is None
    with pytest.raises(ValueError, match="no refit"):
        refit(cfg, task, None, str(tmp_path), "hstu", 1e9, None, {}, Console(False))


@pytest.mark.parametrize("kind", ["hstu", "dlrm"])
def test_watch_time_regression_trains_and_is_reported(tmp_path, kind):
    r = run_one(str(tmp_path / "run"), str(tmp_path / "cache"), kind=kind,
                watch_time_weight=0.5)
    assert all(np.isfinite(r["losses"]))
    for split in ("valid", "test"):
        w = r[split]["watch_time"]
        assert w["count"] == r[split]["is_click"]["count"] > 0 and w["missing"] == 0
        assert w["rmse"] > 0 and w["mae"] > 0 and w["r2"] is not None
    cfg = tiny_config(str(tmp_path / "cache"), watch_time_weight=0.5)
    data = prepare_ranking(cfg)
    data.watch_time = None  # a log without play_time_ms
    with pytest.raises(OptionError, match=r"ranking.watch_time_weight: needs the data's "
                                          r"watch-time column \(play_time_ms"):
        RankingTask(cfg, data)
