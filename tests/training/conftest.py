"""Fixtures shared by the trainer's tests."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _keep_threads():
    """The CLI sets torch's thread count from ``train.threads``: put it back after each test."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
