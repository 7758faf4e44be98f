"""Atomic checkpoints in process: a failed save keeps the last good one, LATEST naming a
damaged folder falls back, a later save replaces the leftover temporary folder."""

from __future__ import annotations

import os

import pytest
import torch

from torchrec_ascend.training import checkpoint as ck


def test_checkpoint_save_failure_keeps_last_good(tmp_path, monkeypatch):
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    root = str(tmp_path)
    first = ck.save(root, 2, model, opt, {"note": "a"})
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)

    def boom(*a, **k):
        raise OSError("disk full")

    # the save dies after every file was written, before the rename that publishes it
    monkeypatch.setattr(ck, "_fsync_tree", boom)
    with pytest.raises(OSError, match="disk full"):
        ck.save(root, 4, model, opt, {"note": "b"})
    monkeypatch.undo()
    assert ck.latest(root) == first
    assert os.path.isdir(os.path.join(root, "checkpoints", "step_00000004.tmp-save"))
    assert not os.path.exists(os.path.join(root, "checkpoints", "step_00000004"))
    # LATEST naming a damaged folder falls back to the newest complete one
    open(os.path.join(root, "checkpoints", "LATEST"), "w").write("step_00000004\n")
    assert ck.latest(root) == first
    state = ck.load(first, model, opt)
    assert state["step"] == 2 and state["note"] == "a"
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved[k]), k
    # the next successful save replaces the leftover temporary folder
    ck.save(root, 4, model, opt, {"note": "c"})
    assert ck.latest(root).endswith("step_00000004")
    assert not os.path.exists(os.path.join(root, "checkpoints", "step_00000004.tmp-save"))
