"""``python -m torchrec_ascend.training`` on a generated events table: HSTU beats most-popular,
the same rows as Parquet give identical metrics, bad data is one line with exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("torchrec")

from torchrec_ascend.datasets import generate_events_table  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO)
SETS = ["model.embedding_dim=30", "model.max_seq_len=32", "model.num_heads=1",
        "train.num_negatives=64", "train.batch_size=16", "train.threads=1",
        "train.peak_gemm_size=256", "train.log_every=20"]


def sets(tmp_path):
    out = []
    for s in SETS + [f"data.cache_dir={tmp_path / 'cache'}"]:
        out += ["--set", s]
    return out


def test_csv_beats_most_popular_and_parquet_gives_identical_metrics(tmp_path):
    csv = generate_events_table(str(tmp_path / "events.csv"), 300, 400, seed=0)
    pq = generate_events_table(str(tmp_path / "events.parquet"), 300, 400, seed=0,
                               format="parquet")
    from torchrec_ascend.training.cli import main

    results = []
    threads = torch.get_num_threads()
    try:
        for path, name in ((csv, "csv"), (pq, "pq")):  # in process: the same code as the CLI
            out = tmp_path / name
            assert main(["--no-progress", "--data", path, "--out", str(out), "--steps", "40"]
                        + sets(tmp_path)) == 0
            results.append(json.load(open(out / "results.json")))
    finally:
        torch.set_num_threads(threads)
    a, b = results
    hstu, pop = a["models"]["hstu"], a["baselines"]["most_popular"]
    for split in ("valid", "test"):
        for k in ("hr@10", "ndcg@10", "mrr"):
            assert hstu[split][k] > pop[split][k], (split, k, hstu[split][k], pop[split][k])
        assert b["models"]["hstu"][split] == hstu[split]
        assert b["baselines"]["most_popular"][split] == pop[split]


def test_leave_one_out_trains_on_the_validation_item_and_reports_test_only(tmp_path, capsys):
    csv = generate_events_table(str(tmp_path / "events.csv"), 120, 200, seed=1)
    from torchrec_ascend.training.cli import main

    threads = torch.get_num_threads()
    runs = {}
    try:
        for holdout in ("leave_two_out", "leave_one_out"):
            out = tmp_path / holdout
            assert main(["--no-progress", "--data", csv, "--out", str(out), "--steps", "10",
                         "--set", f"eval.holdout={holdout}"] + sets(tmp_path)) == 0
            runs[holdout] = json.load(open(out / "results.json"))
        printed = capsys.readouterr().out
        # periodic validation has nothing to watch: refused, naming the key and the rule
        code = main(["--no-progress", "--data", csv, "--out", str(tmp_path / "bad"),
                     "--steps", "10", "--set", "eval.holdout=leave_one_out",
                     "--set", "train.eval_every=5"] + sets(tmp_path))
    finally:
        torch.set_num_threads(threads)
    two, one = runs["leave_two_out"], runs["leave_one_out"]
    users = two["data"]["users"]
    assert one["data"]["users"] == users
    assert one["data"]["train_events"] == two["data"]["train_events"] + users  # + valid items
    for r in (one["models"]["hstu"], one["baselines"]["most_popular"]):
        assert r["valid"] is None and 0 < r["test"]["mrr"] <= 1
    assert two["models"]["hstu"]["valid"] is not None
    assert "leave-one-out, full corpus" in printed
    assert code == 2
    err = capsys.readouterr().err
    assert "eval.holdout: 'leave_one_out' has no validation split: train.eval_every" in err


def test_bad_row_is_one_line_exit_2(tmp_path, capsys):
    from torchrec_ascend.training.cli import main

    bad = tmp_path / "bad.csv"
    bad.write_text("user_id,item_id,timestamp\n1,5,100\n1,6,200\n1,7.5,300\n")
    code = main(["--no-progress", "--data", str(bad), "--out", str(tmp_path / "out"),
                 "--epochs", "1"] + sets(tmp_path))
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: bad data: "), lines
    assert str(bad) in lines[0] and "row 3" in lines[0] and "'item_id'" in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_two_ranks_bad_data_exit_2_on_every_rank(tmp_path):
    """Two ranks started as torchrun starts them (its environment variables), each its own
    process: both must exit with status 2 by themselves, one error line in all.  (Under torchrun
    itself the agent stops the other rank as soon as the first one exits, so which rank's own
    status it reports is a race: the launcher is not what is tested here.)"""
    from torchrec_ascend.testing.multiprocess import free_port

    bad = tmp_path / "bad.csv"
    bad.write_text("user_id,item_id,timestamp\n1,5,100\n1,6\n")
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = dict(ENV, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torchrec_ascend.training", "--no-progress", "--data", str(bad),
             "--out", str(tmp_path / "bad")] + sets(tmp_path),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO))
    outs = [p.communicate(timeout=300) for p in procs]
    stderr = "".join(err for _, err in outs)
    assert [p.returncode for p in procs] == [2, 2], stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error: bad data: ")]
    assert len(errors) == 1 and "row 2" in errors[0], stderr[-3000:]
