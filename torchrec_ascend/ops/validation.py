"""Input validation of the public op entry points, public for the layers above (sampling,
metrics, modules) so that every entry point of the package words its errors alike.

Every failure is a ``ValueError`` naming the argument and the rule it broke.  Checks that read
tensor values (and so would cost a device sync on npu/cuda) only run when the caller passes
``validate=True`` (the default of the public Python API).
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import torch

__all__ = [
    "INDEX_DTYPES",
    "FLOAT_DTYPES",
    "check_tensor",
    "check_same_device",
    "check_same_dtype",
    "check_offsets",
    "check_lengths",
    "check_max_lengths",
    "check_nonneg_int",
    "check_jagged",
    "check_jagged_offsets",
    "check_index_range",
    "check_permutation",
]

INDEX_DTYPES = (torch.int32, torch.int64)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_tensor(
    name: str,
    t: object,
    dim: Optional[int] = None,
    min_dim: Optional[int] = None,
    dtypes: Optional[Iterable[torch.dtype]] = None,
) -> torch.Tensor:
    """Type, rank and dtype of one argument."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name}: expected a {dim}-D tensor, got shape {tuple(t.shape)}")
    if min_dim is not None and t.dim() < min_dim:
        raise ValueError(f"{name}: expected at least {min_dim} dims, got shape {tuple(t.shape)}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if t.dtype not in dtypes:
            allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
            raise ValueError(f"{name}: dtype {str(t.dtype).replace('torch.', '')} not in ({allowed})")
    return t


def check_same_device(**tensors: torch.Tensor) -> None:
    """All named tensors live on one device."""
    items = [(k, v) for k, v in tensors.items() if isinstance(v, torch.Tensor)]
    if not items:
        return
    first_name, first = items[0]
    for k, v in items[1:]:
        if v.device != first.device:
            raise ValueError(
                f"{k}: on device {v.device}, but {first_name} is on {first.device}; "
                "all tensors must be on one device"
            )


def check_offsets(name: str, offsets: torch.Tensor, total: Optional[int], validate: bool) -> None:
    """1-D integer offsets: start at 0, non-decreasing, end at ``total`` (when given)."""
    check_tensor(name, offsets, dim=1, dtypes=INDEX_DTYPES)
    if offsets.numel() == 0:
        raise ValueError(f"{name}: must have at least one element (B + 1 entries, starting at 0)")
    if not validate:
        return
    if int(offsets[0]) != 0:
        raise ValueError(f"{name}: must start at 0, starts at {int(offsets[0])}")
    if offsets.numel() > 1:
        diffs = offsets[1:] - offsets[:-1]
        if bool((diffs < 0).any()):
            i = int(torch.nonzero(diffs < 0)[0, 0])
            raise ValueError(
                f"{name}: must be non-decreasing, but {name}[{i + 1}]={int(offsets[i + 1])} "
                f"< {name}[{i}]={int(offsets[i])}"
            )
    if total is not None and int(offsets[-1]) > total:
        raise ValueError(f"{name}: last offset {int(offsets[-1])} exceeds the {total} values")


def check_lengths(name: str, lengths: torch.Tensor, total: Optional[int], validate: bool) -> None:
    """1-D integer lengths: non-negative, summing to ``total`` (when given)."""
    check_tensor(name, lengths, dim=1, dtypes=INDEX_DTYPES)
    if not validate:
        return
    if lengths.numel() and bool((lengths < 0).any()):
        i = int(torch.nonzero(lengths < 0)[0, 0])
        raise ValueError(f"{name}: must be non-negative, {name}[{i}]={int(lengths[i])}")
    if total is not None and int(lengths.sum()) != total:
        raise ValueError(f"{name}: sums to {int(lengths.sum())}, but there are {total} values")


def check_max_lengths(name: str, max_lengths: Sequence[int], n: int) -> None:
    """One non-negative int per jagged dimension."""
    if len(max_lengths) != n:
        raise ValueError(f"{name}: expected {n} entries (one per jagged dim), got {len(max_lengths)}")
    for i, m in enumerate(max_lengths):
        if int(m) < 0:
            raise ValueError(f"{name}[{i}]: must be >= 0, got {m}")


def check_same_dtype(**tensors: torch.Tensor) -> None:
    """All named tensors have one dtype."""
    items = [(k, v) for k, v in tensors.items() if isinstance(v, torch.Tensor)]
    for k, v in items[1:]:
        if v.dtype != items[0][1].dtype:
            raise ValueError(
                f"{k}: dtype {str(v.dtype).replace('torch.', '')} differs from {items[0][0]}'s "
                f"{str(items[0][1].dtype).replace('torch.', '')}; they must match"
            )


def check_nonneg_int(name: str, value: object) -> int:
    """A Python int >= 0."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name}: must be >= 0, got {value}")
    return value


def check_jagged(values_name: str, values: torch.Tensor, offsets_name: str,
                 offsets: torch.Tensor, validate: bool, dim: Optional[int] = None,
                 min_dim: Optional[int] = 1) -> None:
    """A jagged batch: ``values [T, ...]`` (float) and offsets ``[B + 1]`` that end exactly at T."""
    check_tensor(values_name, values, dim=dim, min_dim=None if dim is not None else min_dim,
                 dtypes=FLOAT_DTYPES)
    check_offsets(offsets_name, offsets, values.shape[0], validate)
    check_same_device(**{values_name: values, offsets_name: offsets})
    if validate and int(offsets[-1]) != values.shape[0]:
        raise ValueError(
            f"{offsets_name}: last offset {int(offsets[-1])} must equal the number of rows of "
            f"{values_name} ({values.shape[0]})"
        )


def check_jagged_offsets(name: str, offsets: Sequence[torch.Tensor], total: Optional[int],
                         validate: bool, exact: bool = False, values_name: str = "values") -> None:
    """``J >= 1`` offsets of one jagged tensor (the tensors of a list ``name``): each 1-D, one int
    dtype, non-decreasing from 0; ``offsets[d]`` has ``offsets[d - 1][-1] + 1`` entries, and the
    last ends at most at (``exact``: exactly at) ``total``, the rows of ``values_name``.  With one
    jagged dimension the tensor is named ``name`` itself."""
    if len(offsets) == 0:
        raise ValueError(f"{name}: needs at least one offsets tensor (one per jagged dimension)")
    labels = [name] if len(offsets) == 1 else [f"{name}[{d}]" for d in range(len(offsets))]
    for label, off in zip(labels, offsets):
        check_tensor(label, off, dim=1, dtypes=INDEX_DTYPES)
    check_same_dtype(**dict(zip(labels, offsets)))
    check_same_device(**dict(zip(labels, offsets)))
    for d, (label, off) in enumerate(zip(labels, offsets)):
        check_offsets(label, off, total if d == len(offsets) - 1 else None, validate)
    if not validate:
        return
    for d in range(1, len(offsets)):
        want = int(offsets[d - 1][-1]) + 1
        if offsets[d].numel() != want:
            raise ValueError(f"{labels[d]}: needs {labels[d - 1]}[-1] + 1 = {want} entries (one "
                             f"more than the entries of jagged dimension {d - 1}), got "
                             f"{offsets[d].numel()}")
    if exact and total is not None and int(offsets[-1][-1]) != total:
        raise ValueError(f"{labels[-1]}: last offset {int(offsets[-1][-1])} must equal the number "
                         f"of rows of {values_name} ({total})")


def check_index_range(name: str, t: torch.Tensor, low: int, high: int, validate: bool,
                      allow: Optional[int] = None) -> None:
    """Every value of integer tensor ``t`` lies in ``[low, high)`` (``allow``: one extra value
    that is accepted, e.g. ``-1`` for pruned rows).  Reads values: only with ``validate``."""
    if not validate or t.numel() == 0:
        return
    bad = (t < low) | (t >= high)
    if allow is not None:
        bad &= t != allow
    if bool(bad.any()):
        i = int(torch.nonzero(bad.reshape(-1))[0, 0])
        raise ValueError(f"{name}: {name}[{i}]={int(t.reshape(-1)[i])} is outside [{low}, {high})")


def check_permutation(name: str, p: torch.Tensor, validate: bool) -> None:
    """``p`` is a permutation of ``0 .. len(p) - 1`` (each value exactly once)."""
    check_index_range(name, p, 0, p.numel(), validate)
    if validate and p.numel():
        seen = torch.zeros(p.numel(), dtype=torch.int64, device=p.device)
        seen.index_add_(0, p.reshape(-1).to(torch.int64), torch.ones_like(seen))
        if bool((seen != 1).any()):
            v = int(torch.nonzero(seen != 1)[0, 0])
            raise ValueError(f"{name}: must be a permutation of 0..{p.numel() - 1}, but {v} "
                             f"appears {int(seen[v])} times")
