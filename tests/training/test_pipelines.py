"""The trainer's pipeline glue: one table (make_train_pipeline's KINDS), the step row logged per
step, the timeline picture of a few steps."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchrec")

from torchrec_ascend.distributed.train_pipeline import KINDS as DIST_KINDS  # noqa: E402
from torchrec_ascend.distributed.train_pipeline import StageTimer  # noqa: E402
from torchrec_ascend.training.pipelines import (KINDS, draw_pipeline_png, make_pipeline,  # noqa: E402
                                                step_row)


def test_one_table():
    assert KINDS is DIST_KINDS and KINDS == ("sync", "sparse_dist", "semi_async")


def test_unknown_name_is_named():
    with pytest.raises(ValueError, match=r"kind: 'base' is not one of \['sync'"):
        make_pipeline("base", torch.nn.Linear(1, 1), None, torch.device("cpu"))


def test_synchronous_kinds_refuse_staleness():
    with pytest.raises(ValueError, match="staleness: 1 needs kind='semi_async'"):
        make_pipeline("sparse_dist", torch.nn.Linear(1, 1), None, torch.device("cpu"), 1)


def test_step_row_flattens_the_record():
    rec = {"step": 3, "step_ms": 12.5, "busy_fraction": 0.75, "pipeline": "sync",
           "stages_ms": {"dense_fwd": 5.0, "batch_copy": 1.25}}
    assert step_row(rec) == {"step_ms": 12.5, "busy_fraction": 0.75,
                             "stage_ms/batch_copy": 1.25, "stage_ms/dense_fwd": 5.0}


class _Pipe:
    def __init__(self, timer):
        self.timer = timer


def test_png_of_the_middle_steps(tmp_path):
    timer = StageTimer()
    for step in range(10):
        timer.add("dense_fwd", step, step * 1.0, step * 1.0 + 0.5)
    assert draw_pipeline_png(_Pipe(StageTimer()), str(tmp_path / "none.png")) is None
    path = draw_pipeline_png(_Pipe(timer), str(tmp_path / "p.png"), num_steps=4)
    assert path and (tmp_path / "p.png").stat().st_size > 1000
