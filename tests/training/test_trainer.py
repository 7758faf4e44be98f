"""The Trainer end to end in process groups: world sizes, balance modes, planners and devices
give the same training (losses within 1e-5), because the global batch, the negative pool and
the loss scale are functions of the step and the gradients are summed over ranks."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

pytest.importorskip("torchrec")

from torchrec_ascend import device as _device  # noqa: E402
from torchrec_ascend.datasets import Sequences  # noqa: E402
from torchrec_ascend.testing import simulated_npu  # noqa: E402
from torchrec_ascend.testing.multiprocess import run_multiprocess  # noqa: E402
from torchrec_ascend.training import (RetrievalTask, Trainer, config_from_dict,  # noqa: E402
                                      leave_two_out)
from torchrec_ascend.training.console import Console  # noqa: E402
from torchrec_ascend.training.process_group import init_distributed  # noqa: E402

STEPS = 4
TOL = 1e-5


def tiny_sequences(num_users: int = 40, num_items: int = 60, seed: int = 0) -> Sequences:
    """Random positive sequences (3..24 events per user), integer-second times in ms."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(3, 25, num_users)
    off = np.zeros(num_users + 1, dtype=np.int64)
    np.cumsum(lens, out=off[1:])
    items = rng.integers(0, num_items, off[-1])
    times = np.concatenate([np.cumsum(rng.integers(1, 5000, n)) for n in lens]) * 1000
    actions = rng.integers(0, 256, off[-1]).astype(np.uint8)
    return Sequences(items.astype(np.int64), times.astype(np.int64), actions, off,
                     np.arange(num_users, dtype=np.int64), num_items)


def tiny_config(dropout: float = 0.1, **train):
    t = {"batch_size": 8, "steps": STEPS, "num_negatives": 16, "log_every": 2, "seed": 3,
         "peak_gemm_size": 64, "prefetch": True}
    t.update(train)
    return config_from_dict({
        "data": {"source": "table", "files": ["unused.csv"]},
        "model": {"embedding_dim": 10, "num_layers": 1, "num_heads": 2, "attention_dim": 4,
                  "linear_dim": 4, "max_seq_len": 12, "dropout": dropout},
        "train": t, "eval": {"batch_size": 16, "ks": [5, 20], "metric": "ndcg@5"}})


def _versions(pipeline) -> dict:
    v = getattr(pipeline, "versions", None)
    if v is None:
        return {}
    return {"staleness": v.staleness(), "distinct": v.distinct(), "updates": v.version}


def train_run(out: str, device_type: str = "cpu", kind: str = "hstu", **train) -> dict:
    """Train on the tiny data in the current process group; losses and final metrics."""
    if device_type != "cpu":
        os.environ[_device.ENV_DEVICE] = device_type
    env = init_distributed(device_type)
    track = bool(train.pop("track_versions", False))
    cfg = tiny_config(**train)
    trainer = Trainer(cfg, RetrievalTask(cfg, leave_two_out(tiny_sequences())), env, out, kind,
                      peak_flops=1e9, progress=False, console=Console(False),
                      track_versions=track)
    res = trainer.fit()
    losses = [v for _, v in res["history"]["loss"]]
    ck = os.path.join(out, kind, "checkpoints", f"step_{STEPS:08d}")
    shards = sorted(f for f in os.listdir(ck) if f.endswith(".distcp")) if os.path.isdir(ck) else []
    log = []
    if env.rank == 0:  # rank 0 writes the log and the picture
        with open(os.path.join(out, kind, "log.jsonl")) as f:
            log = [json.loads(line) for line in f]
    png = os.path.join(out, kind, "pipeline.png")
    return {"shards": shards, "losses": losses, "valid": res["valid"], "test": res["test"],
            "log": log, "png": os.path.getsize(png) if os.path.exists(png) else 0,
            "versions": _versions(trainer.pipeline),
            "device": str(next(trainer.model.head.parameters()).device.type),
            "sharding": res["sharding"], "world": env.world_size,
            "compute_dtype": res["compute_dtype"]}


