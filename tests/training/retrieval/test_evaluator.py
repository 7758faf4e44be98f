"""The evaluator against brute-force oracles (pessimistic ranks, history filtering), the
request token's item never reaching the query (no leak), and NaN scores as errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("torchrec")

from torchrec_ascend.metrics import NonFiniteScoreError, metrics_from_ranks  # noqa: E402
from torchrec_ascend.models import GenerativeRetrieval, ModelConfig  # noqa: E402
from torchrec_ascend.training.retrieval.evaluator import Evaluator  # noqa: E402
from torchrec_ascend.training.retrieval.split import leave_two_out  # noqa: E402

from test_split import seqs  # noqa: E402

KS = (1, 5, 20)


@pytest.fixture
def split():
    rng = np.random.default_rng(5)
    return leave_two_out(seqs(rng.integers(3, 20, 30).tolist(), seed=3, num_items=25))


def oracle_ranks(scores: np.ndarray, split, users, which):
    """Pessimistic rank by a loop: candidates not in the history scoring >= the target; a
    target in the history (filtered with it) ranks after every other item."""
    ranks = []
    for row, u in enumerate(users):
        hist, _ = split.history(np.array([u]), which)
        tgt = int(split.targets(np.array([u]), which)[0])
        banned = set(hist.tolist())
        if tgt in banned:
            ranks.append(scores.shape[1] - 1)
            continue
        ranks.append(sum(1 for j in range(scores.shape[1])
                         if j != tgt and j not in banned and scores[row, j] >= scores[row, tgt]))
    return ranks


@pytest.mark.parametrize("which", ["valid", "test"])
def test_most_popular_matches_oracle(split, which):
    users = np.arange(split.num_users)
    got = Evaluator(split, 8, KS, batch_size=7).most_popular(which, users)
    counts = split.item_counts().astype(np.float64)
    want = metrics_from_ranks(oracle_ranks(np.tile(counts, (len(users), 1)), split, users,
                                           which), KS)
    assert got == pytest.approx(want, abs=1e-12)


def model(split, dim=6):
    torch.manual_seed(0)
    cfg = ModelConfig(embedding_dim=dim, num_layers=1, num_heads=1, attention_dim=4,
                      linear_dim=4, max_seq_len=8, dropout=0.0)
    return GenerativeRetrieval(split.num_items, cfg, "hstu", device=torch.device("cpu"))


@pytest.mark.parametrize("which", ["valid", "test"])
@torch.no_grad()
def test_model_metrics_match_oracle_and_request_item_does_not_leak(split, which):
    m = model(split)
    ev = Evaluator(split, 8, KS, batch_size=4)
    users = np.arange(split.num_users)
    got = ev.evaluate(m, which, users, torch.device("cpu"))
    # oracle: encode each user alone, float64 cosine scores
    table = ev.item_table(m, torch.device("cpu")).double()
    cand = table / table.norm(dim=1, keepdim=True)
    rows, rows_leak = [], []
    for u in users:
        items, times, acts, off, q = split.eval_inputs(np.array([u]), which, 8)
        for leak, out in ((False, rows), (True, rows_leak)):
            it = items.copy()
            if leak:  # put the target itself in the request token: the query must not see it
                it[-1] = split.targets(np.array([u]), which)[0]
            seq = m.head.encode(table.float()[torch.from_numpy(it)], torch.from_numpy(off),
                                torch.from_numpy(times), torch.from_numpy(acts))
            out.append((seq[int(q[0])].double() @ cand.t()).numpy())
    want = metrics_from_ranks(oracle_ranks(np.stack(rows), split, users, which), KS)
    assert got == pytest.approx(want, abs=1e-9)
    np.testing.assert_allclose(np.stack(rows_leak), np.stack(rows), rtol=0, atol=1e-6)


def test_nan_scores_are_an_error_naming_batch_and_user(split):
    m = model(split)
    with torch.no_grad():
        m.head.encoder.preprocessor.pos_emb.weight[3].fill_(math.nan)
    users = np.arange(split.num_users)
    with pytest.raises(NonFiniteScoreError, match=r"evaluation batch \d+, user \d+"):
        Evaluator(split, 8, KS, batch_size=4).evaluate(m, "valid", users, torch.device("cpu"))
