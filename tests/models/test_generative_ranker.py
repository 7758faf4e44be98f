"""The HSTU ranker's model: candidates see the history and themselves only (changing another
candidate, or a candidate's own labels, changes no other score; changing the history does), the
summed and interleaved layouts, gradients reach every part, bf16 compute stays close to fp32."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("torchrec")

from torchrec_ascend.models import ModelConfig  # noqa: E402
from torchrec_ascend.models.generative_ranker import GenerativeRanker, RankerSpec  # noqa: E402
from torchrec_ascend.training.ranking.batches import ExampleBuilder  # noqa: E402

from torchrec_ascend.testing.ranking_data import spec_of, tiny_ranking_data  # noqa: E402


@pytest.fixture
def data(tmp_path):
    return tiny_ranking_data(str(tmp_path))

CFG = ModelConfig(embedding_dim=8, num_layers=2, num_heads=2, attention_dim=4, linear_dim=4,
                  max_seq_len=32, dropout=0.0)


def model(spec, layout="summed", dtype=torch.float32):
    torch.manual_seed(0)
    m = GenerativeRanker(spec, CFG, [1.0, 2.0], layout, [8], device=torch.device("cpu"),
                         compute_dtype=dtype)
    for p in m.ec.parameters():  # TorchRec leaves the tables uninitialised on cpu
        torch.nn.init.normal_(p, 0.0, 0.3)
    return m


def one_example(data, k=3):
    ex = data.examples("test", k, 10)
    rows = np.flatnonzero((ex.num_candidates == k) & (ex.history_lengths >= 2))
    return ex.take(rows[:1])


@pytest.mark.parametrize("layout", ["summed", "interleaved"])
def test_candidates_see_history_and_themselves_only(data, layout):
    spec = spec_of(data)
    m = model(spec, layout)
    b = ExampleBuilder(data, spec, "hstu", layout)
    ex = one_example(data)
    base = b.build(ex, 1.0)
    want = m.predict(base)
    # another candidate's item replaced: candidate 0's scores do not move, its own do
    kjt = base.kjt.to_dict()
    item = kjt["item"].values().clone()
    last = int(base.item_pos.numel()) - 1  # the last candidate's item token
    item[last] = (item[last] + 1) % spec.num_items
    changed = _with_feature(base, "item", item)
    got = m.predict(changed)
    torch.testing.assert_close(got[:-1], want[:-1], rtol=0, atol=1e-6)
    assert (got[-1] - want[-1]).abs().max() > 1e-5
    # the candidates' labels are not inputs
    relabeled = _replace(base, labels=1 - base.labels)
    torch.testing.assert_close(m.predict(relabeled), want, rtol=0, atol=0)
    # a history item replaced: every candidate moves
    item = kjt["item"].values().clone()
    item[0] = (item[0] + 1) % spec.num_items
    moved = m.predict(_with_feature(base, "item", item))
    assert ((moved - want).abs().amax(1) > 1e-6).all()


def _replace(batch, **fields):
    import dataclasses

    return dataclasses.replace(batch, **fields)


def _with_feature(batch, key, values):
    from torchrec import KeyedJaggedTensor

    d = batch.kjt.to_dict()
    keys = batch.kjt.keys()
    vals = torch.cat([values if k == key else d[k].values() for k in keys])
    lengths = torch.cat([d[k].lengths() for k in keys])
    return _replace(batch, kjt=KeyedJaggedTensor.from_lengths_sync(keys, vals, lengths))


def test_gradients_reach_every_part_and_bf16_is_close(data):
    spec = spec_of(data)
    m = model(spec)
    b = ExampleBuilder(data, spec, "hstu")
    ex = data.examples("train", 3, 10)
    batch = b.build(ex, 1.0 / float(ex.num_candidates.sum()))
    loss, (value, stats) = m(batch)
    loss.backward()
    for name, p in m.named_parameters():
        if name.startswith("ec."):
            assert p.grad is not None, name
        elif "role" not in name:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert stats[0] == batch.num_candidates and stats[2] > 0
    bf = model(spec, dtype=torch.bfloat16)
    seen = []
    real = bf.head.encoder.stack.layers[0].forward

    def spy(x, *a, **k):  # the encoder's matmuls run in bf16 under the model's autocast
        out = real(x, *a, **k)
        seen.append(torch.is_autocast_enabled("cpu") and
                    torch.get_autocast_dtype("cpu") == torch.bfloat16)
        return out

    bf.head.encoder.stack.layers[0].forward = spy
    loss_bf, _ = bf(batch)
    assert seen == [True]
    assert float(loss_bf.detach()) == pytest.approx(float(loss.detach()), rel=2e-2)


def test_spec_tables_and_keys():
    spec = RankerSpec(10, 5, user_features={"age": 4}, item_features={"author_id": 7},
                      context={"tab": 3, "play_time_ms": 9}, outcomes=("play_time_ms",))
    assert spec.contextual_tokens == 2
    assert spec.tables() == {"item": (10, ["item"]), "user": (5, ["user"]),
                             "user__age": (4, ["user__age"]),
                             "item__author_id": (7, ["item__author_id"]),
                             "ctx__tab": (3, ["ctx__tab"]),
                             "ctx__play_time_ms": (9, ["ctx__play_time_ms"])}


def test_watch_time_target_and_loss_against_a_float64_formula(data):
    """The watch-time target is log1p(play_time_ms / 1000) of each event (read back from the
    log file); both ranking models' loss = sum of weighted BCE + weight x squared error over
    the known targets, x loss_scale (float64, written out)."""
    import csv

    from torchrec_ascend.models.dlrm_ranker import DLRMRanker

    with open(data.source) as f:
        play = {(int(r["user_id"]), int(r["time_ms"])): int(r["play_time_ms"])
                for r in csv.DictReader(f)}
    owner = data.user_of_events()
    want = [np.log1p(play[(int(data.user_ids[u]), int(t))] / 1000.0)
            for u, t in zip(owner, data.times)]
    np.testing.assert_allclose(data.watch_time, want, rtol=1e-6)

    spec = spec_of(data)
    targets = data.watch_time.copy()
    ex = data.examples("train", 3, 10)
    first = int(ex.start[0])
    targets[first] = np.nan  # an unknown target adds nothing
    for kind in ("hstu", "dlrm"):
        torch.manual_seed(0)
        if kind == "hstu":
            m = GenerativeRanker(spec, CFG, [1.0, 2.0], "summed", [8], device=torch.device("cpu"),
                                 target_weight=0.5)
        else:
            m = DLRMRanker(spec, 8, [1.0, 2.0], [8], [8], device=torch.device("cpu"),
                           target_weight=0.5)
        for p in (m.ec if kind == "hstu" else m.dlrm.sparse_arch).parameters():
            torch.nn.init.normal_(p, 0.0, 0.3)
        b = ExampleBuilder(data, spec, kind, targets=targets)
        batch = b.build(ex, 0.01)
        assert batch.targets.shape == (batch.num_candidates, 1)
        loss, _ = m(batch)
        out = m.predict(batch).double().detach().numpy()
        assert out.shape == (batch.num_candidates, 3)
        y = batch.labels.double().numpy()
        prob = 1 / (1 + np.exp(-out[:, :2]))
        bce = -(y * np.log(prob) + (1 - y) * np.log(1 - prob))
        t = batch.targets[:, 0].double().numpy()
        known = np.isfinite(t)
        assert (~known).sum() == 1
        se = ((out[known, 2] - t[known]) ** 2).sum()
        expect = ((bce * [1.0, 2.0]).sum() + 0.5 * se) * 0.01
        assert float(loss.detach()) == pytest.approx(expect, rel=1e-5), kind


@pytest.mark.parametrize("head_stats", [False, True])
def test_head_stats_feed_the_raw_statistics_to_the_task_mlp(data, head_stats):
    """With the statistics' projection zeroed, the scores depend on the statistics only through
    the wide input (ranking.head_stats)."""
    spec = spec_of(data)
    spec.item_stats = 3
    torch.manual_seed(0)
    m = GenerativeRanker(spec, CFG, [1.0, 2.0], "summed", [8], device=torch.device("cpu"),
                         head_stats=head_stats)
    for p in m.ec.parameters():
        torch.nn.init.normal_(p, 0.0, 0.3)
    with torch.no_grad():
        m.head.stats_proj.weight.zero_()
        m.head.stats_proj.bias.zero_()
    base = CFG.embedding_dim * spec.head_vectors()
    v = spec.head_vectors()
    assert m.head.tasks.dims[0] == base + v * (v - 1) // 2 + (3 if head_stats else 0)
    rng = np.random.default_rng(1)
    stats = rng.normal(size=(data.num_events, 3)).astype(np.float32)
    ex = data.examples("train", 3, 10)
    a = ExampleBuilder(data, spec, "hstu", item_stats=stats).build(ex, 1.0)
    b = ExampleBuilder(data, spec, "hstu", item_stats=stats * 2).build(ex, 1.0)
    m.eval()
    differ = not torch.allclose(m.predict(a), m.predict(b), atol=1e-6)
    assert differ == head_stats
