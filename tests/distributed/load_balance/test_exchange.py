"""AllToAllBalancer on 2 gloo ranks: every balanced sample equals the sample it came from (each rank
rebuilds the whole global batch from the seeds as the reference), the plan partitions the global
batch, restore gives back the original batch, KJT / JaggedTensor in and out, and bad input
(mismatched rows, disagreeing ranks, an empty rank, a too-long sequence, a count limit) raises the
same error on every rank instead of hanging.  Plus the one-process (no process group) identity."""

from __future__ import annotations

from typing import Dict

import pytest
import torch

pytest.importorskip("torchrec")

from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor  # noqa: E402

from torchrec_ascend.distributed.load_balance import AllToAllBalancer, HSTUCostModel  # noqa: E402
from torchrec_ascend.testing.multiprocess import run_multiprocess  # noqa: E402

MODEL = HSTUCostModel(1.0, 0.05, target_coef=0.5)


def _batch(case: str, rank: int) -> Dict[str, object]:
    """Rank ``rank``'s local batch of a case (every rank can build every rank's batch)."""
    g = torch.Generator().manual_seed(100 * rank + len(case))
    B = {"mixed": (7, 12), "empty_rank": (9, 0), "all_empty": (0, 0), "one_sample": (1, 0),
         "giant": (10, 10), "cap": (3, 11)}.get(case, (6, 5))[rank]
    lengths = torch.randint(0, 30, (B,), generator=g)
    if case == "giant" and rank == 0:
        lengths[3] = 200
    T = int(lengths.sum())
    tok = {"ids": torch.randint(0, 10 ** 9, (T,), generator=g),
           "ts": torch.cumsum(torch.randint(1, 1000, (T,), generator=g), 0),
           "act": torch.randint(0, 2, (T, 8), generator=g, dtype=torch.uint8),
           "actf": torch.rand(T, 8, generator=g)}
    smp = {"user": torch.randint(0, 10 ** 6, (B,), generator=g),
           "score": torch.rand(B, 3, generator=g, dtype=torch.float64),
           "flag": torch.rand(B, generator=g) > 0.5}
    nt = torch.minimum(torch.randint(0, 3, (B,), generator=g), lengths)
    return {"lengths": lengths, "tok": tok, "smp": smp, "nt": nt}


def _offsets(lengths):
    return torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])


def _check_against_reference(case: str, bb, world: int) -> None:
    """Every balanced sample equals its source sample (rebuilt from the seeds)."""
    src = [_batch(case, r) for r in range(world)]
    boff = bb.offsets
    for i, (r, j) in enumerate(zip(bb.source_rank.tolist(), bb.source_index.tolist())):
        ref = src[r]
        off = _offsets(ref["lengths"])
        assert int(bb.lengths[i]) == int(ref["lengths"][j])
        for name, t in ref["tok"].items():
            assert torch.equal(bb.token_fields[name][boff[i]:boff[i + 1]], t[off[j]:off[j + 1]]), name
        for name, t in ref["smp"].items():
            assert torch.equal(bb.sample_fields[name][i], t[j]), name
        assert int(bb.num_targets[i]) == int(ref["nt"][j])
    for name, t in bb.token_fields.items():
        assert t.shape[0] == int(bb.lengths.sum()) and t.dtype == src[0]["tok"][name].dtype
    # the plan's cost per rank, recomputed from what the ranks hold
    all_lengths = torch.cat([s["lengths"] for s in src])
    all_nt = torch.cat([s["nt"] for s in src])
    n = all_lengths.double()
    total = float((n + 0.05 * n * n + 0.5 * all_nt.double()).sum())
    assert float(bb.rank_costs.sum()) == pytest.approx(total, rel=1e-12)


