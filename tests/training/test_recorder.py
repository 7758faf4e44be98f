"""Recorder: log.jsonl lines, a fresh log unless resuming, no files on other ranks; the plot."""

from __future__ import annotations

import json
import os

from torchrec_ascend.training.recorder import Recorder, plot


def test_log_lines_fresh_and_resumed(tmp_path):
    rec = Recorder(str(tmp_path), "hstu", enabled=True)
    rec.log({"step": 1, "loss": 2.5})
    rec.scalar("train/loss", 2.5, 1)
    rec.close()
    path = tmp_path / "hstu" / "log.jsonl"
    assert [json.loads(x) for x in path.read_text().splitlines()] == [{"step": 1, "loss": 2.5}]
    rec = Recorder(str(tmp_path), "hstu", enabled=True, fresh=False)  # a resumed run appends
    rec.log({"step": 2, "loss": 2.0})
    rec.close()
    assert len(path.read_text().splitlines()) == 2
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
