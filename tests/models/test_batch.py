"""SequenceBatch (a TorchRec Pipelineable) and the query positions of a jagged batch."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchrec")

from torchrec_ascend.models import query_positions  # noqa: E402

from test_generative_retrieval import batch  # noqa: E402


def test_query_positions():
    off = torch.tensor([0, 3, 3, 4, 8])
    assert query_positions(off, 8).tolist() == [0, 1, 4, 5, 6]


def test_batch_moves_as_a_pipelineable():
    b = batch()
    c = b.to(torch.device("cpu"))
    assert torch.equal(c.items, b.items) and torch.equal(c.kjt.values(), b.kjt.values())
    assert c.batch_size == 3 and c.num_tokens == 10
    p = b.pin_memory()
    assert torch.equal(p.items, b.items) and torch.equal(p.pos_log_q, b.pos_log_q)
