"""Table-batched embedding (TBE) lookups: TorchRec's FUSED and DENSE compute kernels, public API.

The ops (fbgemm's ``*_pt2_wrapper`` forward / fused-backward ops, the dense lookup, and our fused
``split_embedding_codegen_lookup_function``) are registered by :mod:`.specs.embedding`, so
``use_backend("reference", replace_fbgemm=True)`` runs TorchRec's training step on our kernels
with fbgemm's autograd plumbing unchanged.  ``fbgemm::dense_embedding_codegen_lookup_function``:
ours returns one row per index for sequence tables, where fbgemm-gpu-cpu 1.8.0 returns pooled
rows.  docs/embedding_ops.md has the traced call path and the exact formulas.

Public API (validate, then dispatch through ``torch.ops.torchrec_ascend``):
:func:`split_embedding_forward` (no autograd), :func:`split_embedding_lookup` (forward + fused
optimizer in backward), :func:`dense_embedding_lookup` (differentiable).
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

from . import validation
from .reference import embedding as ref
from .specs import embedding as _specs
from .specs.embedding import OPTIMIZERS, POOLING_MODES, backward_op_name

__all__ = [
    "OPTIMIZERS",
    "POOLING_MODES",
    "backward_op_name",
    "split_embedding_forward",
    "split_embedding_lookup",
    "dense_embedding_lookup",
]

_specs.register_all()
_ops = torch.ops.torchrec_ascend
_N_STATES = _specs.N_STATES


# --------------------------------------------------------------------------- validation


def _pooling(pooling_mode: Union[str, int]) -> int:
    if isinstance(pooling_mode, str):
        if pooling_mode.lower() not in POOLING_MODES:
            raise ValueError(f"pooling_mode: {pooling_mode!r} is not one of {sorted(POOLING_MODES)}")
        return POOLING_MODES[pooling_mode.lower()]
    if int(pooling_mode) not in POOLING_MODES.values():
        raise ValueError(f"pooling_mode: {pooling_mode} is not 0 (sum), 1 (mean) or 2 (none)")
    return int(pooling_mode)


def _check_tbe(weights, weights_offsets, D_offsets, hash_size_cumsum, indices, offsets, pooling_mode,
               per_sample_weights, validate: bool) -> Tuple[int, int, int]:
    """Checks shared by every entry point; returns (total_D, max_D, B)."""
    validation.check_tensor("weights", weights, dim=1, dtypes=validation.FLOAT_DTYPES)
    validation.check_tensor("weights_offsets", weights_offsets, dim=1, dtypes=(torch.int64,))
    validation.check_tensor("D_offsets", D_offsets, dim=1, dtypes=validation.INDEX_DTYPES)
    validation.check_tensor("hash_size_cumsum", hash_size_cumsum, dim=1, dtypes=(torch.int64,))
    validation.check_tensor("indices", indices, dim=1, dtypes=validation.INDEX_DTYPES)
    if per_sample_weights is not None:
        validation.check_tensor("per_sample_weights", per_sample_weights, dim=1, dtypes=validation.FLOAT_DTYPES)
        if per_sample_weights.numel() != indices.numel():
            raise ValueError(f"per_sample_weights: has {per_sample_weights.numel()} entries, "
                             f"indices has {indices.numel()}; need one weight per index")
    validation.check_same_device(weights=weights, weights_offsets=weights_offsets, D_offsets=D_offsets,
                              hash_size_cumsum=hash_size_cumsum, indices=indices, offsets=offsets,
                              per_sample_weights=per_sample_weights)
    T = weights_offsets.numel()
    if T == 0:
        raise ValueError("weights_offsets: need at least one feature (T >= 1)")
    if D_offsets.numel() != T + 1:
        raise ValueError(f"D_offsets: expected T + 1 = {T + 1} entries (T from weights_offsets), "
                         f"got {D_offsets.numel()}")
    if hash_size_cumsum.numel() != T + 1:
        raise ValueError(f"hash_size_cumsum: expected T + 1 = {T + 1} entries, got {hash_size_cumsum.numel()}")
    validation.check_offsets("offsets", offsets, indices.numel(), validate)
    if (offsets.numel() - 1) % T != 0:
        raise ValueError(f"offsets: has {offsets.numel()} entries; must be T * B + 1 with T = {T}")
    B = (offsets.numel() - 1) // T
    dims = (D_offsets[1:] - D_offsets[:-1]).tolist()
    if int(D_offsets[0]) != 0 or min(dims) <= 0:
        raise ValueError(f"D_offsets: must start at 0 and increase strictly (every dim > 0), got "
                         f"{D_offsets.tolist()}")
    if pooling_mode == ref.NONE and len(set(dims)) != 1:
        raise ValueError(f"D_offsets: pooling_mode none (sequence) needs one dim for all features, got {dims}")
    if validate and indices.numel() > 0:
        _check_indices(weights, weights_offsets, dims, hash_size_cumsum, indices, offsets, B)
    return int(D_offsets[-1]), max(dims), B


def _check_indices(weights, weights_offsets, dims, hash_size_cumsum, indices, offsets, B) -> None:
    """Every index lies in its feature's table, and the table lies inside ``weights``."""
    T = len(dims)
    hs = hash_size_cumsum.tolist()
    # a feature's table size: the next non-zero step of hash_size_cumsum (shared tables repeat it)
    sizes = []
    for t in range(T):
        nxt = next((hs[u + 1] for u in range(t, T) if hs[u + 1] != hs[t]), hs[t])
        sizes.append(nxt - hs[t])
    wo = weights_offsets.tolist()
    for t in range(T):
        if wo[t] < 0 or wo[t] + sizes[t] * dims[t] > weights.numel():
            raise ValueError(f"weights_offsets: feature {t}'s table [{wo[t]}, {wo[t] + sizes[t] * dims[t]}) "
                             f"does not fit in weights of {weights.numel()} elements")
    offs = offsets.to(torch.int64)
    n_used = int(offs[-1])
    feat = torch.searchsorted(offs[B:T * B + 1:B].contiguous() if B > 0 else offs[-1:], 
                              torch.arange(n_used, device=indices.device), right=True)
    size = torch.tensor(sizes, dtype=torch.int64, device=indices.device)[torch.clamp(feat, max=T - 1)]
    idx = indices[:n_used].to(torch.int64)
    bad = (idx < 0) | (idx >= size)
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0, 0])
        raise ValueError(f"indices: indices[{i}]={int(idx[i])} is out of range [0, {int(size[i])}) "
                         f"for feature {int(feat[i])}")


