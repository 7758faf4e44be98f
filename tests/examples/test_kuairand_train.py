"""End-to-end tests of examples/kuairand/train.py on a tiny synthetic config (subprocesses)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(REPO, "examples", "kuairand", "train.py")

TINY = {
    "name": "tiny",
    "data": {"source": "synthetic",
             "synthetic": {"num_users": 120, "num_items": 200, "num_clusters": 8, "mean_len": 10,
                           "max_len": 40, "random_log_rows": 20, "seed": 1},
             "positive": {"any_of": ["click"]}, "min_len": 3},
    "model": {"embedding_dim": 16, "num_layers": 1, "num_heads": 1, "attention_dim": 8,
              "linear_dim": 8, "max_seq_len": 16, "dropout": 0.1, "sasrec_ffn_dim": 32},
    "train": {"batch_size": 8, "steps": 8, "lr": 0.001, "sparse_lr": 0.05, "num_negatives": 32,
              "log_every": 4, "eval_every": 4, "checkpoint_every": 2, "keep_checkpoints": 2,
              "seed": 0},
    "eval": {"batch_size": 64, "eval_users": 40},
    "models": ["hstu"],
}


def write_config(tmp_path, **train):
    cfg = json.loads(json.dumps(TINY))
    cfg["data"]["cache_dir"] = str(tmp_path / "cache")
    cfg["train"].update(train)
    p = tmp_path / "tiny.json"
    p.write_text(json.dumps(cfg))
    return str(p)


def run(args, env_extra=None, timeout=240):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env.update(env_extra or {})
    return subprocess.run([sys.executable, TRAIN, "--no-progress"] + args, capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=REPO)


def losses(out, kind="hstu"):
    rows = [json.loads(l) for l in open(os.path.join(out, kind, "log.jsonl"))]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def test_end_to_end_outputs(tmp_path):
    cfg = write_config(tmp_path)
    out = str(tmp_path / "out")
    r = run(["--config", cfg, "--out", out, "--models", "hstu,sasrec"])
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(os.path.join(out, "results.json")))
    for name in ("hstu", "sasrec"):
        met = res["models"][name]["metrics"]
        assert set(met) == {"hr@10", "hr@50", "hr@200", "ndcg@10", "ndcg@50", "ndcg@200", "mrr"}
        assert 0 <= met["ndcg@10"] <= met["hr@10"] <= met["hr@50"] <= met["hr@200"] <= 1
        assert res["models"][name]["tokens_per_s"] > 0 and 0 < res["models"][name]["mfu"] < 1
    assert "most_popular" in res["baselines"]
    assert os.path.getsize(res["plot"]) > 1000
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(os.path.join(out, "tb", "hstu")))
    assert "plot: " in r.stdout and "most_popular" in r.stdout and "MFU" in r.stdout
    ck = os.path.join(out, "hstu", "checkpoints")
    assert open(os.path.join(ck, "LATEST")).read().strip() == "step_00000008"
    assert sorted(d for d in os.listdir(ck) if d.startswith("step_")) == ["step_00000006", "step_00000008"]


@pytest.mark.slow
def test_kill9_resume_same_losses(tmp_path):
    """Uninterrupted 8 steps == killed (SIGKILL) after the step-4 checkpoint, then --resume."""
    cfg = write_config(tmp_path)
    a = str(tmp_path / "a")
    r = run(["--config", cfg, "--out", a, "--set", "train.eval_every=0"])
    assert r.returncode == 0, r.stderr[-3000:]
    want = losses(a)
    b = str(tmp_path / "b")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    p = subprocess.Popen([sys.executable, TRAIN, "--no-progress", "--config", cfg, "--out", b,
                          "--steps", "100000", "--set", "train.eval_every=0"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=REPO)
    ck = os.path.join(b, "hstu", "checkpoints")
    deadline = time.time() + 200
    try:
        while not os.path.isdir(os.path.join(ck, "step_00000004")):
            assert p.poll() is None, "training exited before the step-4 checkpoint"
            assert time.time() < deadline, "no step-4 checkpoint in time"
            time.sleep(0.05)
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    done = sorted(d for d in os.listdir(ck) if d.startswith("step_") and ".tmp" not in d)
    assert done and done[-1] >= "step_00000004"
    killed_at = int(done[-1].split("_")[1])
    r = run(["--config", cfg, "--out", b, "--resume", "--steps", str(killed_at + 4),
             "--set", "train.eval_every=0"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from" in r.stdout
    got = losses(b)
    if killed_at + 4 <= 8:
        for s in range(killed_at + 1, killed_at + 5):
            assert got[s] == pytest.approx(want[s], rel=1e-5, abs=1e-6), s


def test_failed_run_keeps_last_checkpoint(tmp_path):
    """A half-written save (.tmp folder) and a crash on bad data leave LATEST and its files
    intact; --resume picks the last complete checkpoint."""
    cfg = write_config(tmp_path, steps=4)
    out = str(tmp_path / "out")
    assert run(["--config", cfg, "--out", out]).returncode == 0
    ck = os.path.join(out, "hstu", "checkpoints")
    before = {f: os.path.getsize(os.path.join(ck, "step_00000004", f))
              for f in os.listdir(os.path.join(ck, "step_00000004"))}
    os.makedirs(os.path.join(ck, "step_00000006.tmp-save"))  # a save killed midway
    open(os.path.join(ck, "step_00000006.tmp-save", "__0_0.distcp"), "w").write("partial")
    # a run that fails on bad data
    bad = json.load(open(cfg))
    bad["data"] = {"source": "files", "files": [str(tmp_path / "missing.csv")],
                   "cache_dir": str(tmp_path / "cache")}
    badp = tmp_path / "bad.json"
    badp.write_text(json.dumps(bad))
    r = run(["--config", str(badp), "--out", out, "--resume"])
    assert r.returncode != 0 and "missing.csv" in r.stderr and "does not exist" in r.stderr
    assert open(os.path.join(ck, "LATEST")).read().strip() == "step_00000004"
    after = {f: os.path.getsize(os.path.join(ck, "step_00000004", f))
             for f in os.listdir(os.path.join(ck, "step_00000004"))}
    assert before == after
    r = run(["--config", cfg, "--out", out, "--resume", "--steps", "6"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step_00000004 at step 4" in r.stdout


@pytest.mark.slow
def test_torchrun_two_ranks(tmp_path):
    cfg = write_config(tmp_path, steps=4, eval_every=0)
    out = str(tmp_path / "out")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                        "--master_port=29637", TRAIN, "--no-progress", "--config", cfg,
                        "--out", out], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(os.path.join(out, "results.json")))
    assert res["world_size"] == 2
    assert "on 2 rank(s)" in r.stdout
    assert 0 <= res["models"]["hstu"]["metrics"]["mrr"] <= 1
