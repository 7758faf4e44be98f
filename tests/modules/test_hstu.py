"""HSTU modules: the encoder's forward and every parameter's gradient against an independent float64
re-implementation of the HSTU equations (one sequence at a time, explicit LayerNorm / SiLU / mask
/ bias), plus API behaviour (JaggedTensor duck typing, validation, FLOP formula)."""

from __future__ import annotations

import math

import pytest
import torch

from torchrec_ascend import ops
from torchrec_ascend.modules import HSTUBlock, HSTUEncoder, InputPreprocessor, RelativeBias, hstu_flops


def _ln(x: torch.Tensor) -> torch.Tensor:
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + 1e-6)


def _silu(x: torch.Tensor) -> torch.Tensor:
    return x / (1 + torch.exp(-x))


def _mask(n: int, nt: int, c: int) -> torch.Tensor:
    m = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            if i == j or j < c:
                m[i, j] = 1
            elif i < c or i >= n - nt:          # contextual rows, targets: whole history
                m[i, j] = float(j < n - nt)
            else:
                m[i, j] = float(j < i)
    return m


def _bias(n: int, N: int, pos_w, ts_w, ts):
    idx_pos = torch.tensor([[N - 1 + j - i for j in range(n)] for i in range(n)])
    b = pos_w[idx_pos]
    if ts_w is not None:
        nb = ts_w.numel() - 1
        buckets = [[min(max(int(math.floor(math.log(max(abs(int(ts[min(i + 1, n - 1)]) - int(ts[j])), 1))
                                            / 0.301)), 0), nb) for j in range(n)] for i in range(n)]
        b = b + ts_w[torch.tensor(buckets)]
    return b


def reference_encoder(p, cfg, x, offsets, ts, num_targets):
    """float64 HSTU encoder from the paper's equations; ``p`` maps parameter names to tensors."""
    D, H, dqk, dv, N = cfg["D"], cfg["H"], cfg["dqk"], cfg["dv"], cfg["N"]
    out = []
    for b in range(offsets.numel() - 1):
        s0, s1 = int(offsets[b]), int(offsets[b + 1])
        n = s1 - s0
        if n == 0:
            continue
        nt = int(num_targets[b]) if num_targets is not None else 0
        h = x[s0:s1] * math.sqrt(D) + p["preprocessor.pos_emb.weight"][:n]
        mask = _mask(n, nt, cfg["c"])
        for layer in range(cfg["L"]):
            pre = f"stack.layers.{layer}."
            proj = _silu(_ln(h) @ p[pre + "uvqk"])
            u, v, q, k = torch.split(proj, [H * dv, H * dv, H * dqk, H * dqk], dim=1)
            bias = _bias(n, N, p[pre + "relative_bias.pos_w"], p.get(pre + "relative_bias.ts_w"),
                         ts[s0:s1] if ts is not None else None)
            heads = []
            for hh in range(H):
                qh, kh = q[:, hh * dqk:(hh + 1) * dqk], k[:, hh * dqk:(hh + 1) * dqk]
                vh = v[:, hh * dv:(hh + 1) * dv]
                s = cfg["alpha"] * qh @ kh.T + bias
                norm = n if cfg["norm"] == "seq_len" else N
                heads.append((_silu(s) / norm * mask) @ vh)
            a = _ln(torch.cat(heads, dim=1))
            h = (u * a) @ p[pre + "output.weight"].T + p[pre + "output.bias"] + h
        out.append(h / h.norm(dim=-1, keepdim=True))
    return torch.cat(out)


CONFIGS = [
    dict(norm="max_len", time=True, targets=False, c=0, alpha=None),
    dict(norm="seq_len", time=True, targets=True, c=0, alpha=0.5),
    dict(norm="max_len", time=False, targets=True, c=2, alpha=None),
]


