"""Triton kernels of the jagged family under ``TRITON_INTERPRET=1`` (CPU tensors, small shapes):
the same parity body as test_jagged.py -- forward and backward against fbgemm's CPU kernels --
with the ``triton`` backend forced for every jagged op that has one (the reference elsewhere).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")
pytest.importorskip("fbgemm_gpu")

import torchrec_ascend.ops as tops  # noqa: E402
from test_jagged import Jag, check_parity, family_backends, jag_strategy  # noqa: E402

# ops whose forward or backward runs a Triton kernel
TRITON_OPS = ["jagged_to_padded_dense", "dense_to_jagged", "jagged_2d_to_dense",
              "jagged_dense_elementwise_add", "jagged_softmax", "jagged_jagged_bmm",
              "jagged_dense_bmm"]


@pytest.fixture(autouse=True, scope="module")
def _interpret():
    """Interpret Triton on CPU for this module only (``triton.jit`` reads the switch when a kernel
    module is imported, which happens lazily on the first call; the registry when it reads its
    environment)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        tops.registry.reload_environment()
        yield
    tops.registry.reload_environment()


def test_triton_kernels_registered():
    assert {"jagged_to_padded_dense_forward", "jagged_to_padded_dense_backward",
            "dense_to_jagged_forward", "jagged_softmax_forward", "jagged_softmax_backward",
            "jagged_jagged_bmm_forward", "jagged_dense_bmm_forward"} <= set(family_backends("triton"))


@pytest.mark.parametrize("op", TRITON_OPS)
@settings(max_examples=2, deadline=None)
@given(j=jag_strategy())
def test_triton_parity_with_fbgemm(op, j):
    check_parity(op, "triton", j)


@pytest.mark.parametrize("op", TRITON_OPS)
def test_triton_edge_shapes(op):
    # empty batch, long sequence truncated by max_L (tiles of 16/32 straddled), N = 0
    for lengths, n in (([], 3), ([0, 37, 1], 20), ([2, 3], 0)):
        j = Jag(torch.tensor(lengths, dtype=torch.int64), n, torch.float32, torch.int32, 17,
                torch.Generator().manual_seed(len(lengths) + n))
        check_parity(op, "triton", j)