def _run_case(case: str, rank: int, world: int, bal: AllToAllBalancer) -> dict:
    b = _batch(case, rank)
    bb = bal.balance(b["lengths"], b["tok"], b["smp"], num_targets=b["nt"])
    _check_against_reference(case, bb, world)
    back = {k: bb.restore(v) for k, v in bb.sample_fields.items()}
    for k, v in b["smp"].items():
        assert torch.equal(back[k], v), k
    for k, v in b["tok"].items():
        assert torch.equal(bb.restore_tokens(bb.token_fields[k]), v), k
    assert torch.equal(bb.restore(bb.num_targets), b["nt"])
    return {"pairs": list(zip(bb.source_rank.tolist(), bb.source_index.tolist())),
            "B": int(bb.lengths.numel()), "lengths": bb.lengths.tolist(), "imbalance": bb.imbalance,
            "rank_costs": bb.rank_costs.tolist()}


def _error(fn) -> str:
    try:
        fn()
    except ValueError as e:
        return str(e)
    return "no error"


def _kjt(rank: int) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(7 + rank)
    B = 4 + 3 * rank
    lengths = torch.randint(0, 9, (3, B), generator=g, dtype=torch.int32)
    n = int(lengths.sum())
    return KeyedJaggedTensor(keys=["item", "ts", "act"], values=torch.randint(0, 1000, (n,), generator=g),
                             weights=torch.rand(n, generator=g), lengths=lengths.flatten())


def _count_gathers(rank: int):
    """all_gathers per balance call: 2 while the metadata capacity grows, then 1."""
    from torchrec_ascend.distributed.load_balance import exchange

    calls = []
    real = exchange._all_gather
    exchange._all_gather = lambda *a: calls.append(1) or real(*a)
    try:
        bal, counts = AllToAllBalancer(MODEL), []
        for n in (4, 4, 9, 3, 40):  # local batch sizes (rank 1 twice as many)
            before = len(calls)
            bal.balance(torch.ones(n * (1 + rank), dtype=torch.int64))
            counts.append(len(calls) - before)
        return counts
    finally:
        exchange._all_gather = real


def _async_restore(rank: int, bal: AllToAllBalancer) -> bool:
    """restore / restore_tokens on a group of their own with async_op=True, while a balance runs
    on the default group: the original rows come back."""
    import torch.distributed as dist

    other = dist.new_group(ranks=[0, 1])
    b = _batch("mixed", rank)
    bb = bal.balance(b["lengths"], b["tok"], b["smp"], num_targets=b["nt"])
    users = bb.restore(bb.sample_fields["user"], other, async_op=True)
    ids = bb.restore_tokens(bb.token_fields["ids"], other, async_op=True)
    nxt = _batch("plain", rank)
    bal.balance(nxt["lengths"], nxt["tok"], nxt["smp"])  # the default group meanwhile
    assert torch.equal(users.wait(), b["smp"]["user"]) and users.done()
    assert users.wait() is users.wait()
    assert torch.equal(ids.wait(), b["tok"]["ids"])
    with pytest.raises(ValueError, match="per_sample: expected"):
        bb.restore(torch.zeros(1), other, async_op=True)
    return True