def _worker(rank: int, world: int, out: str, device_type: str, runs: list) -> list:
    """Every run of ``runs`` (train keyword arguments) in turn, in this process group."""
    return [train_run(os.path.join(out, f"run{i}"), device_type, **train)
            for i, train in enumerate(runs)]


def _run(tmp_path, world: int, runs: list, device_type: str = "cpu") -> list:
    return run_multiprocess(_worker, world, (str(tmp_path), device_type, runs),
                            device_type=device_type)[0]


def _same(a: dict, b: dict) -> None:
    assert len(a["losses"]) == len(b["losses"]) == STEPS
    np.testing.assert_allclose(a["losses"], b["losses"], rtol=TOL, atol=TOL)
    for split in ("valid", "test"):
        for k, v in a[split].items():
            assert b[split][k] == pytest.approx(v, abs=1e-4), (split, k)


NO_DROPOUT = {"batch_size": 8, "dropout": 0.0}
DROPOUT = {"batch_size": 8, "dropout": 0.1}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process on cpu: the runs every other test compares with."""
    return _run(tmp_path_factory.mktemp("ref"), 1,
                [NO_DROPOUT, DROPOUT, dict(NO_DROPOUT, pipeline="sync"),
                 dict(NO_DROPOUT, pipeline="semi_async", staleness=1),
                 dict(NO_DROPOUT, precision="bf16")])


def test_single_process_trains(reference):
    for r in reference[:2]:
        assert len(r["losses"]) == STEPS and all(np.isfinite(r["losses"]))
        assert r["sharding"] == "row_wise" and r["device"] == "cpu" and r["world"] == 1
        assert 0 < r["valid"]["mrr"] <= 1 and 0 < r["test"]["mrr"] <= 1
    # dropout changes the losses (the comparison below is not vacuous)
    assert abs(reference[0]["losses"][-1] - reference[1]["losses"][-1]) > 1e-3
    # the sync pipeline trains exactly like TrainPipelineSparseDist (the default)
    _same(reference[0], reference[2])


def test_semi_async_staleness_1_reads_stale_tables(reference):
    """k = 1 trains batch 0 as sync does, then differs (its lookups read the table one update
    old), and stays finite: the wiring really runs the stale schedule."""
    sync, stale = reference[0]["losses"], reference[3]["losses"]
    assert stale[0] == pytest.approx(sync[0], rel=1e-6)
    assert all(np.isfinite(stale)) and max(abs(a - b) for a, b in zip(sync[1:], stale[1:])) > 1e-3


def test_bf16_precision_trains_close_to_fp32(reference):
    """train.precision=bf16: the run says so in log.jsonl and results; every step's loss is
    within 1% of the fp32 run's (bf16 keeps ~3 significant digits; fp32 master weights), yet
    not equal to it (the bf16 path ran); the fp32 run logs fp32."""
    fp32, bf16 = reference[0], reference[4]
    assert bf16["compute_dtype"] == "bfloat16" and fp32["compute_dtype"] == "float32"
    head = [row for row in bf16["log"] if "precision" in row]
    assert head == [{"step": 0, "precision": "bf16", "compute_dtype": "bfloat16",
                     "reason": "train.precision=bf16"}]
    assert [row["compute_dtype"] for row in fp32["log"] if "precision" in row] == ["float32"]
    np.testing.assert_allclose(bf16["losses"], fp32["losses"], rtol=1e-2)
    assert max(abs(a - b) for a, b in zip(bf16["losses"], fp32["losses"])) > 1e-6
    assert 0 < bf16["valid"]["mrr"] <= 1


def test_step_records_logged_and_pipeline_png(reference):
    """log.jsonl rows carry the pipeline's step record; pipeline.png is written per model."""
    for r in reference[2:4]:
        rows = [row for row in r["log"] if "loss" in row]
        assert [row["step"] for row in rows] == list(range(1, STEPS + 1))
        for row in rows:
            assert row["step_ms"] > 0 and 0 <= row["busy_fraction"] <= 1
            assert row["stage_ms/dense_fwd"] > 0 and row["stage_ms/optimizer"] > 0
        assert r["png"] > 1000


