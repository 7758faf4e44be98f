"""Shared pytest setup: deterministic seeds, small hypothesis budgets on this 2-core machine."""

import os

import pytest
import torch

try:
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "ci",
        max_examples=15,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        derandomize=True,  # the same examples on every run: CI never flakes on a new draw
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # hypothesis is a test requirement; tests that need it import it themselves
    pass


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from seed 0; tests that want their own stream seed a Generator from
    ``torch.initial_seed()`` (never ``torch.seed()``, which draws a fresh OS seed)."""
    torch.manual_seed(0)
    yield


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
