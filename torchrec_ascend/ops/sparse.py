"""Sparse-feature ops on TorchRec's training path: public entry points and registry specs."""

from __future__ import annotations

import torch

from . import _checks
from .reference import sparse as ref
from .registry import OpSpec, register

__all__ = ["asynchronous_complete_cumsum", "asynchronous_exclusive_cumsum",
           "asynchronous_inclusive_cumsum"]

_ops = torch.ops.torchrec_ascend


def _cumsum_fake(t_in):
    return t_in.new_empty(t_in.shape)


def _complete_cumsum_fake(t_in):
    return t_in.new_empty(tuple(t_in.shape[:-1]) + (t_in.shape[-1] + 1,))


register(OpSpec(
    name="asynchronous_complete_cumsum",
    schema="(Tensor t_in) -> Tensor",
    reference=ref.asynchronous_complete_cumsum,
    cpu_kernel="asynchronous_complete_cumsum",
    fake=_complete_cumsum_fake,
    fbgemm=True,
    fbgemm_ascend=True,
))
register(OpSpec(
    name="asynchronous_exclusive_cumsum",
    schema="(Tensor t_in) -> Tensor",
    reference=ref.asynchronous_exclusive_cumsum,
    fake=_cumsum_fake,
    fbgemm=True,
    fbgemm_ascend=True,
))
register(OpSpec(
    name="asynchronous_inclusive_cumsum",
    schema="(Tensor t_in) -> Tensor",
    reference=ref.asynchronous_inclusive_cumsum,
    fake=_cumsum_fake,
    fbgemm=True,
    fbgemm_ascend=True,
))


def _check_counts(t_in: torch.Tensor, max_dim: int) -> None:
    _checks.check_tensor("t_in", t_in, dtypes=_checks.INDEX_DTYPES)
    if not 1 <= t_in.dim() <= max_dim:
        raise ValueError(f"t_in: expected 1..{max_dim} dims, got shape {tuple(t_in.shape)}")


def asynchronous_complete_cumsum(t_in: torch.Tensor) -> torch.Tensor:
    """``[0, cumsum(t_in)]`` along the last dim: lengths -> offsets (1-D or 2-D int input)."""
    _check_counts(t_in, 2)
    return _ops.asynchronous_complete_cumsum(t_in)


def asynchronous_exclusive_cumsum(t_in: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix sum of a 1-D int tensor (``cumsum - t_in``)."""
    _check_counts(t_in, 1)
    return _ops.asynchronous_exclusive_cumsum(t_in)


def asynchronous_inclusive_cumsum(t_in: torch.Tensor) -> torch.Tensor:
    """Inclusive prefix sum of a 1-D int tensor, in its dtype."""
    _check_counts(t_in, 1)
    return _ops.asynchronous_inclusive_cumsum(t_in)
