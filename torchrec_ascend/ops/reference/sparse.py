"""Torch-composite sparse-feature ops (cumsums, permutes, bucketize, ...)."""

from __future__ import annotations

import torch


def asynchronous_complete_cumsum(t_in: torch.Tensor) -> torch.Tensor:
    """[0, cumsum(t_in)] along the last dim (1-D or 2-D input)."""
    c = torch.cumsum(t_in, dim=-1).to(t_in.dtype)
    zero = t_in.new_zeros(t_in.shape[:-1] + (1,))
    return torch.cat([zero, c], dim=-1)


def asynchronous_exclusive_cumsum(t_in: torch.Tensor) -> torch.Tensor:
    """cumsum(t_in) - t_in (1-D)."""
    return (torch.cumsum(t_in, dim=0) - t_in).to(t_in.dtype)


def asynchronous_inclusive_cumsum(t_in: torch.Tensor) -> torch.Tensor:
    """cumsum(t_in) (1-D), in the input dtype."""
    return torch.cumsum(t_in, dim=0).to(t_in.dtype)
