"""``python -m torchrec_ascend.training --task ranking`` on a generic table with a label column:
the ranker, DLRM and the CTR baseline in results.json with every metric per task, the plot, and
bad ranking input as one line with exit status 2."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("torchrec")

from torchrec_ascend.datasets import generate_events_table  # noqa: E402
from torchrec_ascend.training.cli import main  # noqa: E402

SETS = ["model.embedding_dim=12", "model.max_seq_len=24", "model.num_heads=1",
        "model.attention_dim=8", "model.linear_dim=8", "train.batch_size=16",
        "train.threads=1", "train.peak_gemm_size=64", "train.log_every=5",
        "ranking.max_candidates=4", "ranking.head_dims=[16]", "ranking.dlrm_dense_dims=[8]",
        "ranking.dlrm_over_dims=[16]", "ranking.utc_offset_hours=0"]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return generate_events_table(str(tmp_path_factory.mktemp("t") / "log.csv"), 120, 150,
                                 seed=4, clicks=True)


def cli(tmp_path, *args):
    sets = []
    for s in SETS + [f"data.cache_dir={tmp_path / 'cache'}"]:
        sets += ["--set", s]
    return main(["--no-progress", "--task", "ranking", *args, *sets])


def test_table_with_a_label_column(tmp_path, table, capsys):
    out = tmp_path / "out"
    assert cli(tmp_path, "--data", table, "--label-cols", "click", "--out", str(out),
               "--steps", "12", "--set", "train.eval_every=6") == 0
    res = json.load(open(out / "results.json"))
    assert res["task"] == "ranking" and set(res["models"]) == {"hstu", "dlrm"}
    # no --config: the packaged ranking preset, under the command line's overrides
    assert res["config"] == "ranking"
    cfg = json.load(open(out / "run.json"))["config"]
    assert cfg["train"]["sparse_lr"] == 0.05 and cfg["eval"]["restore_best"] is True
    assert cfg["ranking"]["max_candidates"] == 4 and cfg["train"]["batch_size"] == 16
    assert set(res["baselines"]) == {"ctr"}
    for entry in list(res["models"].values()) + list(res["baselines"].values()):
        for split in ("valid", "test"):
            m = entry[split]["click"]
            assert 0 <= m["auc"] <= 1 and 0 <= m["gauc"] <= 1 and m["ne"] > 0
            assert m["logloss"] > 0 and 0 < m["positive_rate"] < 1 and m["count"] > 0
            assert entry[split]["mean_auc"] == m["auc"]
    assert [e["step"] for e in res["models"]["hstu"]["evals"]] == [6, 12]
    assert res["data"]["impressions"]["test"] == res["models"]["hstu"]["test"]["click"]["count"]
    assert os.path.getsize(out / "training.png") > 1000
    printed = capsys.readouterr().out
    assert "ranking, time split (AUC / GAUC / NE per task)" in printed and "dlrm" in printed


def test_bad_ranking_input_is_one_line(tmp_path, table, capsys):
    assert cli(tmp_path, "--data", table, "--out", str(tmp_path / "a")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: bad config: data.action_cols: ranking needs label columns "
                   "(--label-cols, 0/1 columns of the table)"]
    assert cli(tmp_path, "--data", table, "--label-cols", "like", "--out",
               str(tmp_path / "b")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: bad data: ") and "'like'" in err[0]
    assert cli(tmp_path, "--data", table, "--label-cols", "click", "--out", str(tmp_path / "c"),
               "--set", 'ranking.tasks=["buy"]') == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: bad config: ranking.tasks: ['buy'] are not tasks of the data (its "
                   "tasks: ['click'])"]
    assert cli(tmp_path, "--data", table, "--label-cols", "click", "--out", str(tmp_path / "d"),
               "--models", "hstu,sasrec") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: bad config: models[1]: 'sasrec' is not one of ['hstu', 'dlrm']"]
    assert cli(tmp_path, "--data", table, "--label-cols", "click", "--out", str(tmp_path / "e"),
               "--set", "ranking.test_days=400") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "calendar day(s); the time split needs at least 402" in err[0]
    for p in "abcde":
        assert not (tmp_path / p).exists()
