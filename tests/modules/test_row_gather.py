"""take_rows: x[index] with a row-by-row backward (vs torch's own indexing and its autograd)."""
import pytest
import torch

from torchrec_ascend.models.batch import query_positions
from torchrec_ascend.models.config import embedding_columns
from torchrec_ascend.modules.row_gather import _TakeRows, take_rows


def _grads(fn, x, index, g):
    x = x.detach().clone().requires_grad_(True)
    y = fn(x, index)
    y.backward(g)
    return y.detach(), x.grad


@pytest.mark.parametrize("index", [
    [], [0], [6], list(range(7)), [1, 2, 5], [0, 3, 6],
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_matches_indexing_forward_and_backward(index, dtype):
    gen = torch.Generator().manual_seed(len(index))
    x = torch.randn(7, 5, generator=gen).to(dtype)
    idx = torch.tensor(index, dtype=torch.int64)
    g = torch.randn(len(index), 5, generator=gen).to(dtype)
    y_ref, dx_ref = _grads(lambda a, i: a[i], x, idx, g)
    y, dx = _grads(take_rows, x, idx, g)
    assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref)


def test_fast_path_taken_and_rows_not_taken_are_zero():
    # the gradient buffer is uninitialised memory: every row not taken must be written
    torch.manual_seed(0)
    offsets = torch.tensor([0, 5, 5, 6, 13])
    q = query_positions(offsets, 13)
    x = torch.randn(13, 3, requires_grad=True)
    y = take_rows(x, q)
    assert type(y.grad_fn).__name__ == _TakeRows.__name__ + "Backward"
    y.backward(torch.ones_like(y))
    taken = torch.zeros(13, dtype=torch.bool)
    taken[q] = True
    assert torch.equal(x.grad[taken], torch.ones(int(taken.sum()), 3))
    assert torch.equal(x.grad[~taken], torch.zeros(int((~taken).sum()), 3))


@pytest.mark.parametrize("index", [[2, 2, 4], [4, 1], [3, 3]])
def test_repeated_or_decreasing_index_accumulates_like_indexing(index):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    idx = torch.tensor(index)
    g = torch.randn(len(index), 4, generator=gen, dtype=torch.float64)
    _, dx_ref = _grads(lambda a, i: a[i], x, idx, g)
    _, dx = _grads(take_rows, x, idx, g)
    assert torch.equal(dx, dx_ref)


def test_errors():
    x = torch.randn(4, 2, requires_grad=True)
    with pytest.raises(ValueError, match="index: expected a 1-D int64 tensor"):
        take_rows(x, torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(IndexError, match=r"index: rows must be in \[0, 4\), got \[1, 4\]"):
        take_rows(x, torch.tensor([1, 4]))


def test_embedding_columns():
    x = torch.randn(3, 8)
    assert embedding_columns(x, 8) is x
    assert torch.equal(embedding_columns(x, 6), x[:, :6])