def _worker(rank: int, world: int) -> dict:
    out = {}
    bal = AllToAllBalancer(MODEL)
    for case in ("mixed", "empty_rank", "all_empty", "one_sample", "giant"):
        out[case] = _run_case(case, rank, world, bal)
    out["cap"] = _run_case("cap", rank, world, AllToAllBalancer(MODEL, max_per_rank=8))
    b = _batch("plain", rank)
    # bad input: every rank must raise (no hang), the offending one says what is wrong
    bad_tok = dict(b["tok"], ids=b["tok"]["ids"][:-1]) if rank == 1 else b["tok"]
    out["bad_rows"] = _error(lambda: bal.balance(b["lengths"], bad_tok, b["smp"]))
    extra = dict(b["smp"], extra=torch.zeros(b["lengths"].numel())) if rank == 1 else b["smp"]
    out["schema"] = _error(lambda: bal.balance(b["lengths"], b["tok"], extra))
    out["dtype"] = _error(lambda: bal.balance(b["lengths"], b["tok"], dict(
        b["smp"], user=b["smp"]["user"].int() if rank == 0 else b["smp"]["user"])))
    long_b = _batch("giant", rank)
    out["too_long"] = _error(lambda: AllToAllBalancer(MODEL, max_tokens_per_rank=150).balance(
        long_b["lengths"], long_b["tok"]))
    one = _batch("one_sample", rank)
    strict, capped = AllToAllBalancer(MODEL, allow_empty=False), AllToAllBalancer(MODEL, max_per_rank=5)
    out["strict_empty"] = _error(lambda: strict.balance(one["lengths"], one["tok"]))
    out["cap_infeasible"] = _error(lambda: capped.balance(b["lengths"], b["tok"]))
    x = torch.zeros(int(b["lengths"].sum()), requires_grad=True)
    out["grad"] = _error(lambda: bal.balance(b["lengths"], {"x": x}))
    bb = bal.balance(b["lengths"], b["tok"])
    out["restore_rows"] = _error(lambda: bb.restore(torch.zeros(bb.lengths.numel() + 1)))
    # TorchRec types in, the same types out
    kjt = _kjt(rank)
    kout, kbb = bal.balance_kjt(kjt, {"user": torch.arange(kjt.stride()) + 100 * rank}, cost_key="ts")
    src = [_kjt(r) for r in range(world)]
    assert isinstance(kout, KeyedJaggedTensor) and kout.keys() == kjt.keys()
    assert kout.stride() == kbb.lengths.numel()
    assert kout.lengths().dtype == torch.int32
    got, ref = kout.to_dict(), [k.to_dict() for k in src]
    for i, (r, j) in enumerate(zip(kbb.source_rank.tolist(), kbb.source_index.tolist())):
        assert int(kbb.sample_fields["user"][i]) == 100 * r + j
        for key in kjt.keys():
            assert torch.equal(got[key].to_dense()[i], ref[r][key].to_dense()[j]), key
            assert torch.equal(got[key].to_dense_weights()[i], ref[r][key].to_dense_weights()[j]), key
    src_pairs = zip(kbb.source_rank.tolist(), kbb.source_index.tolist())
    want = [int(ref[r]["ts"].lengths()[j]) for r, j in src_pairs]  # cost_key's lengths
    assert torch.equal(kbb.lengths, torch.tensor(want, dtype=torch.int32))
    assert torch.equal(kbb.restore(kbb.sample_fields["user"]), torch.arange(kjt.stride()) + 100 * rank)
    jt = JaggedTensor(values=b["tok"]["actf"], lengths=b["lengths"], weights=b["tok"]["ids"].double())
    jout, jbb = bal.balance_jagged(jt)
    assert isinstance(jout, JaggedTensor)
    srcj = [_batch("plain", r) for r in range(world)]
    for i, (r, j) in enumerate(zip(jbb.source_rank.tolist(), jbb.source_index.tolist())):
        off = _offsets(srcj[r]["lengths"])
        assert torch.equal(jout.to_dense()[i], srcj[r]["tok"]["actf"][off[j]:off[j + 1]])
        assert torch.equal(jout.to_dense_weights()[i], srcj[r]["tok"]["ids"][off[j]:off[j + 1]].double())
    out["kjt_B"] = kout.stride()
    out["async_restore"] = _async_restore(rank, bal)
    out["gathers"] = _count_gathers(rank)
    out["bad_kjt"] = _error(lambda: bal.balance_kjt(kjt, cost_key="nope"))
    out["training"] = _train_worker(rank, world)
    return out


@pytest.fixture(scope="module")
def results():
    """One 2-rank run for every multi-process test of this module (spawning costs ~10 s)."""
    return run_multiprocess(_worker, 2)


pytestmark = pytest.mark.slow


@pytest.mark.parametrize("case", ["mixed", "empty_rank", "giant", "cap"])
def test_plan_partitions_the_global_batch_and_balances_it(results, case):
    pairs = sorted(results[0][case]["pairs"] + results[1][case]["pairs"])
    sizes = {"mixed": (7, 12), "empty_rank": (9, 0), "giant": (10, 10), "cap": (3, 11)}[case]
    assert pairs == [(r, j) for r in range(2) for j in range(sizes[r])]
    assert results[0][case]["rank_costs"] == results[1][case]["rank_costs"]  # one plan everywhere
    # each rank's cost recomputed from the lengths it holds
    for r in range(2):
        n = torch.tensor(results[r][case]["lengths"], dtype=torch.float64)
        assert float((n + 0.05 * n * n).sum()) <= results[r][case]["rank_costs"][r] + 1e-9
    if case != "giant":
        assert results[0][case]["imbalance"] < 0.05


