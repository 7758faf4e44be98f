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
        derandomize=False,
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # hypothesis is a test requirement; tests that need it import it themselves
    pass


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
