"""The train-pipeline factory: names, registration, the error for an unknown name."""

from __future__ import annotations

import pytest
import torch

from torchrec_ascend.training.pipelines import PIPELINES, make_pipeline, register_pipeline


def test_unknown_name_is_named():
    with pytest.raises(ValueError, match=r"train.pipeline: 'nope' is not one of \['base', 'sparse_dist'"):
        make_pipeline("nope", torch.nn.Linear(1, 1), None, torch.device("cpu"))


def test_register_adds_a_name(monkeypatch):
    monkeypatch.setitem(PIPELINES, "probe", PIPELINES["base"])
    seen = []
    register_pipeline("probe", lambda m, o, d: seen.append((m, o, d)) or "built")
    model = torch.nn.Linear(1, 1)
    assert make_pipeline("probe", model, "opt", torch.device("cpu")) == "built"
    assert seen == [(model, "opt", torch.device("cpu"))]
    with pytest.raises(ValueError, match="name: expected a non-empty string"):
        register_pipeline("", lambda m, o, d: None)
