"""DenseGradSync on one process: start/wait contract and the pending flag (the 2-rank average
is exercised by tests/distributed/test_semi_async.py against DDP)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchrec")

from torchrec_ascend.distributed.data_parallel import DenseGradSync  # noqa: E402


def test_pending_flag_and_single_process_noop():
    lin = torch.nn.Linear(3, 2)
    sync = DenseGradSync(list(lin.parameters()), None)
    assert not sync.pending
    lin(torch.randn(4, 3)).sum().backward()
    assert sync.pending
    g = lin.weight.grad.clone()
    sync.start()
    assert not sync.pending
    sync.wait()
    torch.testing.assert_close(lin.weight.grad, g, atol=0, rtol=0)  # world 1: unchanged
