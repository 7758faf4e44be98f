"""SASRec on a jagged batch equals each sequence run alone (padding never leaks in)."""

from __future__ import annotations

import torch

from torchrec_ascend.models.sasrec import SASRecEncoder


def test_jagged_batch_equals_sequences_alone():
    torch.manual_seed(0)
    enc = SASRecEncoder(8, num_layers=2, num_heads=2, ffn_dim=16, max_seq_len=7).eval()
    lengths = [3, 7, 1, 5]
    off = torch.tensor([0] + torch.cumsum(torch.tensor(lengths), 0).tolist())
    x = torch.randn(int(off[-1]), 8)
    with torch.no_grad():
        out = enc(x, off)
        for b, n in enumerate(lengths):
            s, e = int(off[b]), int(off[b + 1])
            alone = enc(x[s:e], torch.tensor([0, n]))
            torch.testing.assert_close(out[s:e], alone, atol=1e-5, rtol=1e-5)
            # causal: changing a later token leaves earlier outputs alone
            if n > 1:
                y = x[s:e].clone()
                y[-1] += 1.0
                changed = enc(y, torch.tensor([0, n]))
                torch.testing.assert_close(changed[:-1], alone[:-1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(len(x)), atol=1e-5, rtol=0)
