"""StageTimer: per-step records (stage sums, busy fraction of the compute thread), spans."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("torchrec")

from torchrec_ascend.distributed.train_pipeline.stages import (  # noqa: E402
    COMPUTE_STAGES,
    STAGES,
    StageTimer,
)


def test_record_sums_stages_and_busy_fraction_counts_compute_on_the_main_thread():
    t = StageTimer()
    base = 100.0
    t.add("dense_fwd", 0, base, base + 0.010)
    t.add("grad_comm_wait", 0, base + 0.010, base + 0.030)
    t.add("dense_fwd", 0, base + 0.030, base + 0.035)
    # a compute stage on another thread does not make the main thread busy
    other = threading.Thread(target=t.add, args=("lookup", 0, base, base + 0.02))
    other.start()
    other.join()
    # close the step at a known time: patch the clock by adding a span that ends at +40 ms
    t.add("optimizer", 0, base + 0.035, base + 0.040)
    rec = t.end_step(0)
    assert rec["stages_ms"] == pytest.approx(
        {"dense_fwd": 15.0, "grad_comm_wait": 20.0, "lookup": 20.0, "optimizer": 5.0})
    # the step's wall time runs from its first span to end_step (now, long after `base`)
    assert rec["step_ms"] > 0
    busy_s = 0.020  # dense_fwd 15 ms + optimizer 5 ms on the main thread
    assert rec["busy_fraction"] == pytest.approx(min(busy_s / (rec["step_ms"] / 1e3), 1.0))
    assert [s.stage for s in t.spans] == ["dense_fwd", "grad_comm_wait", "dense_fwd",
                                          "lookup", "optimizer"]
    nxt = t.end_step(1)
    assert nxt["stages_ms"] == {} and nxt["busy_fraction"] == 0.0


def test_stage_context_and_validation():
    t = StageTimer(keep_spans=2)
    for _ in range(3):
        with t.stage("lookup", 4):
            time.sleep(0.002)
    rec = t.end_step(4)
    assert rec["stages_ms"]["lookup"] >= 6.0
    assert 0.5 < rec["busy_fraction"] <= 1.0
    assert len(t.spans) == 2  # only the newest are kept
    with pytest.raises(ValueError, match="stage='nope'"):
        with t.stage("nope"):
            pass
    with pytest.raises(ValueError, match="keep_spans"):
        StageTimer(keep_spans=-1)
    assert COMPUTE_STAGES <= set(STAGES)
