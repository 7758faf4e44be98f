"""examples/kuairand/train.py as a user runs it (subprocesses, a tiny synthetic config):
outputs, exact resume after kill -9, bad data and bad config (one line, exit 2, the last
checkpoint untouched).  The library behind it is tested under tests/training/."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torchrec")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(REPO, "examples", "kuairand", "train.py")
METRICS = {"hr@10", "hr@50", "hr@200", "ndcg@10", "ndcg@50", "ndcg@200", "mrr"}

TINY = {
    "data": {"source": "synthetic",
             "synthetic": {"num_users": 120, "num_items": 200, "num_clusters": 8, "mean_len": 10,
                           "max_len": 40, "random_log_rows": 20, "seed": 1},
             "positive": {"any_of": ["click"]}, "min_len": 3},
    "model": {"embedding_dim": 14, "num_layers": 1, "num_heads": 1, "attention_dim": 8,
              "linear_dim": 8, "max_seq_len": 16, "dropout": 0.1, "sasrec_ffn_dim": 32,
              "sasrec_heads": 2},
    "train": {"batch_size": 8, "steps": 8, "num_negatives": 32, "log_every": 4,
              "eval_every": 4, "checkpoint_every": 2, "keep_checkpoints": 2, "seed": 0,
              "threads": 1, "peak_gemm_size": 256},
    "eval": {"batch_size": 64, "eval_users": 40},
    "models": ["hstu"],
}
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def write_config(tmp_path, name="tiny.json", **train):
    cfg = json.loads(json.dumps(TINY))
    cfg["data"]["cache_dir"] = str(tmp_path / "cache")
    cfg["train"].update(train)
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return str(p)


def run(args, timeout=300):
    return subprocess.run([sys.executable, TRAIN, "--no-progress"] + args, capture_output=True,
                          text=True, timeout=timeout, env=ENV, cwd=REPO)


def losses(out, kind="hstu"):
    """step -> loss from log.jsonl (a step logged before a kill and after the resume keeps
    its last value)."""
    rows = [json.loads(line) for line in open(os.path.join(out, kind, "log.jsonl"))]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def _latest(ck):
    try:
        return open(os.path.join(ck, "LATEST")).read().strip()
    except OSError:
        return ""


def kill9_after_step_4(cfg, out, ck, steps=100000):
    """Start a run of ``cfg`` (``steps``: long by default) into ``out`` and SIGKILL it once
    ``ck`` (a checkpoints folder) holds the step-4 checkpoint."""
    p = subprocess.Popen([sys.executable, TRAIN, "--no-progress", "--config", cfg, "--out", out,
                          "--steps", str(steps)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV, cwd=REPO)
    deadline = time.time() + 200
    try:
        while _latest(ck) < "step_00000004":
            assert p.poll() is None, "training exited before the step-4 checkpoint"
            assert time.time() < deadline, "no step-4 checkpoint in time"
            time.sleep(0.02)
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    assert p.returncode == -signal.SIGKILL


def tree_digest(path):
    h = hashlib.sha256()
    for root, _, files in sorted(os.walk(path)):
        for f in sorted(files):
            h.update(f.encode())
            h.update(open(os.path.join(root, f), "rb").read())
    return h.hexdigest()


def test_end_to_end_outputs(tmp_path):
    cfg = write_config(tmp_path)
    out = str(tmp_path / "out")
    r = run(["--config", cfg, "--out", out, "--models", "hstu,sasrec"])
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(os.path.join(out, "results.json")))
    for name in ("hstu", "sasrec"):
        m = res["models"][name]
        for split in ("valid", "test"):
            met = m[split]
            assert set(met) == METRICS
            assert 0 <= met["ndcg@10"] <= met["hr@10"] <= met["hr@50"] <= met["hr@200"] <= 1
            assert 0 < met["mrr"] <= 1
        assert m["tokens_per_s"] > 0 and 0 < m["mfu"] < 1
        # one periodic validation at step 4 (eval_every), the final one at step 8
        assert [e["step"] for e in m["evals"]] == [4, 8]
    for split in ("valid", "test"):
        assert set(res["baselines"]["most_popular"][split]) == METRICS
    assert os.path.getsize(res["plot"]) > 1000
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(os.path.join(out, "tb", "hstu")))
    for word in ("plot: ", "most_popular", "sasrec", "MFU", "tokens/s", "leave-two-out"):
        assert word in r.stdout, word
    # the console is clean: no warning from TorchRec, DDP or our code
    for word in ("Warning", "TopologyFactory", "broadcast_buffers"):
        assert word not in r.stderr, r.stderr
    ck = os.path.join(out, "hstu", "checkpoints")
    assert open(os.path.join(ck, "LATEST")).read().strip() == "step_00000008"
    assert sorted(d for d in os.listdir(ck) if d.startswith("step_")) == ["step_00000006", "step_00000008"]


def test_bad_config_exits_2_and_writes_nothing(tmp_path):
    cfg = write_config(tmp_path)
    out = tmp_path / "out"
    (out / "hstu" / "checkpoints").mkdir(parents=True)
    (out / "hstu" / "checkpoints" / "LATEST").write_text("step_00000002\n")
    before = tree_digest(str(out))
    r = run(["--config", cfg, "--out", str(out), "--set", "model.embedding_dim=0"])
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stderr.strip() == "error: bad config: model.embedding_dim: 0 is not an integer >= 1"
    assert tree_digest(str(out)) == before


@pytest.mark.slow
def test_kill9_resume_equals_uninterrupted_and_bad_run_keeps_checkpoint(tmp_path):
    """SIGKILL a run after its step-4 checkpoint; a later run that fails on bad data (with a
    half-written save lying around) leaves the last checkpoint byte-identical; ``--resume``
    then continues with the same data order: every step's loss and the final metrics equal an
    uninterrupted run of the same length (bit for bit: same operations in the same order)."""
    cfg = write_config(tmp_path, eval_every=0)
    b = str(tmp_path / "b")
    ck = os.path.join(b, "hstu", "checkpoints")
    kill9_after_step_4(cfg, b, ck)
    latest = open(os.path.join(ck, "LATEST")).read().strip()
    killed_at = int(latest.split("_")[1])
    assert killed_at >= 4
    good = tree_digest(os.path.join(ck, latest))

    partial = os.path.join(ck, f"step_{killed_at + 2:08d}.tmp-save")
    os.makedirs(partial, exist_ok=True)
    open(os.path.join(partial, "__0_0.distcp"), "w").write("partial")
    bad_csv = tmp_path / "log_standard_bad.csv"
    from torchrec_ascend.datasets.schema import LOG_COLUMNS

    rows = [",".join(LOG_COLUMNS)] + [
        ",".join(str(v) for v in [1, 10 + i, 20220408, 900, 1000 + i, 1] + [0] * 13)
        for i in range(5)]
    rows[3] = rows[3].replace(",12,", ",v12,", 1)  # data row 3: video_id
    bad_csv.write_text("\n".join(rows) + "\n")
    bad = json.load(open(cfg))
    bad["data"] = {"source": "kuairand", "files": [str(bad_csv)], "cache_dir": str(tmp_path / "cache")}
    badp = tmp_path / "bad.json"
    badp.write_text(json.dumps(bad))
    # resuming with other data is refused before anything is read, naming the keys
    r = run(["--config", str(badp), "--out", b, "--resume"])
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stderr.startswith("error: bad config: --resume: ") and "data.source" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    # bad data is one line naming file, row and column
    r = run(["--config", str(badp), "--out", str(tmp_path / "bad-out")])
    assert r.returncode == 2, r.stderr[-3000:]
    assert str(bad_csv) in r.stderr and "row 3" in r.stderr and "'video_id'" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert open(os.path.join(ck, "LATEST")).read().strip() == latest
    assert tree_digest(os.path.join(ck, latest)) == good

    total = killed_at + 3
    r = run(["--config", cfg, "--out", b, "--resume", "--steps", str(total)])
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from {os.path.join(ck, latest)} at step {killed_at}" in r.stdout
    assert not os.path.exists(partial)  # the resumed run's save at killed_at + 2 replaced it

    a = str(tmp_path / "a")
    r = run(["--config", cfg, "--out", a, "--steps", str(total)])
    assert r.returncode == 0, r.stderr[-3000:]
    logged = [json.loads(line)["step"] for line in open(os.path.join(b, "hstu", "log.jsonl"))
              if '"loss"' in line]
    assert logged == list(range(1, total + 1))  # the replayed steps are logged once
    want, got = losses(a), losses(b)
    assert sorted(want) == list(range(1, total + 1)) and sorted(got) == sorted(want)
    for s in want:
        assert got[s] == want[s], s
    ma = json.load(open(os.path.join(a, "results.json")))["models"]["hstu"]
    mb = json.load(open(os.path.join(b, "results.json")))["models"]["hstu"]
    assert mb["valid"] == ma["valid"] and mb["test"] == ma["test"]


RANKING_TINY = {
    "task": "ranking",
    "models": ["hstu", "dlrm"],
    "data": {"source": "synthetic",
             "synthetic": {"num_users": 150, "num_items": 200, "num_clusters": 8, "mean_len": 10,
                           "max_len": 40, "random_log_rows": 20, "seed": 1}},
    "model": {"embedding_dim": 12, "num_layers": 1, "num_heads": 1, "attention_dim": 8,
              "linear_dim": 8, "max_seq_len": 24, "dropout": 0.1},
    "train": {"batch_size": 8, "steps": 8, "log_every": 2, "eval_every": 0,
              "checkpoint_every": 2, "keep_checkpoints": 2, "seed": 0, "threads": 1,
              "peak_gemm_size": 64},
    "eval": {"batch_size": 64},
    "ranking": {"max_candidates": 2, "head_dims": [16], "dlrm_dense_dims": [8],
                "dlrm_over_dims": [16]},
}


@pytest.mark.slow
def test_ranking_kill9_resume_equals_uninterrupted(tmp_path):
    """The ranking task (the HSTU ranker, then DLRM): SIGKILL the run after the ranker's step-4
    checkpoint, ``--resume``: every logged loss and every final metric of both models equals an
    uninterrupted run of the same length."""
    cfg = json.loads(json.dumps(RANKING_TINY))
    cfg["data"]["cache_dir"] = str(tmp_path / "cache")
    path = tmp_path / "rank.json"
    path.write_text(json.dumps(cfg))
    b = str(tmp_path / "b")
    ck = os.path.join(b, "hstu", "checkpoints")
    kill9_after_step_4(str(path), b, ck)
    latest = _latest(ck)
    killed_at = int(latest.split("_")[1])
    total = killed_at + 3
    r = run(["--config", str(path), "--out", b, "--resume", "--steps", str(total)])
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"[hstu] resumed from {os.path.join(ck, latest)} at step {killed_at}" in r.stdout
    a = str(tmp_path / "a")
    r = run(["--config", str(path), "--out", a, "--steps", str(total)])
    assert r.returncode == 0, r.stderr[-3000:]
    ra = json.load(open(os.path.join(a, "results.json")))
    rb = json.load(open(os.path.join(b, "results.json")))
    for kind in ("hstu", "dlrm"):
        want, got = losses(a, kind), losses(b, kind)
        assert sorted(want) == list(range(1, total + 1)) and sorted(got) == sorted(want), kind
        for s in want:
            assert got[s] == want[s], (kind, s)
        assert rb["models"][kind]["valid"] == ra["models"][kind]["valid"]
        assert rb["models"][kind]["test"] == ra["models"][kind]["test"]


@pytest.mark.slow
def test_ranking_refit_kill9_resume_equals_uninterrupted(tmp_path):
    """ranking.refit: SIGKILL the run inside the ranker's refit (after its step-4 checkpoint),
    ``--resume``: the refit's logged losses and the final metrics equal an uninterrupted run."""
    cfg = json.loads(json.dumps(RANKING_TINY))
    cfg["models"] = ["hstu"]
    cfg["data"]["cache_dir"] = str(tmp_path / "cache")
    cfg["ranking"]["refit"] = True
    cfg["train"]["steps"] = 6
    path = tmp_path / "rank.json"
    path.write_text(json.dumps(cfg))
    b = str(tmp_path / "b")
    ck = os.path.join(b, "hstu", "refit", "checkpoints")
    kill9_after_step_4(str(path), b, ck, steps=6)
    latest = _latest(ck)
    r = run(["--config", str(path), "--out", b, "--resume"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"[hstu/refit] resumed from {os.path.join(ck, latest)}" in r.stdout
    a = str(tmp_path / "a")
    r = run(["--config", str(path), "--out", a])
    assert r.returncode == 0, r.stderr[-3000:]
    ra = json.load(open(os.path.join(a, "results.json")))["models"]["hstu"]
    rb = json.load(open(os.path.join(b, "results.json")))["models"]["hstu"]
    want, got = losses(a, "hstu/refit"), losses(b, "hstu/refit")
    assert sorted(want) == list(range(1, ra["refit"]["steps"] + 1)) and ra["refit"]["steps"] > 6
    assert sorted(got) == sorted(want) and all(got[s] == want[s] for s in want)
    assert rb["valid"] == ra["valid"] and rb["test"] == ra["test"] and rb["refit"] == ra["refit"]
