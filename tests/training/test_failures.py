"""What a user sees when things go wrong (docs/training.md, "What happens when things go wrong"):
duplicated rows, a folder that holds a run, resumes, damaged checkpoints, diverging training,
bad paths -- each one line on stderr and exit status 2, nothing lost.  In process, through the
CLI's ``main`` (the code path of ``python -m torchrec_ascend.training``)."""

from __future__ import annotations

import json
import os
import shutil
import warnings

import pytest

pytest.importorskip("torchrec")

from torchrec_ascend.datasets import generate_events_table  # noqa: E402
from torchrec_ascend.training import checkpoint as ck  # noqa: E402
from torchrec_ascend.training.cli import main  # noqa: E402

SETS = ["model.embedding_dim=12", "model.max_seq_len=16", "model.num_heads=1",
        "model.attention_dim=8", "model.linear_dim=8", "train.num_negatives=32",
        "train.batch_size=16", "train.threads=1", "train.peak_gemm_size=64",
        "train.log_every=2", "eval.batch_size=64"]


@pytest.fixture(scope="module")
def events(tmp_path_factory):
    d = tmp_path_factory.mktemp("events")
    return generate_events_table(str(d / "events.csv"), 120, 150, seed=3)


def cli(tmp_path, data, out, *extra, steps=4):
    args = ["--no-progress", "--data", *([data] if isinstance(data, str) else data),
            "--out", str(out), "--steps", str(steps)]
    for s in SETS + [f"data.cache_dir={tmp_path / 'cache'}"]:
        args += ["--set", s]
    return main(args + list(extra))


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in "\n".join(err), err
    return errors[0]


# ----------------------------------------------------------------------------- duplicates
def test_every_row_twice_gives_the_metrics_of_once(tmp_path, events, capsys):
    rows = open(events).read().splitlines()
    twice = tmp_path / "twice.csv"
    twice.write_text("\n".join([rows[0]] + [r for r in rows[1:] for _ in range(2)]) + "\n")
    assert cli(tmp_path, events, tmp_path / "once") == 0
    assert cli(tmp_path, str(twice), tmp_path / "twice") == 0
    printed = capsys.readouterr().out
    once = json.load(open(tmp_path / "once" / "results.json"))
    dup = json.load(open(tmp_path / "twice" / "results.json"))
    assert dup["data"]["duplicates_dropped"] == len(rows) - 1
    assert once["data"]["duplicates_dropped"] == 0
    assert f"{len(rows) - 1:,} exact duplicate rows (user, item, time) dropped" in printed
    for split in ("valid", "test"):
        assert dup["models"]["hstu"][split] == once["models"]["hstu"][split]
        assert dup["baselines"]["most_popular"][split] == once["baselines"]["most_popular"][split]


# ----------------------------------------------------------------------------- run folders
def test_a_folder_holding_a_run_is_refused_unless_resumed_or_overwritten(tmp_path, events,
                                                                         capsys):
    out = tmp_path / "run"
    assert cli(tmp_path, events, out, "--set", "train.checkpoint_every=2") == 0
    first = open(out / "results.json").read()
    capsys.readouterr()
    assert cli(tmp_path, events, out) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: bad config: --out: {str(out)!r} holds a run") and \
        "--resume" in line and "--overwrite" in line
    assert open(out / "results.json").read() == first  # untouched
    # the resume refuses a change of the model, naming the keys
    assert cli(tmp_path, events, out, "--resume", "--set", "model.embedding_dim=16",
               steps=6) == 2
    line = one_error_line(capsys)
    assert "--resume" in line and "model.embedding_dim: 12 -> 16" in line, line
    # a longer run continues it
    assert cli(tmp_path, events, out, "--resume", steps=6) == 0
    assert "resumed from" in capsys.readouterr().out
    rows = [json.loads(x) for x in open(out / "hstu" / "log.jsonl")]
    steps = [r["step"] for r in rows if "loss" in r]
    assert steps == list(range(1, 7))  # every step once
    # --overwrite replaces it: the old run's files are gone, not mixed in
    assert cli(tmp_path, events, out, "--overwrite", steps=2) == 0
    rows = [json.loads(x) for x in open(out / "hstu" / "log.jsonl")]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]
    assert not os.path.exists(out / "hstu" / "checkpoints")
    assert len(json.load(open(out / "run.json"))["resumed"]) == 0


def test_resume_without_a_checkpoint_says_so(tmp_path, events, capsys):
    assert cli(tmp_path, events, tmp_path / "empty", "--resume") == 2
    assert "holds no checkpoint to continue from" in one_error_line(capsys)
    assert not os.path.exists(tmp_path / "empty")


