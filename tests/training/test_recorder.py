"""Recorder: log.jsonl lines, a fresh log for a new run, the replayed steps dropped on a resume,
no files on other ranks; the plot."""

from __future__ import annotations

import json
import os

from torchrec_ascend.training.recorder import Recorder, plot


def _rows(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_log_lines_fresh_and_resumed(tmp_path):
    rec = Recorder(str(tmp_path), "hstu", enabled=True)
    for step in range(1, 6):
        rec.log({"step": step, "loss": 2.5 - step / 10})
    rec.log({"step": 5, "split": "final", "valid": {}, "test": {}})
    rec.scalar("train/loss", 2.5, 1)
    rec.close()
    path = tmp_path / "hstu" / "log.jsonl"
    assert [r["step"] for r in _rows(path)] == [1, 2, 3, 4, 5, 5]
    with open(path, "a") as f:
        f.write('{"step": 6, "lo')  # the line a kill cut
    # resumed from the checkpoint of step 3: steps 4..6 and the final rows are trained again
    rec = Recorder(str(tmp_path), "hstu", enabled=True, start_step=3)
    rec.log({"step": 4, "loss": 1.0})
    rec.close()
    assert [(r["step"], r.get("loss")) for r in _rows(path)] == [
        (1, 2.4), (2, 2.3), (3, 2.2), (4, 1.0)]
    rec = Recorder(str(tmp_path), "hstu", enabled=True)  # a new run starts over
    rec.close()
    assert not path.exists()
    other = Recorder(str(tmp_path / "r1"), "hstu", enabled=False)
    other.log({"step": 1})
    assert not os.path.exists(tmp_path / "r1")


def test_plot_writes_a_png(tmp_path):
    hist = {"hstu": {"loss": [(1, 3.0), (2, 2.0)],
                     "eval": [{"step": 2, "ndcg@10": 0.3}, {"step": 4, "ndcg@10": 0.4}]}}
    path = plot(str(tmp_path), hist, {"most_popular": {"ndcg@10": 0.1}})
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(path) > 1000