def test_an_empty_rank_gets_work(results):
    assert results[1]["empty_rank"]["B"] > 0 and results[0]["empty_rank"]["B"] > 0


def test_an_all_empty_batch_stays_empty(results):
    assert results[0]["all_empty"]["B"] == results[1]["all_empty"]["B"] == 0


def test_fewer_sequences_than_ranks_leaves_a_rank_empty_or_raises(results):
    assert sorted(results[r]["one_sample"]["B"] for r in range(2)) == [0, 1]
    for r in range(2):
        assert "ranks [1] would get none" in results[r]["strict_empty"]


def test_a_giant_sequence_takes_a_rank_alone(results):
    holder = [r for r in range(2) if 200 in results[r]["giant"]["lengths"]]
    assert len(holder) == 1 and results[holder[0]]["giant"]["lengths"] == [200]


def test_count_limit(results):
    assert max(results[r]["cap"]["B"] for r in range(2)) <= 8
    for r in range(2):
        assert "2 bins x 5 items < 11 items" in results[r]["cap_infeasible"]


def test_bad_input_raises_on_every_rank(results):
    assert "token_fields['ids']: has" in results[1]["bad_rows"] and "sum(lengths)" in results[1]["bad_rows"]
    assert "bad input on rank(s) [1]" in results[0]["bad_rows"]
    for key in ("schema", "dtype"):
        for r in range(2):
            assert "ranks disagree" in results[r][key], key
    for r in range(2):
        assert "item 3 alone has size 200 > the limit 150" in results[r]["too_long"]
        assert "requires grad" in results[r]["grad"]
        assert "per_sample: expected" in results[r]["restore_rows"]
        assert "cost_key: 'nope'" in results[r]["bad_kjt"]
    assert results[0]["kjt_B"] + results[1]["kjt_B"] == 4 + 7


def test_metadata_takes_one_gather_once_the_capacity_fits(results):
    # words = 2 per sample (cost, length), the need is rank 1's 2 * 2n: 16 (capacity 0 -> 32),
    # 16 fits, 36 > 32 (-> 72), 12 fits, 160 > 72
    assert results[0]["gathers"] == results[1]["gathers"] == [2, 1, 2, 1, 2]


def test_restore_on_another_group_asynchronously(results):
    assert all(r["async_restore"] for r in results)


def test_one_process_is_the_identity():
    b = _batch("mixed", 0)
    bal = AllToAllBalancer(MODEL)
    bb = bal.balance(b["lengths"], b["tok"], b["smp"], num_targets=b["nt"])
    assert torch.equal(bb.lengths, b["lengths"]) and bb.source_rank.tolist() == [0] * 7
    for k, v in b["tok"].items():
        assert torch.equal(bb.token_fields[k], v)
    for k, v in b["smp"].items():
        assert torch.equal(bb.sample_fields[k], v) and torch.equal(bb.restore(v), v)
        pending = bb.restore(v, async_op=True)
        assert pending.done() and torch.equal(pending.wait(), v)
    assert bb.imbalance == 0.0
    with pytest.raises(ValueError, match="rank 0: lengths: expected an integer dtype"):
        bal.balance(b["lengths"].float(), b["tok"])
    with pytest.raises(ValueError, match=r"sample_fields\['user'\]: has 7 rows, expected len\(lengths\) = 6"):
        bal.balance(b["lengths"][:6], {}, {"user": b["smp"]["user"]})
    with pytest.raises(ValueError, match="kjt: expected a torchrec KeyedJaggedTensor"):
        bal.balance_kjt(b["lengths"])


# ---------------------------------------------------------------------- training equivalence
def _train_batch(rank: int):
    g = torch.Generator().manual_seed(11 + rank)
    B = (5, 9)[rank]
    lengths = torch.randint(1, 33, (B,), generator=g)
    lengths[0] = 32 if rank == 0 else 2  # rank 0 heavy: the plan must move work
    T = int(lengths.sum())
    return (lengths, torch.randint(0, 64, (T,), generator=g),
            torch.cumsum(torch.randint(1, 5000, (T,), generator=g), 0),
            torch.randint(0, 2, (T, 8), generator=g, dtype=torch.uint8),
            torch.randint(0, 16, (B,), generator=g))