@pytest.mark.parametrize("cfg_i", range(len(CONFIGS)))
def test_encoder_matches_float64_equations_fwd_and_every_grad(cfg_i):
    c = CONFIGS[cfg_i]
    D, H, dqk, dv, N, L = 16, 2, 8, 6, 12, 2
    torch.manual_seed(cfg_i)
    model = HSTUEncoder(D, L, H, dqk, dv, N, dropout=0.0, attn_alpha=c["alpha"],
                        normalization=c["norm"], use_time_bias=c["time"], num_time_buckets=10,
                        contextual_seq_len=c["c"])
    with torch.no_grad():  # non-trivial output linear bias and tables
        for name, prm in model.named_parameters():
            if name.endswith("output.bias") or "relative_bias" in name:
                prm.normal_(0, 0.3)
    lengths = torch.tensor([5, 0, 1, 12, 7])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    T = int(offsets[-1])
    x = torch.randn(T, D) * 0.3
    ts = torch.exp(torch.rand(T) * 10).long().cumsum(0)
    nt = torch.tensor([1, 0, 0, 3, 2]) if c["targets"] else None
    out = model(x, offsets, ts if c["time"] else None, nt)
    grad = torch.randn_like(out)
    out.backward(grad)

    p64 = {n: t.detach().double().requires_grad_(True) for n, t in model.named_parameters()}
    alpha = c["alpha"] if c["alpha"] is not None else 1 / math.sqrt(dqk)
    cfg = dict(D=D, H=H, dqk=dqk, dv=dv, N=N, L=L, c=c["c"], norm=c["norm"], alpha=alpha)
    expect = reference_encoder(p64, cfg, x.double(), offsets, ts if c["time"] else None, nt)
    expect.backward(grad.double())
    torch.testing.assert_close(out.double(), expect.detach(), rtol=1e-4, atol=1e-5)
    names = [n for n, _ in model.named_parameters()]
    assert any("ts_w" in n for n in names) == c["time"]
    for name, prm in model.named_parameters():
        assert prm.grad is not None, name
        torch.testing.assert_close(prm.grad.double(), p64[name].grad, rtol=2e-4, atol=2e-5,
                                   msg=lambda m, name=name: f"grad of {name}: {m}")


def test_jagged_tensor_duck_typing_and_backend_agreement():
    class FakeJT:  # what torchrec.JaggedTensor offers
        def __init__(self, v, o):
            self._v, self._o = v, o

        def values(self):
            return self._v

        def offsets(self):
            return self._o

    model = HSTUEncoder(8, 1, 2, 4, 4, 10, use_time_bias=False)
    offsets = torch.tensor([0, 3, 10])
    x = torch.randn(10, 8)
    a = model(x, offsets)
    b = model(FakeJT(x, offsets))
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a.norm(dim=-1), torch.ones(10))
    with ops.use_backend("reference", ops=["hstu_mha"], device="cpu"):
        torch.testing.assert_close(model(x, offsets), a, rtol=1e-5, atol=1e-6)


def test_validation_errors():
    model = HSTUEncoder(8, 1, 2, 4, 4, 6)
    offsets = torch.tensor([0, 3, 10])
    x = torch.randn(10, 8)
    with pytest.raises(ValueError, match="max_seq_len=6"):
        model(x, offsets, torch.arange(10))
    with pytest.raises(ValueError, match="timestamps"):
        model(x[:3], torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="item_embeddings"):
        model(torch.randn(3, 5), torch.tensor([0, 3]), torch.arange(3))
    with pytest.raises(ValueError, match="offsets: required"):
        model(x)
    with pytest.raises(ValueError, match="normalization"):
        HSTUBlock(8, 2, 4, 4, 6, normalization="softmax")
    with pytest.raises(ValueError, match="dropout"):
        HSTUBlock(8, 2, 4, 4, 6, dropout=1.0)


def test_building_blocks_shapes_and_dropout():
    pre = InputPreprocessor(4, 5, dropout=0.0)
    x = torch.randn(6, 4)
    off = torch.tensor([0, 2, 6])
    y = pre(x, off)
    pos = torch.tensor([0, 1, 0, 1, 2, 3])
    torch.testing.assert_close(y, x * 2.0 + pre.pos_emb.weight[pos])
    rb = RelativeBias(5, num_time_buckets=7)
    assert rb.pos_w.shape == (9,) and rb.ts_w.shape == (8,)
    model = HSTUEncoder(8, 1, 2, 4, 4, 10, dropout=0.5, use_time_bias=False)
    xx, oo = torch.randn(7, 8), torch.tensor([0, 7])
    model.train()
    assert not torch.allclose(model(xx, oo), model(xx, oo))  # dropout active
    model.eval()
    torch.testing.assert_close(model(xx, oo), model(xx, oo))


def test_flops_formula():
    off = torch.tensor([0, 3, 3, 7])
    D, H, dqk, dv, L = 16, 2, 8, 6, 3
    tokens, pairs = 7, 3 * 4 / 2 + 4 * 5 / 2
    per_layer = 2 * tokens * D * H * (2 * dv + 2 * dqk) + 2 * pairs * H * (dqk + dv) + 2 * tokens * H * dv * D
    assert hstu_flops(off, L, D, H, dqk, dv) == int(per_layer * L)
    model = HSTUEncoder(D, L, H, dqk, dv, 8)
    assert model.flops(off, backward=True) == int(3 * per_layer * L)
    assert model.flops_per_token(4) == pytest.approx(
        (2 * 4 * D * H * (2 * dv + 2 * dqk) + 2 * 10 * H * (dqk + dv) + 2 * 4 * H * dv * D) * L / 4)