def _default_hash_size_cumsum(weights: torch.Tensor, weights_offsets: torch.Tensor, D_offsets: torch.Tensor):
    """Rows per feature from the weights layout (tables in feature order, none shared)."""
    dims = (D_offsets[1:] - D_offsets[:-1]).to(torch.int64)
    ends = torch.cat([weights_offsets[1:], weights_offsets.new_tensor([weights.numel()])])
    rows = torch.div(ends - weights_offsets, dims, rounding_mode="floor")
    return torch.cat([rows.new_zeros(1), torch.cumsum(rows, 0)])


def _prepare(weights, weights_offsets, D_offsets, indices, offsets, pooling_mode, per_sample_weights,
             hash_size_cumsum, validate):
    pm = _pooling(pooling_mode)
    if hash_size_cumsum is None:
        validation.check_tensor("weights", weights, dim=1, dtypes=validation.FLOAT_DTYPES)
        validation.check_tensor("weights_offsets", weights_offsets, dim=1, dtypes=(torch.int64,))
        validation.check_tensor("D_offsets", D_offsets, dim=1, dtypes=validation.INDEX_DTYPES)
        hash_size_cumsum = _default_hash_size_cumsum(weights, weights_offsets, D_offsets)
    total_D, max_D, _ = _check_tbe(weights, weights_offsets, D_offsets, hash_size_cumsum, indices, offsets, pm,
                                   per_sample_weights, validate)
    return pm, hash_size_cumsum, total_D, max_D


# --------------------------------------------------------------------------- public API


def split_embedding_forward(weights: torch.Tensor, weights_offsets: torch.Tensor, D_offsets: torch.Tensor,
                            indices: torch.Tensor, offsets: torch.Tensor, **options) -> torch.Tensor:
    """Table-batched lookup, no autograd: pooled ``[B, total_D]`` (``"sum"``/``"mean"``, with
    optional per-sample weights) or sequence ``[N, D]`` (``"none"``).

    Args:
        weights: flat weights of all tables; feature ``t``'s row ``i`` starts at
            ``weights_offsets[t] + i * D_t``.
        weights_offsets: ``[T]`` int64.  D_offsets: ``[T + 1]`` cumulative dims.
        indices: row ids local to each feature's table; offsets: ``[T * B + 1]`` bag bounds.
        options: the keyword arguments of :func:`dense_embedding_lookup` -- ``pooling_mode``,
            ``per_sample_weights``, ``hash_size_cumsum`` (``[T + 1]`` cumulative table sizes,
            default: from the weights layout), ``output_dtype`` (fbgemm SparseType int: 0 fp32,
            1 fp16, 5 bf16), ``validate`` (check values: offsets monotone, indices in range;
            costs a device sync).
    """
    with torch.no_grad():
        return dense_embedding_lookup(weights, weights_offsets, D_offsets, indices, offsets, **options)


