"""GenerativeRetrieval: padded table dims, the training loss against an independent float64
computation, action features, the global-row table initialisation."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("torchrec")

from torchrec_ascend.models import (GenerativeRetrieval, ModelConfig, SequenceBatch,  # noqa: E402
                                    action_features, init_item_table, item_kjt, query_positions)

TEMP = 0.1


def cfg(dim=10, **kw):
    return ModelConfig(embedding_dim=dim, num_layers=1, num_heads=1, attention_dim=4,
                       linear_dim=4, max_seq_len=8, dropout=0.0, **kw)


def batch(num_items=30, lengths=(3, 5, 2), r=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    t = int(lengths.sum())
    items = torch.randint(0, num_items, (t,), generator=g)
    off = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    off[1:] = torch.cumsum(lengths, 0)
    neg = torch.randint(0, num_items, (r,), generator=g)
    q = query_positions(off, t)
    return SequenceBatch(
        items=items, offsets=off, timestamps=torch.cumsum(torch.randint(1, 99, (t,), generator=g), 0),
        actions=torch.randint(0, 256, (t,), generator=g).to(torch.uint8),
        users=torch.arange(len(lengths)), kjt=item_kjt(items, lengths, neg),
        pos_log_q=torch.rand(t, generator=g), neg_log_q=torch.rand(r, generator=g),
        loss_scale=torch.tensor(1.0 / q.numel()))


def test_action_features():
    a = torch.tensor([0, 1, 130, 255], dtype=torch.uint8)
    want = torch.tensor([[(v >> i) & 1 for i in range(8)] for v in a.tolist()], dtype=torch.float32)
    assert torch.equal(action_features(a), want)


@pytest.mark.parametrize("dim", [10, 12])
def test_loss_matches_float64_reference_and_padding_is_inert(dim):
    torch.manual_seed(0)
    m = GenerativeRetrieval(30, cfg(dim), "hstu", temperature=TEMP, device=torch.device("cpu"))
    assert m.cfg.table_dim == (12 if dim == 10 else 12)
    w = m.ec.embeddings["item_table"].weight
    assert tuple(w.shape) == (30, m.cfg.table_dim)
    b = batch()
    loss, (value, stats) = m(b)
    # reference: the same encoder outputs, sampled softmax in float64 by hand
    emb = w[:, :dim]
    seq = m.head.encode(emb[b.items], b.offsets, b.timestamps, b.actions).double()
    q = query_positions(b.offsets, b.num_tokens)
    qn = torch.nn.functional.normalize(seq[q], dim=-1) / TEMP
    en = torch.nn.functional.normalize(emb.double(), dim=-1)
    pos_ids, neg = b.items[q + 1], b.kjt["neg"].values()
    pos = (qn * en[pos_ids]).sum(-1) - b.pos_log_q[q].double()
    negl = qn @ en[neg].t() - b.neg_log_q.double()
    negl = negl.masked_fill(neg[None, :] == pos_ids[:, None], -math.inf)
    ref = (torch.logsumexp(torch.cat([pos[:, None], negl], 1), 1) - pos).mean()
    assert loss.item() == pytest.approx(float(ref), rel=1e-5)
    assert stats[0] == q.numel() and stats[1] == b.num_tokens and stats[2] > 0
    loss.backward()
    if dim % 4:  # the padding columns never receive gradient
        assert torch.count_nonzero(w.grad[:, dim:]) == 0
    assert torch.count_nonzero(w.grad[:, :dim]) > 0


@pytest.mark.parametrize("encoder", ["hstu", "sasrec"])
def test_training_encodes_without_the_encoders_own_normalisation(encoder):
    """The training forward asks the encoder for its rows before its L2 normalisation (the loss
    normalises the query rows itself): those rows, normalised, are the unit-norm encoding (to fp32
    rounding), and they are not unit-norm themselves (the flag reaches the encoder)."""
    torch.manual_seed(0)
    m = GenerativeRetrieval(30, cfg(12), encoder, temperature=TEMP, device=torch.device("cpu"))
    m.eval()
    b = batch()
    emb = m.ec.embeddings["item_table"].weight[:, :12][b.items]
    unit = m.head.encode(emb, b.offsets, b.timestamps, b.actions)
    raw = m.head.encode(emb, b.offsets, b.timestamps, b.actions, unit_norm=False)
    torch.testing.assert_close(unit.norm(dim=-1), torch.ones(b.num_tokens), rtol=0, atol=1e-6)
    assert (raw.norm(dim=-1) - 1).abs().max() > 1e-2
    torch.testing.assert_close(torch.nn.functional.normalize(raw, dim=-1), unit, rtol=1e-6, atol=1e-6)


def test_init_item_table_is_a_function_of_the_global_row():
    m = GenerativeRetrieval(50, cfg(8), device=torch.device("cpu"))
    init_item_table(m, 50, 8, seed=3, block_rows=16)
    full = m.ec.embeddings["item_table"].weight.detach().clone()
    assert full.abs().max() <= (1 / 50) ** 0.5 and full.std() > 0
    # a "shard" of rows 20..37 initialised on its own gets the same rows
    class Shard:
        def __init__(self, t, r0):
            self.tensor, self.metadata = t, type("M", (), {"shard_offsets": [r0, 0]})()

    class Sharded:
        def __init__(self, shard):
            self._s = shard

        def local_shards(self):
            return [self._s]

    piece = torch.zeros(18, 8)

    class Holder(torch.nn.Module):
        def state_dict(self, *a, **k):
            return {"ec.embeddings.item_table.weight": Sharded(Shard(piece, 20))}

    init_item_table(Holder(), 50, 8, seed=3, block_rows=16)
    assert torch.equal(piece, full[20:38])
    init_item_table(m, 50, 8, seed=4, block_rows=16)
    assert not torch.equal(m.ec.embeddings["item_table"].weight, full)


def test_bf16_head_computes_in_bf16_with_fp32_weights_and_loss(monkeypatch):
    """compute_dtype=bf16: the HSTU kernel sees bf16 q/k/v and bias tables, parameters and
    their gradients stay fp32, the loss is fp32 and close to the fp32 model's (bf16 rounding:
    ~3 significant digits), but not equal to it (the bf16 path really ran)."""
    from torchrec_ascend.ops import hstu as hstu_ops

    seen = []
    real = hstu_ops.hstu_mha

    def spy(q, k, v, *a, **kw):
        seen.append((q.dtype, k.dtype, v.dtype, kw["pos_w"].dtype, kw["ts_w"].dtype))
        return real(q, k, v, *a, **kw)

    monkeypatch.setattr(hstu_ops, "hstu_mha", spy)
    torch.manual_seed(0)
    c = ModelConfig(embedding_dim=32, num_layers=2, num_heads=2, attention_dim=16,
                    linear_dim=16, max_seq_len=16, dropout=0.0)
    m32 = GenerativeRetrieval(40, c, "hstu", temperature=TEMP, device=torch.device("cpu"))
    m16 = GenerativeRetrieval(40, c, "hstu", temperature=TEMP, device=torch.device("cpu"),
                              compute_dtype=torch.bfloat16)
    m16.load_state_dict(m32.state_dict())
    b = batch(num_items=40, lengths=(9, 16, 4, 12), r=12, seed=1)
    out = {}
    for name, m in (("fp32", m32), ("bf16", m16)):
        seen.clear()
        loss, _ = m(b)
        loss.backward()
        out[name] = (loss.detach(), {n: p.grad.clone() for n, p in m.head.named_parameters()})
        want = torch.float32 if name == "fp32" else torch.bfloat16
        assert seen and all(dt == (want,) * 5 for dt in seen), seen
        assert loss.dtype == torch.float32
        assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32
                   for p in m.head.parameters())
    l32, g32 = out["fp32"]
    l16, g16 = out["bf16"]
    assert float(l16) == pytest.approx(float(l32), rel=1e-2)
    assert float(l16) != float(l32)
    for n, g in g32.items():
        rel = float((g16[n] - g).norm() / g.norm().clamp(min=1e-12))
        assert rel < 0.03, (n, rel)  # bf16 eps 2^-8; seen <= 0.009


def test_compute_dtype_is_checked():
    with pytest.raises(ValueError, match="compute_dtype: torch.float16 is not one of"):
        GenerativeRetrieval(10, cfg(8), device=torch.device("cpu"), compute_dtype=torch.float16)
