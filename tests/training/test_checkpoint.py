"""Atomic, verified checkpoints in process: a failed save keeps the last good one; a damaged
newest checkpoint (truncated, overwritten at the same size, missing its manifest) is reported
and the newest intact one loads; a later save replaces the leftover temporary folder."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from torchrec_ascend.training import checkpoint as ck


def _trained():
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return model, opt


def test_checkpoint_save_failure_keeps_last_good(tmp_path, monkeypatch):
    model, opt = _trained()
    root = str(tmp_path)
    first = ck.save(root, 2, model, opt, {"note": "a"})
    assert ck.verify(first) is None
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)

    def boom(*a, **k):
        raise OSError("disk full")

    # the save dies after every file was written, before the manifest and the rename
    monkeypatch.setattr(ck, "_write_manifest", boom)
    with pytest.raises(OSError, match="disk full"):
        ck.save(root, 4, model, opt, {"note": "b"})
    monkeypatch.undo()
    assert ck.find_checkpoint(root) == first
    assert os.path.isdir(os.path.join(root, "checkpoints", "step_00000004.tmp-save"))
    assert not os.path.exists(os.path.join(root, "checkpoints", "step_00000004"))
    state = ck.load(first, model, opt)
    assert state["step"] == 2 and state["note"] == "a"
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved[k]), k
    # the next successful save replaces the leftover temporary folder
    ck.save(root, 4, model, opt, {"note": "c"})
    assert ck.find_checkpoint(root).endswith("step_00000004")
    assert not os.path.exists(os.path.join(root, "checkpoints", "step_00000004.tmp-save"))


def _damage(path: str, how: str) -> None:
    if how == "no_manifest":
        os.remove(os.path.join(path, ck.MANIFEST))
        return
    name = {"truncate_trainer": ck.TRAINER_FILE, "truncate_metadata": ".metadata"}.get(how)
    if name is None:  # a DCP shard
        name = next(f for f in os.listdir(path) if f.endswith(".distcp"))
    full = os.path.join(path, name)
    size = os.path.getsize(full)
    if how.startswith("truncate") or how == "truncate_distcp":
        with open(full, "r+b") as f:
            f.truncate(size // 2)
    else:  # bytes overwritten in place: the same size, other content
        with open(full, "r+b") as f:
            f.seek(size // 2)
            byte = f.read(1)
            f.seek(size // 2)
            f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("how", ["truncate_trainer", "truncate_metadata", "truncate_distcp",
                                 "overwrite_distcp", "no_manifest"])
def test_damaged_newest_checkpoint_falls_back_to_the_previous_good_one(tmp_path, how):
    model, opt = _trained()
    root = str(tmp_path)
    good = ck.save(root, 2, model, opt, {"note": "good"}, keep=3)
    with torch.no_grad():
        model.weight.add_(1.0)
    bad = ck.save(root, 4, model, opt, {"note": "bad"}, keep=3)
    assert ck.find_checkpoint(root) == bad
    _damage(bad, how)
    assert ck.verify(bad) is not None and ck.verify(good) is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = ck.find_checkpoint(root)
    assert found == good
    msgs = [str(w.message) for w in caught if issubclass(w.category, ck.CheckpointWarning)]
    assert len(msgs) == 1 and bad in msgs[0] and good in msgs[0], msgs
    assert ck.load(found, model, opt)["note"] == "good"
    assert os.path.isdir(bad)  # reported, never deleted


def test_no_intact_checkpoint_is_none(tmp_path):
    model, opt = _trained()
    only = ck.save(str(tmp_path), 1, model, opt, {})
    _damage(only, "truncate_trainer")
    with pytest.warns(ck.CheckpointWarning, match="no intact checkpoint is left"):
        assert ck.find_checkpoint(str(tmp_path)) is None
    assert ck.find_checkpoint(str(tmp_path / "nothing")) is None