def split_embedding_lookup(
    weights: torch.Tensor,
    weights_offsets: torch.Tensor,
    D_offsets: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    optimizer: str,
    learning_rate: Union[float, torch.Tensor],
    states: Sequence[torch.Tensor] = (),
    states_offsets: Sequence[torch.Tensor] = (),
    pooling_mode: Union[str, int] = "sum",
    per_sample_weights: Optional[torch.Tensor] = None,
    hash_size_cumsum: Optional[torch.Tensor] = None,
    eps: float = 0.0,
    beta1: float = 0.9,
    beta2: float = 0.999,
    weight_decay: float = 0.0,
    weight_decay_mode: int = 0,
    max_norm: float = 0.0,
    iter: int = 1,
    gradient_clipping: bool = False,
    max_gradient: float = 1.0,
    output_dtype: int = 0,
    validate: bool = True,
) -> torch.Tensor:
    """Lookup whose backward applies ``optimizer`` to ``weights`` and ``states`` in place (fbgemm's
    FUSED training): the output requires grad; calling ``backward`` updates the tables.

    ``optimizer``: ``"sgd"`` (no state), ``"adagrad"`` (state: ``[like weights]``),
    ``"rowwise_adagrad"`` (state: one float per row), ``"adam"`` (two states like weights;
    ``iter`` is the 1-based step for bias correction).  ``states_offsets[k][t]``: where feature
    ``t``'s slice of state ``k`` starts.  Other arguments as :func:`split_embedding_forward`.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer: {optimizer!r} is not one of {OPTIMIZERS}")
    pm, hsc, total_D, max_D = _prepare(weights, weights_offsets, D_offsets, indices, offsets, pooling_mode,
                                       per_sample_weights, hash_size_cumsum, validate)
    states, states_offsets = list(states), list(states_offsets)
    n = _N_STATES[optimizer]
    if len(states) != n or len(states_offsets) != n:
        raise ValueError(f"states: optimizer {optimizer!r} needs {n} state tensor(s) and as many offsets, got "
                         f"{len(states)} and {len(states_offsets)}")
    for k, (s, so) in enumerate(zip(states, states_offsets)):
        validation.check_tensor(f"states[{k}]", s, dim=1, dtypes=validation.FLOAT_DTYPES)
        validation.check_tensor(f"states_offsets[{k}]", so, dim=1, dtypes=(torch.int64,))
        validation.check_same_device(weights=weights, **{f"states[{k}]": s, f"states_offsets[{k}]": so})
        if so.numel() != weights_offsets.numel():
            raise ValueError(f"states_offsets[{k}]: expected {weights_offsets.numel()} entries (one per feature)")
    if weight_decay_mode not in (0, 1, 2, 5):
        raise ValueError(f"weight_decay_mode: {weight_decay_mode} is not 0 (none), 1 (L2), 2 or 5 (decoupled)")
    if optimizer == "adam" and int(iter) < 1:
        raise ValueError(f"iter: Adam's step must be >= 1 (bias correction), got {iter}")
    lr = learning_rate if isinstance(learning_rate, torch.Tensor) else torch.tensor(
        float(learning_rate), dtype=torch.float32, device=weights.device)
    placeholder = torch.zeros(0, device=weights.device, requires_grad=True)
    return _ops.split_embedding_codegen_lookup_function(
        placeholder, weights, weights_offsets, D_offsets, total_D, max_D, hsc, indices, offsets, pm,
        per_sample_weights, optimizer, states, states_offsets, lr, eps, beta1, beta2, weight_decay,
        weight_decay_mode, max_norm, iter, gradient_clipping, max_gradient, output_dtype)


def dense_embedding_lookup(
    weights: torch.Tensor,
    weights_offsets: torch.Tensor,
    D_offsets: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    pooling_mode: Union[str, int] = "sum",
    per_sample_weights: Optional[torch.Tensor] = None,
    hash_size_cumsum: Optional[torch.Tensor] = None,
    output_dtype: int = 0,
    validate: bool = True,
) -> torch.Tensor:
    """Data-parallel lookup, differentiable w.r.t. ``weights`` and ``per_sample_weights``:
    pooled ``[B, total_D]``, or for ``pooling_mode="none"`` one row per index ``[N, D]``.
    Arguments as :func:`split_embedding_forward`."""
    pm, hsc, total_D, max_D = _prepare(weights, weights_offsets, D_offsets, indices, offsets, pooling_mode,
                                       per_sample_weights, hash_size_cumsum, validate)
    return _ops.dense_embedding_codegen_lookup_function(
        weights, weights_offsets, D_offsets, total_D, max_D, hsc, 0, indices, offsets, pm, per_sample_weights,
        None, output_dtype)
