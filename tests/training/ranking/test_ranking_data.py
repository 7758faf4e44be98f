"""Ranking data and batches: the time split by calendar days, example windows (and a refit's
train+valid ones), histories only from the past, no label or outcome of a candidate in the
input, token layouts, rank shares, the CTR baseline's rates."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("torchrec")

from torchrec_ascend.models.generative_ranker import (ROLE_CANDIDATE, ROLE_HISTORY,  # noqa: E402
                                                      split_key)
from torchrec_ascend.testing.ranking_data import DAY_MS, spec_of, tiny_ranking_data  # noqa: E402
from torchrec_ascend.training.balancing import RankShare  # noqa: E402
from torchrec_ascend.training.ranking.baselines import ctr_scores  # noqa: E402
from torchrec_ascend.training.ranking.batches import ExampleBuilder, RankingBatches  # noqa: E402
from torchrec_ascend.training.ranking.data import TaskSpec, TimeSplit, kuairand_tasks  # noqa: E402

DAY = DAY_MS


@pytest.fixture
def data(tmp_path):
    return tiny_ranking_data(str(tmp_path))


def test_time_split_by_local_calendar_days(data):
    day = (data.times + 8 * 3_600_000) // DAY
    last = np.unique(day)
    assert (data.period[day == last[-1]] == 2).all() and (data.period[day == last[-2]] == 1).all()
    assert (data.period[day < last[-2]] == 0).all()
    assert data.split_days["test"] == [str(np.datetime64(int(last[-1]), "D"))]
    with pytest.raises(ValueError, match="calendar day"):
        TimeSplit(3, 3, 8.0).periods(data.times, "x")


def test_examples_windows_and_histories(data):
    owner = data.user_of_events()
    for which, p in (("train", 0), ("valid", 1), ("test", 2)):
        ex = data.examples(which, max_candidates=3, max_history=4)
        got = np.concatenate([np.arange(s, e) for s, e in zip(ex.start, ex.end)]) \
            if len(ex) else np.zeros(0, int)
        assert sorted(got.tolist()) == np.flatnonzero(data.period == p).tolist()  # each once
        assert (ex.num_candidates >= 1).all() and (ex.num_candidates <= 3).all()
        for u, h, s, e in zip(ex.user, ex.hist_start, ex.start, ex.end):
            assert (owner[h:e] == u).all()  # one user's events
            assert data.offsets[u] <= h and s - h == min(4, s - data.offsets[u])
            assert data.times[h:s].max(initial=0) <= data.times[s:e].min()  # only the past


@pytest.mark.parametrize("layout", ["summed", "interleaved"])
def test_batches_hide_candidate_labels_and_outcomes(data, layout):
    spec = spec_of(data)
    b = ExampleBuilder(data, spec, "hstu", layout)
    ex = data.examples("test", 3, 5)
    batch = b.build(ex, 0.5)
    hist = ex.history_lengths
    want = spec.contextual_tokens + hist * (2 if layout == "interleaved" else 1) + ex.num_candidates
    assert torch.equal(torch.diff(batch.offsets), torch.from_numpy(want))
    assert torch.equal(batch.num_targets, torch.from_numpy(ex.num_candidates))
    role = batch.item_role.numpy()
    assert (batch.item_actions.numpy()[role == ROLE_CANDIDATE] == 0).all()
    cand_events = np.concatenate([np.arange(s, e) for s, e in zip(ex.start, ex.end)])
    np.testing.assert_array_equal(batch.labels.numpy(), data.labels(cand_events))
    hist_events = np.concatenate([np.arange(h, s) for h, s in zip(ex.hist_start, ex.start)])
    np.testing.assert_array_equal(batch.item_actions.numpy()[role == ROLE_HISTORY],
                                  data.actions[hist_events])
    kjt = batch.kjt.to_dict()
    play = next(c for c in data.context if c.name == "play_time_ms")
    vals = kjt["ctx__play_time_ms"].values().numpy()
    assert (vals[role == ROLE_CANDIDATE] == 0).all()  # an outcome is never a candidate's input
    np.testing.assert_array_equal(vals[role == ROLE_HISTORY], play.codes[hist_events])
    # every item token sits at its position, candidates last in their sequence
    pos = batch.item_pos.numpy()
    assert len(set(pos.tolist())) == len(pos)
    ends = batch.offsets.numpy()[1:]
    cand_pos = pos[role == ROLE_CANDIDATE]
    assert (np.isin(ends - 1, cand_pos)).all()
    if layout == "interleaved":
        assert torch.equal(batch.action_pos, batch.item_pos[batch.action_item] + 1)
        assert (role[batch.action_item.numpy()] == ROLE_HISTORY).all()
    else:
        assert batch.action_pos.numel() == 0


def test_dlrm_batches_are_the_candidates(data):
    spec = spec_of(data)
    ex = data.examples("valid", 3, 5)
    batch = ExampleBuilder(data, spec, "dlrm").build(ex, 1.0)
    cand = np.concatenate([np.arange(s, e) for s, e in zip(ex.start, ex.end)])
    kjt = batch.kjt.to_dict()
    assert "ctx__play_time_ms" not in kjt  # no outcome for a candidate
    np.testing.assert_array_equal(kjt["item"].values().numpy(), data.items[cand])
    np.testing.assert_array_equal(batch.labels.numpy(), data.labels(cand))
    assert batch.dense.shape == (len(cand), 1 + 3)  # constant + hour, tab, duration


@pytest.mark.parametrize("mode", ["none", "collator", "all_to_all"])
def test_rank_shares_partition_the_global_batch(data, mode):
    from torchrec_ascend.distributed.load_balance import HSTUCostModel

    spec = spec_of(data)
    b = ExampleBuilder(data, spec, "hstu")
    ex = data.examples("train", 2, 5)
    cost = HSTUCostModel(1.0, 0.05) if mode != "none" else None
    whole = RankingBatches(b, ex, 4, seed=3, share=RankShare("none", None, 0, 1, 4))
    rows = whole.global_rows(1)
    one = next(iter(whole.stream(1, 2)))
    if mode == "all_to_all":  # world 1: the exchange moves nothing
        parts = [next(iter(RankingBatches(b, ex, 4, 3, RankShare(mode, cost, 0, 1, 4)).stream(1, 2)))]
    else:
        parts = [next(iter(RankingBatches(b, ex, 4, 3, RankShare(mode, cost, r, 2, 2)).stream(1, 2)))
                 for r in range(2)]
    got = sorted(np.concatenate([p.users.numpy() for p in parts]).tolist())
    assert got == sorted(one.users.tolist()) == sorted(ex.user[rows].tolist())
    for p in parts:  # 1 / the candidates of the global batch, on every rank
        assert float(p.loss_scale) == pytest.approx(1.0 / ex.num_candidates[rows].sum())


def test_balance_ahead_builds_on_a_worker_and_delivers_the_inline_batches(data):
    """balance_ahead: each batch is built one step ahead on the worker thread; the batches equal
    the inline ones, also across a resumed stream; only all_to_all may build ahead."""
    import threading

    from torchrec_ascend.distributed.load_balance import HSTUCostModel

    b = ExampleBuilder(data, spec_of(data), "hstu")
    ex = data.examples("train", 2, 5)
    cost = HSTUCostModel(1.0, 0.05)
    inline = RankingBatches(b, ex, 4, 3, RankShare("all_to_all", cost, 0, 1, 4))
    want = [(x.users, x.labels, x.kjt["item"].values()) for x in inline.stream(0, 4)]
    ahead = RankingBatches(b, ex, 4, 3, RankShare("all_to_all", cost, 0, 1, 4), ahead=True)
    threads = []
    real = ahead.builder.build
    ahead.builder.build = lambda *a: threads.append(threading.current_thread().name) or real(*a)
    got = []
    try:
        for start, stop in ((0, 1), (1, 4)):
            for x in ahead.stream(start, stop):
                got.append((x.users, x.labels, x.kjt["item"].values()))
                assert ahead.ahead.last_wait_s >= 0
    finally:
        ahead.close()
    assert len(got) == len(want) == 4
    for g, w in zip(got, want):
        assert all(torch.equal(p, q) for p, q in zip(g, w))
    assert len(threads) == 4 and all(t.startswith("batch-ahead") for t in threads)
    assert inline.ahead.last_wait_s is None
    with pytest.raises(ValueError, match="balance_ahead: needs balance='all_to_all', got 'none'"):
        RankingBatches(b, ex, 4, 3, RankShare("none", None, 0, 1, 4), ahead=True)


def test_sample_tasks_are_named_by_its_columns():
    names = [t.name for t in kuairand_tasks(["sample"])]
    assert "label" in names and "is_hate" not in names and "is_like" not in names
    assert [t.name for t in kuairand_tasks(["official"])] == [
        "is_click", "is_like", "is_follow", "is_comment", "is_forward", "is_hate", "long_view",
        "is_profile_enter"]
    assert TaskSpec("x", 6).labels(np.array([64, 0, 65], dtype=np.uint8)).tolist() == [1, 0, 1]
    assert split_key("ctx__tab") == ("ctx", "tab")


@pytest.mark.parametrize("kind", ["hstu", "dlrm"])
def test_user_statistics_reach_candidates_as_of_their_windows_start(data, kind):
    """ranking.user_stats: each token's user statistics count the user's own impressions
    strictly before it (a float64 loop), a candidate's those before its window's first candidate:
    flipping every label of a window's candidates leaves all of that window's inputs unchanged."""
    import math

    from torchrec_ascend.training.ranking.item_stats import STATS_COUNT_SCALE

    users = data.user_of_events()
    lab = data.labels(np.arange(data.num_events)).astype(np.float64)
    prior = lab[data.period == 0].mean(axis=0)
    got = data.user_statistics(3.0)
    for e in range(0, data.num_events, 7):
        before = (users == users[e]) & (data.times < data.times[e])
        n = int(before.sum())
        assert got[e, 0] == pytest.approx(math.log1p(n) / STATS_COUNT_SCALE, abs=1e-6)
        for k in range(lab.shape[1]):
            r = (lab[before, k].sum() + 3.0 * prior[k]) / (n + 3.0)
            want = math.log(r / (1 - r)) - math.log(prior[k] / (1 - prior[k]))
            assert got[e, 1 + k] == pytest.approx(want, abs=1e-5)

    items = data.item_statistics(3.0)
    spec = spec_of(data)
    spec.item_stats = items.shape[1] + got.shape[1]
    ex = data.examples("test", 3, 5) if kind == "hstu" else data.examples("test", 1, 0)
    batch = ExampleBuilder(data, spec, kind, "summed", items, got).build(ex, 1.0)
    stats = (batch.item_stats if kind == "hstu" else batch.dense[:, -spec.item_stats:]).numpy()
    if kind == "hstu":
        events = np.concatenate([np.arange(h, e) for h, e in zip(ex.hist_start, ex.end)])
        as_of = np.concatenate([np.r_[np.arange(h, s), np.full(e - s, s)]
                                for h, s, e in zip(ex.hist_start, ex.start, ex.end)])
    else:
        events = as_of = np.concatenate([np.arange(s, e) for s, e in zip(ex.start, ex.end)])
    np.testing.assert_array_equal(stats[:, :items.shape[1]], items[events])
    np.testing.assert_array_equal(stats[:, items.shape[1]:], got[as_of])
    # a window's candidates' labels flipped: the user statistics of its tokens stay the same
    offsets = np.r_[0, np.cumsum(ex.end - ex.hist_start if kind == "hstu" else ex.end - ex.start)]
    saved = data.actions.copy()
    changed = 0
    for w in range(0, len(ex), max(1, len(ex) // 8)):
        try:
            data.actions[ex.start[w]:ex.end[w]] = ~data.actions[ex.start[w]:ex.end[w]]
            flipped = data.user_statistics(3.0)
        finally:
            data.actions[:] = saved
        rows = as_of[offsets[w]:offsets[w + 1]]
        np.testing.assert_array_equal(flipped[rows], got[rows])
        changed += not np.array_equal(flipped, got)  # a later impression's statistics moved
    assert changed > 0


def test_train_plus_valid_examples_cover_both_splits_once(data):
    owner = data.user_of_events()
    ex = data.examples("train+valid", max_candidates=3, max_history=5)
    got = np.concatenate([np.arange(s, e) for s, e in zip(ex.start, ex.end)])
    want = np.flatnonzero((data.period == 0) | (data.period == 1))
    assert sorted(got.tolist()) == want.tolist() and len(want) > len(data.events_of("train"))
    for u, h, s, e in zip(ex.user, ex.hist_start, ex.start, ex.end):
        assert (owner[h:e] == u).all() and data.times[h:s].max(initial=0) <= data.times[s:e].min()


@pytest.mark.parametrize("fit_on", ["train", "train+valid"])
def test_ctr_rates_over_the_chosen_days_equal_a_float64_loop(data, fit_on):
    def logit(q: float) -> float:
        return math.log(q / (1 - q))

    k = 3.0
    periods = {"train": (0,), "train+valid": (0, 1)}[fit_on]
    owner = data.user_of_events()
    labels = data.labels(np.arange(data.num_events)).astype(np.float64)
    fit = [i for i in range(data.num_events) if data.period[i] in periods]
    test = [i for i in range(data.num_events) if data.period[i] == 2]
    got = ctr_scores(data, "test", k, fit_on)
    for t in range(len(data.tasks)):
        p = sum(labels[i, t] for i in fit) / len(fit)
        for row, i in enumerate(test):
            rates = []
            for key in (lambda j: owner[j], lambda j: data.items[j]):
                pos = sum(labels[j, t] for j in fit if key(j) == key(i))
                n = sum(1 for j in fit if key(j) == key(i))
                rates.append((pos + k * p) / (n + k))
            z = logit(rates[0]) + logit(rates[1]) - logit(p)
            assert got[row, t] == pytest.approx(1 / (1 + math.exp(-z)), rel=1e-6)
