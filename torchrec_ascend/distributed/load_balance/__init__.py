"""Cost-balanced placement of jagged batches across ranks (and micro-batches) for HSTU training.

HSTU's cost per sequence grows as ``a n + b n^2``, so equal sample counts give ranks unequal
work.  This package prices sequences, assigns them to ranks minimising the largest rank cost, and
moves them (one ``all_to_all``) or selects them on the data-loader side (no communication).
Design and measured results: docs/load_balance.md.

Public API (stable; the trainer's ``train.balance = "none" | "collator" | "all_to_all"`` maps
onto :func:`build_balancer`)::

    HSTUCostModel(a, b, target_coef=0.0)                                      cost.py
        .cost(lengths [B] int, num_targets [B] | None = None) -> float64 [B] (CPU)
        HSTUCostModel.calibrate(encoder, device, max_len, cache=True, *, target_coef=0.0,
                                cache_dir=None, repeats=3, refresh=False) -> HSTUCostModel  (timed, cached)
        HSTUCostModel.from_flops(num_layers, embedding_dim, num_heads, attention_dim, linear_dim,
                                 *, backward=True, target_coef=0.0)           (FLOP-proportional)
        HSTUCostModel.from_encoder(encoder, *, backward=True, target_coef=0.0)

    plan_assignment(costs [N] float, num_bins, max_per_bin=None, *, sizes=None,
                    max_size_per_bin=None, refine=True, max_rounds=None) -> int64 [N] bin per item
    bin_loads(costs, bins, num_bins) -> float64 [num_bins];  imbalance(costs, bins, num_bins) -> float

    RankPlanner(cost_model, max_per_rank=None, max_tokens_per_rank=None, allow_empty=True)
        base of both balancers: .plan_costs(costs [N], lengths [N], world) -> int64 [N] rank

    CollatorBalancer(cost_model, max_per_rank=None, max_tokens_per_rank=None, allow_empty=True)
        .plan(global_lengths [N], world, num_targets=None) -> int64 [N] rank of each sequence
        .select(global_lengths [N], rank, world, num_targets=None) -> int64 indices (ascending)
        .microbatches(lengths [B], num_micro, max_per_micro=None, num_targets=None) -> [indices]
    BalancedBatchSampler(lengths, global_batch_size, balancer, rank=None, world=None,
                         shuffle=True, seed=0, drop_last=True)        DataLoader batch_sampler

    AllToAllBalancer(cost_model, max_per_rank=None, max_tokens_per_rank=None, allow_empty=True)
        .balance(lengths [B], token_fields {name: [T, ...]}, sample_fields {name: [B, ...]},
                 group=None, *, num_targets=None) -> BalancedBatch              (collective)
        .balance_jagged(jt, sample_fields=None, group=None, *, num_targets=None)
            -> (JaggedTensor, BalancedBatch)
        .balance_kjt(kjt, sample_fields=None, group=None, *, cost_key=None, num_targets=None)
            -> (KeyedJaggedTensor, BalancedBatch)
    BalancedBatch: .lengths [B'], .offsets [B'+1], .token_fields, .sample_fields, .num_targets,
                   .source_rank [B'], .source_index [B'], .rank_costs [world], .imbalance,
                   .restore(per_sample [B', ...], group=None, *, async_op=False) -> [B, ...]
                                                                     (collective, original order)
                   .restore_tokens(per_token [T', ...], group=None, *, async_op=False) -> [T, ...]
    PendingRestore (restore with async_op=True): .wait() -> the tensor, .done() -> bool

    build_balancer(mode, cost_model, **limits) -> None | CollatorBalancer | AllToAllBalancer

Communication per ``balance``: two small ``all_gather`` (header; costs + lengths) and one
``all_to_all_single`` carrying every field; ``restore`` is one ``all_to_all_single``.
"""

from __future__ import annotations

from typing import Literal, Optional, Union

from ...options import Key, OptionError, check_choice, choices
from .assign import RankPlanner, bin_loads, imbalance, plan_assignment
from .collator import BalancedBatchSampler, CollatorBalancer
from .cost import HSTUCostModel, calibration_key, default_cache_dir
from .exchange import AllToAllBalancer, BalancedBatch, PendingRestore

__all__ = [
    "AllToAllBalancer", "BalancedBatch", "BalancedBatchSampler", "CollatorBalancer",
    "BalanceMode", "HSTUCostModel", "MODES", "PendingRestore", "RankPlanner", "bin_loads",
    "build_balancer", "calibration_key", "check_balance_options", "default_cache_dir",
    "imbalance", "plan_assignment",
]

BalanceMode = Literal["none", "collator", "all_to_all"]
"""``train.balance``: no balancing, the data-loader side selection, or the all_to_all exchange."""
MODES = choices(BalanceMode)


def check_balance_options(balance: BalanceMode, balance_ahead: bool, key: Key = str) -> None:
    """The balancer options' rule: ``balance_ahead`` (balance the next batch on a worker
    thread) needs the ``all_to_all`` balancer."""
    check_choice(key("balance"), balance, BalanceMode)
    if balance_ahead and balance != "all_to_all":
        raise OptionError(key("balance_ahead"), f"needs {key('balance')}='all_to_all' "
                                                f"(got {balance!r})")


def build_balancer(mode: BalanceMode, cost_model: Optional[HSTUCostModel], *, max_per_rank: Optional[int] = None,
                   max_tokens_per_rank: Optional[int] = None, allow_empty: bool = True
                   ) -> Union[None, CollatorBalancer, AllToAllBalancer]:
    """The balancer of ``train.balance``: ``"none"`` -> ``None``, ``"collator"`` ->
    :class:`CollatorBalancer`, ``"all_to_all"`` -> :class:`AllToAllBalancer`."""
    check_choice("mode", mode, BalanceMode)
    if mode == "none":
        return None
    if cost_model is None:
        raise ValueError(f"cost_model: required for mode {mode!r}")
    cls = CollatorBalancer if mode == "collator" else AllToAllBalancer
    return cls(cost_model, max_per_rank=max_per_rank, max_tokens_per_rank=max_tokens_per_rank,
               allow_empty=allow_empty)