def _warmup_worker(rank: int, world: int, out: str) -> dict:
    env = init_distributed("cpu")
    seqs = leave_two_out(tiny_sequences())

    def fit(name: str, steps: int, resume: bool = False, **train) -> tuple:
        cfg = tiny_config(dropout=0.0, pipeline="semi_async", staleness=1, steps=steps,
                          **{"sync_warmup_steps": 4, "checkpoint_every": 0, **train})
        trainer = Trainer(cfg, RetrievalTask(cfg, seqs), env, os.path.join(out, name), "hstu",
                          peak_flops=1e9, progress=False, console=Console(False), resume=resume,
                          track_versions=True)
        res = trainer.fit()
        return [v for _, v in res["history"]["loss"]], _versions(trainer.pipeline)

    full, versions = fit("full", 6)
    no_warmup, _ = fit("none", 6, sync_warmup_steps=0)
    fit("part", 2, checkpoint_every=2)
    resumed, _ = fit("part", 6, resume=True)
    return {"full": full, "versions": versions, "no_warmup": no_warmup, "resumed": resumed}


def test_sync_warmup_steps_in_the_trainer_and_on_resume(tmp_path):
    """train.sync_warmup_steps = 4 at k = 1 over 6 steps: batches 0..4 read their own version,
    batch 5 one update old (from the weights); a run checkpointed at step 2 and resumed gives
    the same losses (the warm-up counts global steps, not the resumed pipeline's); without the
    warm-up the losses differ from step 2 on."""
    (r,) = run_multiprocess(_warmup_worker, 1, (str(tmp_path),))
    assert r["versions"]["staleness"] == {0: 0, 1: 0, 2: 0, 3: 0, 4: 0, 5: 1}
    np.testing.assert_allclose(r["resumed"], r["full"], rtol=TOL, atol=TOL)
    assert max(abs(a - b) for a, b in zip(r["full"][2:], r["no_warmup"][2:])) > 1e-4
    assert r["full"][-1] != pytest.approx(r["no_warmup"][-1], abs=1e-6)


@pytest.mark.slow
def test_two_ranks_equal_one_process(tmp_path, reference):
    """World 2 x batch 4 == world 1 x batch 8 (the same global batch): losses within 1e-5,
    also with the all_to_all balancer (balancing one step ahead on the builder's worker) + the
    hierarchical planner and with the collator balancer.  Dropout 0: dropout masks are drawn per rank (with dropout, world sizes agree in
    distribution only)."""
    half = {"batch_size": 4, "dropout": 0.0}
    runs = _run(tmp_path, 2, [dict(half, checkpoint_every=STEPS),
                              dict(half, balance="all_to_all", planner="hierarchical",
                                   balance_ahead=True),
                              dict(half, balance="collator")])
    for r in runs:
        assert r["world"] == 2
        _same(reference[0], r)
    # the sharded checkpoint holds both ranks' shards
    assert runs[0]["shards"] == ["__0_0.distcp", "__1_0.distcp"]


