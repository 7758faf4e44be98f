"""train.lr_schedule: the factor per step against the published half-cosine formula, and the
dense optimizer stepping with lr x factor (its AdamW update against torch's own AdamW at that
learning rate)."""

from __future__ import annotations

import math

import pytest
import torch

from torchrec_ascend.training import config_from_dict
from torchrec_ascend.training.lr_schedule import LR_SCHEDULES, lr_schedule
from torchrec_ascend.training.trainer import DenseOptimizer
from torchrec_ascend.options import OptionError


def test_constant_is_no_schedule_and_cosine_follows_the_formula():
    assert LR_SCHEDULES == ("constant", "cosine")
    assert lr_schedule("constant", 10) is None
    f = lr_schedule("cosine", 8)
    for s in range(-1, 12):
        c = min(max(s, 0), 8)
        assert f(s) == pytest.approx((1 + math.cos(math.pi * c / 8)) / 2, abs=1e-15)
    assert f(0) == 1.0 and f(4) == pytest.approx(0.5) and f(8) == pytest.approx(0.0, abs=1e-15)


def test_dense_optimizer_steps_at_lr_times_the_factor():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5, 3))
    ref = torch.nn.Parameter(w.detach().clone())
    total, lr = 4, 0.1
    opt = DenseOptimizer([w], lr, 0.01, None, lr_schedule("cosine", total))
    ref_opt = torch.optim.AdamW([ref], lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    for step in range(total):
        g = torch.randn(5, 3)
        w.grad, ref.grad = g.clone(), g.clone()
        opt.step_number = step + 1  # the trainer's 1-based step
        opt.step()
        for group in ref_opt.param_groups:
            group["lr"] = lr * (1 + math.cos(math.pi * step / total)) / 2
        ref_opt.step()
        assert opt.param_groups[0]["lr"] == pytest.approx(ref_opt.param_groups[0]["lr"])
        torch.testing.assert_close(w.detach(), ref.detach(), rtol=0, atol=1e-7)
    assert not torch.equal(w.detach(), torch.zeros(5, 3))


def test_unknown_schedule_is_one_line_naming_the_key():
    with pytest.raises(OptionError, match=r"train.lr_schedule: 'linear' is not one of \['constant', 'cosine'\]"):
        config_from_dict({"train": {"lr_schedule": "linear"}})
