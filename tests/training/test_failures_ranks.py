"""Two ranks, as torchrun starts them (environment variables, one process each): a rank that
stalls (SIGSTOP) ends the job within the default ``train.step_timeout_s="auto"``; a rank that
dies leaves the other one line and exit status 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torchrec")

from torchrec_ascend.datasets import generate_events_table  # noqa: E402
from torchrec_ascend.distributed.train_pipeline.faults import (AUTO_MIN_S,  # noqa: E402
                                                               WATCHDOG_EXIT_CODE)
from torchrec_ascend.testing.multiprocess import free_port  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETS = ["model.embedding_dim=12", "model.max_seq_len=16", "model.num_heads=1",
        "model.attention_dim=8", "model.linear_dim=8", "train.num_negatives=32",
        "train.batch_size=8", "train.threads=1", "train.peak_gemm_size=64", "train.log_every=1"]


def _start(tmp_path, data, entry=("-m", "torchrec_ascend.training"), steps=100000, sets=()):
    """Two ranks of ``python <entry> ...`` training on ``data`` (the CLI's arguments)."""
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO, RANK=str(rank),
                   LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        args = [sys.executable, *entry, "--no-progress", "--data", data,
                "--out", str(tmp_path / "out"), "--steps", str(steps)]
        for s in SETS + list(sets) + [f"data.cache_dir={tmp_path / 'cache'}"]:
            args += ["--set", s]
        procs.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env, cwd=REPO))
    return procs


def _rank0_stderr(procs, timeout: float, first=lambda: None) -> str:
    """``first()``, then rank 0's stderr once it ends (within ``timeout``); every rank is killed
    afterwards, also when either raises."""
    try:
        first()
        _, err = procs[0].communicate(timeout=timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    return err


def _wait_for_steps(tmp_path, procs, steps: int, timeout: float = 240.0) -> None:
    log = tmp_path / "out" / "hstu" / "log.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        if log.exists():
            rows = [json.loads(x) for x in log.read_text().splitlines() if x.endswith("}")]
            if sum(1 for r in rows if "loss" in r) >= steps:
                return
        time.sleep(0.2)
    raise AssertionError("training did not reach the steps in time")


@pytest.fixture
def data(tmp_path):
    return generate_events_table(str(tmp_path / "events.csv"), 200, 150, seed=4)


@pytest.mark.slow
def test_a_stalled_rank_ends_the_job_within_the_default_timeout(tmp_path, data):
    procs = _start(tmp_path, data)
    stopped = []

    def stop_rank1() -> None:
        _wait_for_steps(tmp_path, procs, 8)
        os.kill(procs[1].pid, signal.SIGSTOP)
        stopped.append(time.monotonic())

    err = _rank0_stderr(procs, AUTO_MIN_S + 90, stop_rank1)
    waited = time.monotonic() - stopped[0]
    assert procs[0].returncode == WATCHDOG_EXIT_CODE, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "rank 0" in errors[0], err[-2000:]
    assert "did not finish within step_timeout_s=auto" in errors[0]
    assert "Traceback" not in err
    assert AUTO_MIN_S - 1 < waited < AUTO_MIN_S + 60, waited


@pytest.mark.slow
def test_a_dead_rank_is_one_line_on_the_other(tmp_path, data):
    procs = _start(tmp_path, data)

    def kill_rank1() -> None:
        _wait_for_steps(tmp_path, procs, 4)
        procs[1].kill()

    err = _rank0_stderr(procs, AUTO_MIN_S + 90, kill_rank1)
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "rank 0" in errors[0], err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    # gloo notices the closed connection (PeerFailureError, exit 2), or the watchdog ends it
    if procs[0].returncode == 2:
        assert "a peer rank died or left" in errors[0]
    else:
        assert procs[0].returncode == WATCHDOG_EXIT_CODE, err[-2000:]


# A rank that stalls in a collective phase other than the step's own pipeline: rank 1 sleeps at
# the start of the phase (its third throughput report, its first periodic evaluation, its first
# checkpoint); rank 0, waiting in the same phase's collectives, must end with the watchdog's
# line naming that phase -- never hang.  The phases other than steps get the larger of
# AUTO_FIRST_S and the step limit: both are made small here.
_STALL = """
import os, sys, time
from torchrec_ascend.distributed.train_pipeline import faults
faults.AUTO_FIRST_S = {limit}
from torchrec_ascend.training import cli, trainer
if os.environ["RANK"] == "1":
    original = getattr(trainer.Trainer, "{method}")
    calls = [0]
    def stalled(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == {at_call}:
            time.sleep(600)
        return original(self, *args, **kwargs)
    setattr(trainer.Trainer, "{method}", stalled)
sys.exit(cli.main(sys.argv[1:]))
"""
_PHASE_LIMIT_S = 6.0


@pytest.mark.slow
@pytest.mark.parametrize("method,at_call,sets,phase", [
    ("_log_perf", 3, [], "step 3 did not finish within step_timeout_s=6.0 s"),
    ("evaluate", 1, ["train.eval_every=4"], "evaluation on valid did not finish within"),
    ("_save", 1, ["train.checkpoint_every=4"], "checkpoint of step 4 did not finish within"),
])
def test_a_rank_stalled_outside_the_pipeline_step_ends_the_job(tmp_path, data, method, at_call,
                                                               sets, phase):
    script = tmp_path / "stall.py"
    script.write_text(_STALL.format(limit=_PHASE_LIMIT_S, method=method, at_call=at_call))
    procs = _start(tmp_path, data, entry=(str(script),), steps=40,
                   sets=sets + [f"train.step_timeout_s={_PHASE_LIMIT_S}"])
    err = _rank0_stderr(procs, 240)
    assert procs[0].returncode == WATCHDOG_EXIT_CODE, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: rank 0: "), err[-2000:]
    assert phase in errors[0], errors[0]
    assert "Traceback" not in err
