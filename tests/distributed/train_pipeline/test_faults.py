"""Fault handling of the train pipelines (2 gloo ranks, the TorchRec workload).

* A rank that dies in the middle of a step (``os._exit`` inside the dense forward) makes the
  other rank leave within ``step_timeout_s``: either a :class:`PeerFailureError` naming the
  step (gloo noticed the closed sockets) or the watchdog's exit code and message.
* A rank that sleeps inside one step delays the other by about the sleep, not more (the ranks
  are coupled each step by the all-to-alls), and both finish: no deadlock.

Ranks are separate processes joined one by one (TorchRec's spawn helper would kill the
survivor as soon as one rank dies, which is what is under test here).
"""

from __future__ import annotations

import datetime
import json
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytest.importorskip("torchrec")

from torchrec_ascend.distributed.train_pipeline import (  # noqa: E402
    WATCHDOG_EXIT_CODE,
    PeerFailureError,
    make_train_pipeline,
)
from torchrec_ascend.testing import pipeline_workload as SW  # noqa: E402
from torchrec_ascend.testing import torchrec_workload as W  # noqa: E402
from torchrec_ascend.testing.multiprocess import free_port  # noqa: E402

STEPS = 6
FAULT_CALL = 3  # the dense forward call (batch index 2) where rank 1 dies or sleeps
SLEEP_S = 1.5
TIMEOUT_S = 8.0
DIED = 3


