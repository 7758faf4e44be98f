"""Rows of a tensor taken by a strictly increasing index, with a backward that writes each row once.

``take_rows(x, index)`` is ``x[index]``.  Autograd's backward of ``x[index]`` fills a zero tensor of
``x``'s shape and then adds the gradient's rows into it (``index_put_`` with accumulation): two
passes over ``[N, D]``, the second a slow accumulating scatter.  Where ``index`` is strictly
increasing (so no row is taken twice: the retrieval loss's query rows and their next items),
the gradient's rows are gathered to their places (``index_select``, which copies whole rows) and
only the rows not taken are zeroed.
Elsewhere (an index that repeats or goes back, or a device other than the CPU, where checking
the index would wait for the device) it is plain ``x[index]``.
"""

from __future__ import annotations

import torch

__all__ = ["take_rows"]


class _TakeRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.rows = x.shape[0]
        ctx.save_for_backward(index)
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        (index,) = ctx.saved_tensors
        if index.numel() == 0:
            return g.new_zeros((ctx.rows,) + tuple(g.shape[1:])), None
        # row r of dx is row source[r] of g (a row-copying gather: index_copy_ / index_put_ go
        # element by element on the CPU); the rows not taken read row 0 and are zeroed after
        source = torch.zeros(ctx.rows, dtype=torch.int64, device=g.device)
        source[index] = torch.arange(index.numel(), device=g.device)
        taken = torch.zeros(ctx.rows, dtype=torch.bool, device=g.device)
        taken[index] = True
        dx = g.index_select(0, source)
        dx.index_fill_(0, torch.nonzero(~taken).squeeze(1), 0.0)
        return dx, None


def take_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[index]`` for a 1-D int64 ``index`` of rows (first dimension) of ``x``; its gradient
    written row by row where ``index`` is strictly increasing on the CPU (module docstring)."""
    if index.dim() != 1 or index.dtype != torch.int64:
        raise ValueError(f"index: expected a 1-D int64 tensor, got {tuple(index.shape)} {index.dtype}")
    increasing = (x.device.type == "cpu" and index.device.type == "cpu"
                  and (index.numel() < 2 or bool((index[1:] > index[:-1]).all())))
    if not (increasing and x.requires_grad and torch.is_grad_enabled()):
        return x[index]
    if index.numel() and (int(index[0]) < 0 or int(index[-1]) >= x.shape[0]):
        raise IndexError(f"index: rows must be in [0, {x.shape[0]}), got "
                         f"[{int(index[0])}, {int(index[-1])}]")
    return _TakeRows.apply(x, index)
