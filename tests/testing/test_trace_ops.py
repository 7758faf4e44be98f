"""docs/integration.md's table of fbgemm ops per sharding type stays true: the backend column
matches the registry now, and (slow) a fresh trace of the TorchRec training path matches."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torchrec")

import torchrec_ascend  # noqa: E402,F401
from torchrec_ascend.testing import trace_ops  # noqa: E402

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "integration.md")


def _doc() -> str:
    with open(DOC, encoding="utf-8") as fh:
        return fh.read()


def test_documented_backends_are_the_registry_choice():
    doc = _doc()
    body = doc.split(trace_ops.TABLE_BEGIN, 1)[1].split(trace_ops.TABLE_END, 1)[0]
    parsed = trace_ops.parse_table(doc)
    assert set(parsed) == {"table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel"}
    assert trace_ops.format_table(parsed).strip() == body.strip()


def test_recorder_sees_fbgemm_ops_and_nothing_else():
    import torch

    with trace_ops.OpRecorder() as rec:
        torch.ops.fbgemm.asynchronous_complete_cumsum(torch.tensor([1, 0, 2]))
        torch.arange(3).sum()
    assert rec.ops == {"fbgemm::asynchronous_complete_cumsum"}


@pytest.mark.slow
def test_fresh_trace_matches_the_documented_table():
    assert trace_ops.trace(steps=3) == trace_ops.parse_table(_doc())