def _rank_main(rank: int, world: int, port: int, out_dir: str, mode: str, kind: str,
               staleness: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    err = open(os.path.join(out_dir, f"stderr{rank}.txt"), "w")
    os.dup2(err.fileno(), 2)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    results = []
    # mode "slow": a run without the fault first (the baseline), then the same run with it
    for fault_on in ((False, True) if mode == "slow" else (True,)):
        results.append(_train(rank, mode if fault_on else "none", kind, staleness))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    os._exit(0)  # a dead peer leaves the process group unusable: do not tear it down


def _train(rank: int, mode: str, kind: str, staleness: int) -> dict:
    model, opt = SW.build("ours", "row_wise", staleness, torch.device("cpu"))
    calls = [0]

    def fault(_module, _inputs):
        calls[0] += 1
        if rank == 1 and calls[0] == FAULT_CALL:
            if mode == "die":
                os._exit(DIED)
            if mode == "slow":
                time.sleep(SLEEP_S)

    model.module.over.register_forward_pre_hook(fault)
    pipe = make_train_pipeline(kind, model, opt, torch.device("cpu"), step_timeout_s=TIMEOUT_S)
    batches = iter([W.make_batch(rank, s) for s in range(STEPS)])
    result = {"error": None, "steps": 0}
    dist.barrier()
    start = time.perf_counter()
    try:
        while True:
            try:
                pipe.progress(batches)
            except StopIteration:
                break
            result["steps"] += 1
    except PeerFailureError as exc:
        result["error"] = str(exc)
    result["wall_s"] = time.perf_counter() - start
    pipe.close()
    return result


def _launch(tmp_path, mode: str, kind: str, staleness: int, wait_s: float) -> dict:
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_rank_main,
                         args=(r, 2, port, str(tmp_path), mode, kind, staleness))
             for r in range(2)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + wait_s
    try:
        for p in procs:
            p.join(max(deadline - time.monotonic(), 0.1))
    finally:
        hung = [p.pid for p in procs if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    out = {"hung": hung, "codes": [p.exitcode for p in procs]}
    for r in range(2):
        path = tmp_path / f"rank{r}.json"
        out[r] = json.loads(path.read_text()) if path.exists() else None
        out[f"stderr{r}"] = (tmp_path / f"stderr{r}.txt").read_text()
    return out


@pytest.mark.slow
def test_dead_rank_makes_the_other_exit_with_a_clear_error(tmp_path):
    # start-up (spawn, imports, planning) takes ~15 s on 2 loaded cores; the bound that
    # matters is the survivor's time from the first step to its error (< step_timeout_s)
    out = _launch(tmp_path, "die", "semi_async", 1, wait_s=60 + TIMEOUT_S)
    assert not out["hung"], out
    assert out["codes"][1] == DIED, out
    if out["codes"][0] == WATCHDOG_EXIT_CODE:  # gloo did not notice: the watchdog ended it
        assert "did not finish within step_timeout_s" in out["stderr0"], out["stderr0"]
        return
    assert out["codes"][0] == 0 and out[0] is not None, out
    (survivor,) = out[0]
    assert survivor["error"] is not None, survivor
    assert f"semi_async pipeline step {FAULT_CALL - 1}" in survivor["error"], survivor
    assert "a peer rank died or left" in survivor["error"], survivor
    assert survivor["steps"] == FAULT_CALL - 1 and survivor["wall_s"] < TIMEOUT_S, survivor


@pytest.mark.slow
def test_slow_rank_delays_the_other_by_at_most_its_sleep(tmp_path):
    out = _launch(tmp_path, "slow", "semi_async", 2, wait_s=90)
    assert not out["hung"] and out["codes"] == [0, 0], out
    for rank in (0, 1):
        for run in out[rank]:
            assert run["steps"] == STEPS and run["error"] is None, out
    base, slow = out[0]
    delay = slow["wall_s"] - base["wall_s"]
    # rank 0 waits for the sleeping rank at the next all-to-all (coupled each step) ...
    assert delay > 0.5 * SLEEP_S, (delay, base, slow)
    # ... but by no more than the sleep (+ scheduling noise of a loaded 2-core machine)
    assert delay < SLEEP_S + 1.0, (delay, base, slow)


@pytest.mark.slow
def test_watchdog_ends_a_hung_step_with_a_clear_error():
    import subprocess
    import sys

    code = ("import time\n"
            "from torchrec_ascend.distributed.train_pipeline.faults import StepWatchdog\n"
            "w = StepWatchdog(0.3)\n"
            "with w.watch('semi_async pipeline step 7'):\n"
            "    time.sleep(60)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))))] + [os.environ.get("PYTHONPATH", "")]))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == WATCHDOG_EXIT_CODE, proc.stderr
    assert "semi_async pipeline step 7 did not finish within step_timeout_s=0.3 s" in proc.stderr
    assert time.monotonic() - start < 50  # not the 60 s sleep


def test_watchdog_and_failure_classification():
    from torchrec_ascend.distributed.train_pipeline.faults import StepWatchdog, is_peer_failure

    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="step_timeout_s"):
            StepWatchdog(bad)
    with StepWatchdog(None).watch("x"):  # disabled: a no-op
        pass
    with StepWatchdog(5.0).watch("quick step"):  # armed, finishes in time: nothing happens
        pass
    from torchrec_ascend.distributed.train_pipeline import faults
    # an evaluation / a checkpoint: at least AUTO_FIRST_S, and its time does not feed "auto"
    assert StepWatchdog(5.0).limit(step=False) == faults.AUTO_FIRST_S
    assert StepWatchdog(2 * faults.AUTO_FIRST_S).limit(step=False) == 2 * faults.AUTO_FIRST_S
    auto = StepWatchdog("auto")
    for _ in range(faults.AUTO_WARMUP):
        with auto.watch("step"):
            pass
    assert auto.limit() == faults.AUTO_MIN_S
    auto._recent.clear()
    auto._recent.append(0.0)
    with auto.watch("evaluation", step=False):
        time.sleep(0.01)
    assert list(auto._recent) == [0.0] and auto.limit() == faults.AUTO_MIN_S
    assert is_peer_failure(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]"))
    assert not is_peer_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_peer_failure(ValueError("connection closed by peer"))
    assert not is_peer_failure(PeerFailureError("already wrapped"))