def _model() -> torch.nn.ModuleDict:
    from torchrec_ascend.modules.hstu import HSTUEncoder

    torch.manual_seed(0)
    return torch.nn.ModuleDict({"item": torch.nn.Embedding(64, 8), "user": torch.nn.Embedding(16, 8),
                                "enc": HSTUEncoder(8, 1, 2, 4, 4, 32), "head": torch.nn.Linear(8, 8)})


def _forward(m, lengths, ids, ts, act, users):
    """(sum of per-token losses, per-sample mean logit [B])."""
    offsets = _offsets(lengths)
    x = m["item"](ids) + m["user"](users).repeat_interleave(lengths, 0)
    logits = m["head"](m["enc"](x, offsets, ts))
    per_token = torch.nn.functional.binary_cross_entropy_with_logits(
        logits, act.float(), reduction="none").sum(1)
    seg = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    per_sample = torch.zeros(lengths.numel()).index_add(0, seg, logits.mean(1).detach()) / lengths
    return per_token.sum(), per_sample


def _train_worker(rank: int, world: int) -> dict:
    import torch.distributed as dist

    out = {}
    batch = _train_batch(rank)
    for mode in ("plain", "balanced"):
        m = _model()
        lengths, ids, ts, act, users = batch
        bb = None
        if mode == "balanced":
            bb = AllToAllBalancer(HSTUCostModel.from_encoder(m["enc"])).balance(
                lengths, {"ids": ids, "ts": ts, "act": act}, {"users": users})
            lengths, ids, ts, act, users = (bb.lengths, bb.token_fields["ids"], bb.token_fields["ts"],
                                            bb.token_fields["act"], bb.sample_fields["users"])
        local, per_sample = _forward(m, lengths, ids, ts, act, users)
        totals = torch.stack([local.detach(), torch.tensor(float(lengths.sum()))])
        dist.all_reduce(totals)
        (local / totals[1]).backward()  # global loss = sum over all tokens / global token count
        grads = torch.cat([p.grad.flatten() for p in m.parameters()])
        dist.all_reduce(grads)
        out[mode] = {"loss": float(totals[0] / totals[1]), "grads": grads,
                     "per_sample": bb.restore(per_sample) if bb is not None else per_sample,
                     "B": int(lengths.numel()), "tokens": int(lengths.sum())}
    if rank == 0:  # one process, whole global batch, no collectives: the unsharded reference
        parts = [_train_batch(r) for r in range(world)]
        cat = [torch.cat([p[i] for p in parts]) for i in range(5)]
        m = _model()
        total, per_sample = _forward(m, *cat)
        (total / cat[0].sum()).backward()
        out["single"] = {"loss": float(total / cat[0].sum()),
                         "grads": torch.cat([p.grad.flatten() for p in m.parameters()]),
                         "per_sample": per_sample}
    return out


@pytest.fixture(scope="module")
def training(results):
    return [r["training"] for r in results]


def test_training_loss_and_gradients_equal_with_and_without_balancing(training):
    single = training[0]["single"]
    assert training[0]["balanced"]["tokens"] != training[0]["plain"]["tokens"]  # work really moved
    for r in range(2):
        for mode in ("plain", "balanced"):
            got = training[r][mode]
            assert got["loss"] == pytest.approx(single["loss"], rel=1e-6), (r, mode)
            assert torch.allclose(got["grads"], single["grads"], rtol=1e-4, atol=1e-6), (r, mode)
        # per-sample outputs computed on other ranks come back in the original order
        assert torch.allclose(training[r]["balanced"]["per_sample"], training[r]["plain"]["per_sample"],
                              rtol=1e-5, atol=1e-6)
    B0 = training[0]["plain"]["per_sample"].numel()
    assert torch.allclose(training[0]["plain"]["per_sample"], single["per_sample"][:B0], rtol=1e-5, atol=1e-6)