def test_per_position_negatives_train_and_two_ranks_equal_one_process(tmp_path, reference):
    """train.negatives=per_position on the tiny data: finite losses, trained metrics, different
    from the shared pool's run (the option is wired); 2 ranks (row-wise sharded table, the
    all_to_all balancer) == 1 process, because every rank looks its queries' negatives up
    through the sharded EmbeddingCollection."""
    pp = dict(NO_DROPOUT, negatives="per_position")
    (one,) = _run(tmp_path / "one", 1, [pp])
    assert len(one["losses"]) == STEPS and all(np.isfinite(one["losses"]))
    assert 0 < one["valid"]["mrr"] <= 1 and 0 < one["test"]["mrr"] <= 1
    assert abs(one["losses"][0] - reference[0]["losses"][0]) > 1e-3
    (two,) = _run(tmp_path / "two", 2, [dict(pp, batch_size=4, balance="all_to_all")])
    assert two["world"] == 2 and two["sharding"] == "row_wise"
    # step 0 (the same table): the same loss to float rounding.  Later steps follow the
    # sharded row-wise Adagrad updates, which differ from one process by ~5e-5 relative here
    # (with the item table's updates off, sparse_lr 1e-9, the runs agree to 1e-7; the
    # gradients themselves sum over ranks to 2e-7: test_batches.py's
    # test_per_position_gradients_sum_over_ranks), so those steps get a wider tolerance.
    assert two["losses"][0] == pytest.approx(one["losses"][0], rel=1e-6)
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-3)
    for split in ("valid", "test"):
        for k, v in one[split].items():
            assert two[split][k] == pytest.approx(v, abs=0.03), (split, k)


def _all_ranks_worker(rank: int, world: int, out: str, runs: list) -> list:
    return _worker(rank, world, out, "cpu", runs)


@pytest.mark.slow
def test_semi_async_two_ranks_bound_and_one_process(tmp_path, reference):
    """semi_async k = 1 on 2 gloo ranks x batch 4 == 1 process x batch 8 at k = 1 (dense
    gradients summed, not averaged, as in synchronous training), also with the all_to_all
    balancer on its own process group (it runs on the pipeline's batch thread); on both
    ranks every lookup of batch j read, from the weights, version max(j - 1, 0)."""
    half = {"batch_size": 4, "dropout": 0.0, "pipeline": "semi_async", "staleness": 1,
            "track_versions": True}
    per_rank = run_multiprocess(_all_ranks_worker, 2,
                                (str(tmp_path), [half, dict(half, balance="all_to_all")]))
    for runs in per_rank:
        for r in runs:
            assert r["world"] == 2
            _same(reference[3], r)
            v = r["versions"]
            assert v["distinct"] and v["updates"] == STEPS
            assert v["staleness"] == {j: min(j, 1) for j in range(STEPS)}


@pytest.mark.slow
@pytest.mark.skipif(not (_device.torch_npu_available() or simulated_npu.available()),
                    reason="needs torch_npu or the built simulated npu")
def test_simulated_npu_matches_cpu(tmp_path, reference):
    (npu,) = _run(tmp_path, 1, [DROPOUT], device_type="npu")
    assert npu["device"] == "npu"
    _same(reference[1], npu)


def test_total_steps_from_steps_or_epochs():
    from torchrec_ascend.training.config import DEFAULT_EPOCHS
    from torchrec_ascend.training.trainer import total_steps

    assert total_steps(tiny_config(steps=7), 10) == 7
    assert total_steps(tiny_config(steps=None, epochs=2.5), 10) == 25
    assert total_steps(tiny_config(steps=None), 10) == DEFAULT_EPOCHS * 10
    assert total_steps(tiny_config(steps=None, epochs=0.01), 10) == 1


@pytest.mark.parametrize("restore", [False, True])
def test_early_stopping_watches_validation(tmp_path, monkeypatch, restore):
    """Validation NDCG@5 1.0, 0.9, 0.8 at steps 1, 2, 3 with patience 2: training stops after
    step 3, the best validation step is 1, the test is computed once at the end -- with the
    step-1 model when ``eval.restore_best`` (its dense weights come back), else the final one."""
    import torch.distributed as dist

    env = init_distributed("cpu")
    try:
        cfg = tiny_config(steps=6, eval_every=1, early_stopping_patience=2)
        cfg.eval.restore_best = restore
        trainer = Trainer(cfg, RetrievalTask(cfg, leave_two_out(tiny_sequences())), env,
                          str(tmp_path), "hstu", peak_flops=1e9, progress=False,
                          console=Console(False))
        calls, snapshots = [], []

        def fake(which, limit=None):
            calls.append(which)
            snapshots.append([p.detach().clone() for p in trainer.model.head.parameters()])
            value = 1.0 - 0.1 * (len(calls) - 1)
            return {k: value for k in ("hr@5", "hr@20", "ndcg@5", "ndcg@20", "mrr")}

        monkeypatch.setattr(trainer, "evaluate", fake)
        res = trainer.fit()
    finally:
        if env.created:
            dist.destroy_process_group()
    assert res["steps"] == 3 and res["stopped_early"]
    assert res["best_valid"] == {"step": 1, "ndcg@5": 1.0}
    assert calls == ["valid", "valid", "valid", "valid", "test"]
    final, at_step1, at_step3 = snapshots[-1], snapshots[0], snapshots[2]
    assert not all(torch.equal(a, b) for a, b in zip(at_step1, at_step3))
    want = at_step1 if restore else at_step3
    assert all(torch.equal(a, b) for a, b in zip(final, want))
    assert res["restored_step"] == (1 if restore else None)