def test_damaged_latest_checkpoint_resumes_from_the_previous_good_one(tmp_path, events, capsys):
    out = tmp_path / "run"
    assert cli(tmp_path, events, out, "--set", "train.checkpoint_every=2",
               "--set", "train.keep_checkpoints=3", steps=4) == 0
    root = out / "hstu" / "checkpoints"
    latest = root / "step_00000004"
    with open(latest / ck.TRAINER_FILE, "r+b") as f:
        f.truncate(10)
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli(tmp_path, events, out, "--resume", steps=6) == 0
    assert f"resumed from {root / 'step_00000002'} at step 2" in capsys.readouterr().out
    damaged = [str(w.message) for w in caught if issubclass(w.category, ck.CheckpointWarning)]
    assert damaged and str(latest) in damaged[0] and "step_00000002" in damaged[0]


# ----------------------------------------------------------------------------- divergence
def test_infinite_lr_is_a_config_error(tmp_path, events, capsys):
    assert cli(tmp_path, events, tmp_path / "o", "--set", "train.lr=Infinity") == 2
    assert one_error_line(capsys) == "error: bad config: train.lr: inf is not a finite number"


def test_non_finite_loss_stops_before_checkpointing(tmp_path, events, capsys, monkeypatch):
    """The loss turns NaN at step 3 (the model's forward is made to return it): training stops
    there with one line naming the step; the step-2 checkpoint stays the newest."""
    from torchrec_ascend.models import GenerativeRetrieval

    real = GenerativeRetrieval.forward
    calls = {"n": 0}

    def nan_at_step_3(self, batch):
        loss, (value, stats) = real(self, batch)
        calls["n"] += 1
        if calls["n"] >= 3:
            loss = loss * float("nan")
            value = loss.detach()
        return loss, (value, stats)

    monkeypatch.setattr(GenerativeRetrieval, "forward", nan_at_step_3)
    out = tmp_path / "run"
    assert cli(tmp_path, events, out, "--set", "train.checkpoint_every=1",
               "--set", "train.pipeline=sync", steps=6) == 2
    line = one_error_line(capsys)
    assert line.startswith("error: training diverged at step 3: the "), line
    root = out / "hstu" / "checkpoints"
    assert sorted(os.listdir(root)) == ["LATEST", "step_00000001", "step_00000002"]
    assert ck.find_checkpoint(str(out / "hstu")).endswith("step_00000002")


# ----------------------------------------------------------------------------- bad paths
def test_bad_paths_are_one_line_before_any_work(tmp_path, events, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert cli(tmp_path, events, afile / "out") == 2
    assert "--out: " in (line := one_error_line(capsys)) and "is under a file" in line
    assert cli(tmp_path, events, tmp_path / "o", "--set", f"data.cache_dir={afile}") == 2
    assert "data.cache_dir: " in one_error_line(capsys)
    assert cli(tmp_path, str(tmp_path), tmp_path / "o2") == 2
    line = one_error_line(capsys)
    assert line.startswith("error: bad config: --data: ") and "is a folder" in line
    assert cli(tmp_path, events, tmp_path / "o3", "--set", "data.min_len=1000") == 2
    line = one_error_line(capsys)
    assert line.startswith("error: bad data: ") and "no user has enough positive events" in line
    for p in ("o", "o2", "o3"):
        assert not os.path.exists(tmp_path / p)


def _read_only_mount():
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 3 and "ro" in parts[3].split(",") and os.path.isdir(parts[1]):
                    return parts[1]
    except OSError:
        pass
    return None


@pytest.mark.skipif(_read_only_mount() is None, reason="no read-only file system mounted here")
def test_read_only_file_system_is_one_line(tmp_path, events, capsys):
    ro = _read_only_mount()
    assert cli(tmp_path, events, os.path.join(ro, "out")) == 2
    line = one_error_line(capsys)
    assert line.startswith("error: bad config: --out: cannot write into") and "Read-only" in line


def test_console_has_no_dependency_notice(tmp_path, events):
    """A fresh process (torch logs the notice once per process): stderr holds the progress bar
    and nothing a user cannot act on."""
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = [sys.executable, "-m", "torchrec_ascend.training", "--data", events,
            "--out", str(tmp_path / "o"), "--steps", "3"]
    for s in SETS + [f"data.cache_dir={tmp_path / 'cache'}"]:
        args += ["--set", s]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=repo)
    r = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env, cwd=repo)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "is_fx_tracing" not in r.stderr + r.stdout
    assert "Warning" not in r.stderr, r.stderr


def test_a_lost_peer_in_any_collective_is_one_line(capsys):
    """A collective outside the training step (throughput all-reduce, evaluation, checkpoint)
    failing because a peer died is the same one line, exit 2; any other error still raises."""
    import argparse

    from torchrec_ascend.training.cli import run_cli

    args = argparse.Namespace(resume=False, no_progress=True, overwrite=False)

    def lost():
        raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:63135: "
                           "Connection reset by peer. This is typically caused by a remote "
                           "worker hanging.")

    assert run_cli(lost, lambda cfg: "unused", args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "error: rank 0: a collective failed, a peer rank died or left (RuntimeError: [gloo")

    def bug():
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        run_cli(bug, lambda cfg: "unused", args)
