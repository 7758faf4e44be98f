"""Deterministic batches: the global batch, rank slices, the shared pool and the loss scale."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("torchrec")

from torchrec_ascend.distributed.load_balance import HSTUCostModel  # noqa: E402
from torchrec_ascend.sampling import PopularitySampler, step_generator  # noqa: E402
from torchrec_ascend.training.balancing import RankShare  # noqa: E402
from torchrec_ascend.training.config import ConfigError  # noqa: E402
from torchrec_ascend.training.retrieval.batches import (BatchBuilder, BatchOrder,  # noqa: E402
                                                        NegativeStream, Windows, distinct_ids)
from torchrec_ascend.training.retrieval.split import leave_two_out  # noqa: E402

from test_split import seqs  # noqa: E402


@pytest.fixture
def split():
    rng = np.random.default_rng(4)
    return leave_two_out(seqs(rng.integers(3, 30, 60).tolist(), seed=2, num_items=40))


def make_builder(split, rank=0, world=1, batch=8, sampler=None, num_negatives=12,
                 balance="none", ahead=False, negatives="shared"):
    """The BatchBuilder of max length 10, seed 7, from its parts."""
    cost = HSTUCostModel(1.0, 0.05) if balance != "none" else None
    return BatchBuilder(Windows(split, 10, batch * world, seed=7),
                        NegativeStream(sampler, num_negatives, negatives, seed=7, prefetch=False),
                        RankShare(balance, cost, rank, world, batch), ahead=ahead)


def builder(split, rank=0, world=1, batch=8, balance="none", ahead=False, negatives="shared"):
    counts = torch.from_numpy(split.item_counts()).float() + 1
    return make_builder(split, rank, world, batch, PopularitySampler(counts), 12, balance, ahead,
                        negatives)


def test_order_is_a_pure_function_of_seed_and_step(split):
    order = BatchOrder(split.trainable_users(), 8, seed=3)
    epoch = np.concatenate([order.global_users(s) for s in range(order.steps_per_epoch)])
    assert len(set(epoch.tolist())) == len(epoch)  # no user twice in an epoch
    assert set(epoch.tolist()) <= set(split.trainable_users().tolist())
    again = BatchOrder(split.trainable_users(), 8, seed=3)
    assert (again.global_users(order.steps_per_epoch + 2)
            == order.global_users(order.steps_per_epoch + 2)).all()
    with pytest.raises(ConfigError, match="train.batch_size: a global batch of 1000 users"):
        BatchOrder(split.trainable_users(), 1000, seed=0)


@pytest.mark.parametrize("balance", ["none", "collator"])
def test_rank_slices_partition_the_global_batch(split, balance):
    world = 2
    parts = [builder(split, r, world, batch=4, balance=balance) for r in range(world)]
    whole = builder(split, 0, 1, batch=8)
    for step in range(3):
        gb = whole.windows(step)
        g = torch.Generator().manual_seed(0)
        neg = whole.negatives.sampler.sample(gb.pos_ids, 12, g)
        one = whole.build(gb, neg)
        got = [p.build(p.windows(step), neg) for p in parts]
        assert sorted(torch.cat([b.users for b in got]).tolist()) == sorted(one.users.tolist())
        assert sum(b.num_tokens for b in got) == one.num_tokens
        for b in got:  # the loss scale is 1 / queries of the global batch, on every rank
            assert float(b.loss_scale) == pytest.approx(1.0 / gb.num_queries)
            assert torch.equal(b.kjt["neg"].values(), neg.ids)


def test_pos_log_q_and_queries(split):
    b = builder(split)
    gb = b.windows(0)
    neg = b.negatives.sampler.sample(gb.pos_ids, 12, torch.Generator().manual_seed(1))
    batch = b.build(gb, neg)
    lengths = torch.diff(batch.offsets)
    assert (lengths >= 2).all() and (lengths <= 10).all()
    want = torch.zeros(batch.num_tokens)
    log_q = b.negatives.sampler.log_prob(batch.items).float() + np.log(12)
    for s, e in zip(batch.offsets[:-1].tolist(), batch.offsets[1:].tolist()):
        want[s:e - 1] = log_q[s + 1:e]  # token i's next item
    torch.testing.assert_close(batch.pos_log_q, want, atol=1e-5, rtol=1e-5)


def test_stream_resumed_equals_continued(split):
    full = [x.kjt["neg"].values() for x in builder(split).stream(0, 6)]
    b = builder(split)
    first = [x.kjt["neg"].values() for x in b.stream(0, 3)]
    rest = [x.kjt["neg"].values() for x in builder(split).stream(3, 6)]
    assert all(torch.equal(a, c) for a, c in zip(full, first + rest))
    # the pool of step s is the sampler's draw with step_generator(seed, s)
    gb = b.windows(4)
    assert torch.equal(full[4], b.negatives.sampler.sample(gb.pos_ids, 12, step_generator(7, 4)).ids)


def test_all_to_all_builds_one_step_ahead_on_a_worker_and_delivers_the_same_batches(split):
    """balance_ahead: every batch is built (and balanced) on the worker thread, one step
    ahead; the batches equal the inline ones, also across a resumed stream."""
    import threading

    inline = builder(split, balance="all_to_all")
    want = [(x.items, x.offsets, x.users, x.kjt["neg"].values()) for x in inline.stream(0, 5)]
    ahead = builder(split, balance="all_to_all", ahead=True)
    threads = []
    real = ahead.share.balancer.balance
    ahead.share.balancer.balance = lambda *a, **k: threads.append(threading.current_thread().name) or real(*a, **k)
    got = []
    try:
        for a, b in ((0, 2), (2, 5)):
            for x in ahead.stream(a, b):
                got.append((x.items, x.offsets, x.users, x.kjt["neg"].values()))
                assert ahead.last_balanced is not None and ahead.ahead.last_wait_s >= 0
                assert ahead.last_balance_s > 0 and ahead.last_balance_cpu_s >= 0
                assert torch.equal(ahead.last_balanced.lengths, torch.diff(x.offsets))
    finally:
        ahead.close()
    assert len(got) == len(want) == 5
    for g, w in zip(got, want):
        assert all(torch.equal(p, q) for p, q in zip(g, w))
    assert len(threads) == 5 and all(t.startswith("batch-ahead") for t in threads)
    assert inline.ahead.last_wait_s is None  # inline: nothing to wait for
    with pytest.raises(ValueError, match="balance_ahead: needs balance='all_to_all', got 'none'"):
        builder(split, ahead=True)


def _query_keys(batch):
    """(user, position in the window) of every query of a batch, in token order."""
    keys = []
    for u, a, b in zip(batch.users.tolist(), batch.offsets[:-1].tolist(), batch.offsets[1:].tolist()):
        keys += [(u, i) for i in range(b - a - 1)]
    return keys


@pytest.mark.parametrize("balance", ["none", "collator"])
def test_per_position_rows_follow_their_queries(split, balance):
    """Per-position negatives: each rank's queries get exactly the rows the global sample drew
    for them (the distinct ids in ``neg``, ``neg_index`` into them), from the stream's step
    generator; the union over ranks is the global sample."""
    whole = builder(split, negatives="per_position")
    parts = [builder(split, r, 2, batch=4, balance=balance, negatives="per_position")
             for r in range(2)]
    streams = [list(p.stream(0, 3)) for p in parts]
    for step, one in enumerate(whole.stream(0, 3)):
        gb = whole.windows(step)
        want = whole.negatives.sampler.sample_per_token(gb.pos_ids, 12, step_generator(7, step))
        pool = one.kjt["neg"].values()
        assert torch.equal(pool, torch.unique(pool))  # distinct ids, each looked up once
        assert one.neg_index.shape == (gb.num_queries, 12)
        assert torch.equal(pool[one.neg_index], want.ids)
        torch.testing.assert_close(one.neg_log_q, want.log_q)
        by_key = dict(zip(_query_keys(one), want.ids))
        seen = 0
        for rank_batches in streams:
            b = rank_batches[step]
            ids = b.kjt["neg"].values()[b.neg_index]
            for key, row in zip(_query_keys(b), ids):
                assert torch.equal(row, by_key[key]), key
                seen += 1
            assert float(b.loss_scale) == pytest.approx(1.0 / gb.num_queries)
        assert seen == gb.num_queries
    with pytest.raises(ValueError, match=r"negatives: 'x' is not one of \['shared', 'per_position'\]"):
        builder(split, negatives="x")


def test_per_position_through_all_to_all_matches_none(split):
    """The per-query rows travel with their tokens through the all_to_all balancer (world 1:
    it reorders nothing): the same batches as without it."""
    a = list(builder(split, negatives="per_position").stream(0, 2))
    b = list(builder(split, balance="all_to_all", negatives="per_position").stream(0, 2))
    for x, y in zip(a, b):
        ix = x.kjt["neg"].values()[x.neg_index]
        iy = y.kjt["neg"].values()[y.neg_index]
        assert torch.equal(x.items, y.items) and torch.equal(ix, iy)


class _Lookup:
    def __init__(self, values: torch.Tensor) -> None:
        self._v = values

    def values(self) -> torch.Tensor:
        return self._v


def test_per_position_gradients_sum_over_ranks(split):
    """The model's head on each rank's per-position batch (its distinct ids looked up from a
    plain table): the ranks' gradients of the table and of the dense part sum to the
    single-process gradient of the global batch."""
    from torchrec_ascend.models.config import ModelConfig
    from torchrec_ascend.models.generative_retrieval import SequenceHead
    from torchrec_ascend.sampling import UniformSampler

    torch.manual_seed(0)
    cfg = ModelConfig(embedding_dim=8, num_layers=1, num_heads=2, attention_dim=4, linear_dim=4,
                      max_seq_len=10, dropout=0.0)
    head = SequenceHead(cfg, "hstu", 0.05)
    table = torch.randn(split.num_items, cfg.table_dim, generator=torch.Generator().manual_seed(1))

    def grads(world):
        g_table = torch.zeros(table.shape, dtype=torch.float64)
        g_dense = [torch.zeros(p.shape, dtype=torch.float64) for p in head.parameters()]
        for rank in range(world):
            b = make_builder(split, rank, world, 8 // world, UniformSampler(split.num_items), 16,
                             negatives="per_position")
            batch = next(iter(b.stream(2, 3)))
            b.close()
            t = table.clone().requires_grad_(True)
            lookups = {f: _Lookup(t[batch.kjt[f].values()]) for f in ("item", "neg")}
            head.zero_grad()
            head(lookups, batch)[0].backward()
            g_table += t.grad.double()
            for acc, p in zip(g_dense, head.parameters()):
                acc += p.grad.double()
        return g_table, g_dense

    (t1, d1), (t2, d2) = grads(1), grads(2)
    assert t1.abs().max() > 0
    torch.testing.assert_close(t2, t1, rtol=1e-5, atol=1e-6)
    for a, b in zip(d2, d1):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_distinct_ids_equal_torch_unique():
    g = torch.Generator().manual_seed(5)
    for shape, n in (((7, 5), 9), ((0, 3), 4), ((40, 16), 1000)):
        ids = torch.randint(n, shape, generator=g)
        uniq, inv = distinct_ids(ids, n)
        want_u, want_inv = torch.unique(ids, return_inverse=True)
        assert torch.equal(uniq, want_u) and torch.equal(inv, want_inv)