SAMPLE_DIR = os.environ.get("KUAIRAND_SAMPLE_DIR", os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "shared", "data", "kuairand-27k-sample"))
SAMPLE = os.path.join(SAMPLE_DIR, "processed_standard_kcore_15.tsv")
SAMPLE_CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "kuairand",
                             "configs", "sample.json")


def _quality_worker(rank: int, world: int, out: str, steps: int) -> dict:
    from torchrec_ascend.training import load_config
    from torchrec_ascend.training.experiment import prepare_task

    torch.set_num_threads(1)
    env = init_distributed("cpu")
    sets = [f"train.steps={steps}", "train.eval_every=0", "train.checkpoint_every=0",
            'models=["hstu"]', f"data.files=[{json.dumps(SAMPLE)}]",
            f"data.cache_dir={json.dumps(os.path.join(out, 'cache'))}"]
    split = None
    res = {}
    for pipeline, k in (("sync", 0), ("semi_async", 1), ("semi_async", 2)):
        cfg, _ = load_config(SAMPLE_CONFIG, sets + [f"train.pipeline={pipeline}",
                                                    f"train.staleness={k}"])
        split = split or prepare_task(cfg).split
        trainer = Trainer(cfg, RetrievalTask(cfg, split), env, os.path.join(out, f"k{k}"), "hstu",
                          peak_flops=1e9, progress=False, console=Console(False))
        fit = trainer.fit()
        losses = [v for _, v in fit["history"]["loss"]]
        res[k] = {"valid": fit["valid"], "losses": losses}
    return res


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(SAMPLE), reason="the shared KuaiRand-27K sample is absent")
def test_semi_async_quality_on_kuairand_sample(tmp_path):
    """Issue 15's quality check, the robust part (the measured NDCG@10 differences, 1200 steps
    on paired seeds, are in docs/semi_async.md, benchmarks/semi_async_quality.py): staleness 1
    and 2 train as well as sync over 80 steps of the sample config -- the mean loss of the last
    20 steps within 5% of sync's (measured: +2.0% k=1, +3.3% k=2), and validation NDCG@200 not collapsed (>= half
    of sync's; measured 0.93x, 0.87x; HR@200 ~0.16 vs 0.02 for a random ranking).  NDCG@10 after
    80 steps is too noisy to assert on (one hit of 664 users: 0.0 for k=2, 0.0036 for sync)."""
    steps = 80
    (res,) = run_multiprocess(_quality_worker, 1, (str(tmp_path), steps))
    sync = res[0]
    assert len(sync["losses"]) == steps
    assert np.mean(sync["losses"][-20:]) < 0.9 * np.mean(sync["losses"][:10])  # it learns
    for k in (1, 2):
        r = res[k]
        assert all(np.isfinite(r["losses"]))
        assert np.mean(r["losses"][-20:]) == pytest.approx(np.mean(sync["losses"][-20:]), rel=0.05)
        assert r["valid"]["ndcg@200"] >= 0.5 * sync["valid"]["ndcg@200"] > 0, res
