"""CollatorBalancer and BalancedBatchSampler: the ranks' selections partition the global batch and
agree with the plan, micro-batches partition a rank's batch, the sampler covers each epoch exactly
once across ranks and works inside a DataLoader, and bad arguments are refused."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchrec")

from torchrec_ascend.distributed.load_balance import (  # noqa: E402
    AllToAllBalancer, BalancedBatchSampler, CollatorBalancer, HSTUCostModel, build_balancer, imbalance)

MODEL = HSTUCostModel.from_flops(2, 64, 2, 32, 32)


def _lengths(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.exp(3.5 + torch.randn(n, generator=g)).round().clamp(1, 256).long()


@pytest.mark.parametrize("world", [1, 2, 5, 16])
def test_selections_partition_the_batch_and_follow_the_plan(world):
    lengths = _lengths(40 * world, world)
    bal = CollatorBalancer(MODEL, max_per_rank=80)
    plan = bal.plan(lengths, world)
    picks = [bal.select(lengths, r, world) for r in range(world)]
    assert torch.equal(torch.sort(torch.cat(picks)).values, torch.arange(lengths.numel()))
    for r, p in enumerate(picks):
        assert torch.equal(p, torch.sort(p).values) and bool((plan[p] == r).all())
        assert p.numel() <= 80
    if world > 1:
        assert imbalance(MODEL.cost(lengths), plan, world) < 0.01


def test_microbatches_partition_a_rank_and_balance_it():
    lengths = _lengths(64, 3)
    parts = CollatorBalancer(MODEL).microbatches(lengths, 4, max_per_micro=20)
    assert torch.equal(torch.sort(torch.cat(parts)).values, torch.arange(64))
    costs = MODEL.cost(lengths)
    loads = torch.stack([costs[p].sum() for p in parts])
    assert float(loads.max() / loads.mean()) - 1 < 0.01 and max(p.numel() for p in parts) <= 20
    assert [p.numel() for p in CollatorBalancer(MODEL).microbatches(lengths[:2], 3)].count(0) == 1


def test_sampler_covers_every_epoch_once_across_ranks():
    lengths = _lengths(103, 1)
    bal = CollatorBalancer(MODEL)
    samplers = [BalancedBatchSampler(lengths, 20, bal, rank=r, world=3, seed=7) for r in range(3)]
    for epoch in (0, 1):
        for s in samplers:
            s.set_epoch(epoch)
        batches = [list(s) for s in samplers]
        assert all(len(b) == len(samplers[0]) == 5 for b in batches)
        seen = sorted(i for b in batches for batch in b for i in batch)
        perm = torch.randperm(103, generator=torch.Generator().manual_seed(7 + epoch))[:100]
        assert seen == sorted(perm.tolist())
        for step in range(5):  # each global batch: the ranks' shares are disjoint and balanced
            glob = sorted(i for b in batches for i in b[step])
            assert glob == sorted(perm[step * 20:(step + 1) * 20].tolist())
            costs = [float(MODEL.cost(lengths[b[step]]).sum()) for b in batches]
            assert max(costs) / (sum(costs) / 3) - 1 < 0.35  # 20 heavy-tailed sequences on 3 ranks
        if epoch == 0:
            first = batches
    assert batches != first  # another epoch, another order
    keep = BalancedBatchSampler(lengths, 20, bal, rank=0, world=3, drop_last=False, shuffle=False)
    assert len(keep) == 6 and sum(len(b) for b in BalancedBatchSampler(
        lengths, 20, bal, world=1, drop_last=False, shuffle=False)) == 103


def test_sampler_drives_a_dataloader():
    lengths = _lengths(30, 2)
    ds = [{"len": int(n), "id": i} for i, n in enumerate(lengths.tolist())]
    sampler = BalancedBatchSampler(lengths, 10, CollatorBalancer(MODEL), rank=1, world=2)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, collate_fn=list)
    got = [b for b in loader]
    assert [[d["id"] for d in b] for b in got] == list(sampler)
    assert all(d["len"] == int(lengths[d["id"]]) for b in got for d in b)


def test_bad_arguments():
    bal = CollatorBalancer(MODEL)
    with pytest.raises(ValueError, match=r"rank: must be an integer in \[0, world=2\), got 2"):
        bal.select(torch.tensor([3, 4]), 2, 2)
    with pytest.raises(ValueError, match="world: must be an integer >= 1"):
        bal.select(torch.tensor([3, 4]), 0, 0)
    with pytest.raises(ValueError, match="lengths: must be >= 0"):
        bal.plan(torch.tensor([3, -4]), 2)
    with pytest.raises(ValueError, match="global_batch_size"):
        BalancedBatchSampler(torch.ones(4, dtype=torch.long), 0, bal, rank=0, world=1)
    with pytest.raises(ValueError, match="1-D"):
        BalancedBatchSampler(torch.ones(4, 2, dtype=torch.long), 2, bal, rank=0, world=1)


def test_build_balancer_maps_the_config_modes():
    assert build_balancer("none", None) is None
    assert isinstance(build_balancer("collator", MODEL), CollatorBalancer)
    a2a = build_balancer("all_to_all", MODEL, max_per_rank=4, max_tokens_per_rank=99, allow_empty=False)
    assert isinstance(a2a, AllToAllBalancer)
    assert (a2a.max_per_rank, a2a.max_tokens_per_rank, a2a.allow_empty) == (4, 99, False)
    with pytest.raises(ValueError, match="mode: .*one of"):
        build_balancer("greedy", MODEL)
    with pytest.raises(ValueError, match="cost_model: required"):
        build_balancer("collator", None)
