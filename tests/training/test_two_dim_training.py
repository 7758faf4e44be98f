"""The Trainer with ``train.planner = "hierarchical_2d"`` (2-D parallelism: the item table
sharded inside each host, replicated across hosts, the replicas averaged every
``train.sync_every`` steps) on world 4 = 2 hosts x 2 (``LOCAL_WORLD_SIZE=2``), gloo."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("torchrec")

from test_trainer import STEPS, TOL, tiny_config, tiny_sequences  # noqa: E402

from torchrec_ascend.testing.multiprocess import run_multiprocess  # noqa: E402
from torchrec_ascend.training import (ConfigError, RetrievalTask, Trainer,  # noqa: E402
                                      leave_two_out)
from torchrec_ascend.training.console import Console  # noqa: E402
from torchrec_ascend.training.process_group import init_distributed  # noqa: E402

TWO_D = {"planner": "hierarchical_2d", "batch_size": 2, "dropout": 0.0}


def _fingerprint(trainer: Trainer) -> float:
    """Float64 sum of this rank's piece of the item table (equal on the ranks of one shard's
    replicas when they are in sync)."""
    from torchrec_ascend.distributed.planner.collective_bytes import local_pieces

    return float(sum(t.double().sum() for pieces in local_pieces(trainer.dmp).values()
                     for _, t in pieces))


def _fit(out: str, name: str, steps: int = STEPS, resume: bool = False, **train) -> dict:
    env = init_distributed("cpu")
    cfg = tiny_config(**{"steps": steps, **train})
    trainer = Trainer(cfg, RetrievalTask(cfg, leave_two_out(tiny_sequences())), env,
                      os.path.join(out, name), "hstu", peak_flops=1e9, progress=False,
                      console=Console(False), resume=resume)
    res = trainer.fit()
    return {"losses": [v for _, v in res["history"]["loss"]], "valid": res["valid"],
            "fingerprint": _fingerprint(trainer), "synced_at": getattr(trainer.dmp, "synced_at", None),
            "world": env.world_size, "type": type(trainer.dmp).__name__}


def _two_dim_worker(rank: int, world: int, out: str) -> dict:
    frozen = dict(TWO_D, sparse_lr=1e-9)
    return {
        "frozen": _fit(out, "frozen", **frozen),
        "every": _fit(out, "every", **TWO_D),
        "never": _fit(out, "never", sync_every=STEPS, **TWO_D),
        "never_eval": _fit(out, "never_eval", sync_every=STEPS, eval_every=1, **TWO_D),
        "sum": _fit(out, "sum", sync_every=2, replica_merge="sum", **TWO_D),
        "sum_eval": _fit(out, "sum_eval", sync_every=2, eval_every=1, replica_merge="sum",
                         **TWO_D),
        "mean2": _fit(out, "mean2", sync_every=2, **TWO_D),
        "full": _fit(out, "full", sync_every=STEPS, checkpoint_every=2, **TWO_D),
        "part": _fit(out, "part", steps=2, sync_every=STEPS, checkpoint_every=2, **TWO_D),
        "resumed": _fit(out, "part", resume=True, sync_every=STEPS, checkpoint_every=2, **TWO_D),
    }


def _one_process_worker(rank: int, world: int, out: str) -> dict:
    return _fit(out, "one", batch_size=8, dropout=0.0, sparse_lr=1e-9)


@pytest.mark.slow
def test_two_dim_trainer_on_two_hosts(tmp_path):
    """World 4 = 2 hosts x 2, batch 2 per rank:

    * with the table's updates off (``sparse_lr`` 1e-9) 2-D training is 1 process x batch 8:
      the lookups inside a host read the right rows and the dense gradients are summed over
      the whole world (losses within 1e-5);
    * the replicas drift between syncs and the option is wired: a sync every step and none
      until the end give different losses from step 2 on; every run ends with the replicas of
      each shard equal (the final sync) on the two hosts;
    * evaluating after every step (of the merged replicas) leaves training as it was, to the
      bit: each host gets its own weights back (also with ``replica_merge="sum"``, whose next
      merge starts from the last one's values); the sum merge differs from the mean after its
      first sync;
    * a checkpoint (of the synced replicas) at step 2 and a resume give the losses of one run
      with the same checkpoint."""
    per_rank = run_multiprocess(_two_dim_worker, 4, (str(tmp_path),), local_world_size=2)
    (one,) = run_multiprocess(_one_process_worker, 1, (str(tmp_path),))
    r = per_rank[0]
    assert r["frozen"]["world"] == 4 and r["frozen"]["type"] == "TwoDimModelParallel"
    np.testing.assert_allclose(r["frozen"]["losses"], one["losses"], rtol=TOL, atol=TOL)
    for k, v in one["valid"].items():
        assert r["frozen"]["valid"][k] == pytest.approx(v, abs=1e-4), k

    every, never = r["every"]["losses"], r["never"]["losses"]
    assert every[:1] == pytest.approx(never[:1], abs=1e-6)
    assert max(abs(a - b) for a, b in zip(every[1:], never[1:])) > 1e-4
    assert r["never_eval"]["losses"] == never
    # replica_merge: the sum of the hosts' changes differs from their average after the sync
    # at step 2; evaluating the merged replicas every step moves neither the weights nor the
    # last merge's values the next merge starts from
    assert r["sum"]["losses"][:2] == r["mean2"]["losses"][:2]
    assert max(abs(a - b) for a, b in zip(r["sum"]["losses"][2:], r["mean2"]["losses"][2:])) > 1e-4
    assert r["sum_eval"]["losses"] == r["sum"]["losses"]
    np.testing.assert_allclose(r["resumed"]["losses"], r["full"]["losses"], rtol=TOL, atol=TOL)
    for name in ("every", "never", "full", "resumed", "sum", "sum_eval"):
        prints = [per_rank[k][name]["fingerprint"] for k in range(4)]
        # ranks 0 and 2 hold shard 0 on hosts 0 and 1, ranks 1 and 3 shard 1
        assert prints[0] == pytest.approx(prints[2], rel=1e-6, abs=1e-9), name
        assert prints[1] == pytest.approx(prints[3], rel=1e-6, abs=1e-9), name
        assert prints[0] != pytest.approx(prints[1], rel=1e-3), name
        assert per_rank[0][name]["synced_at"] == STEPS, name


def test_two_dim_config_rules():
    """``sync_every`` and ``replica_merge`` need the 2-D planner; the 2-D planner does not run
    ``semi_async``."""
    with pytest.raises(ConfigError, match=r"train\.sync_every: 3 needs train\.planner="
                                          r"'hierarchical_2d'"):
        tiny_config(sync_every=3)
    with pytest.raises(ConfigError, match=r"train\.sync_every: 0 is not an integer >= 1"):
        tiny_config(planner="hierarchical_2d", sync_every=0)
    with pytest.raises(ConfigError, match=r"train\.pipeline: 'semi_async' does not run with "
                                          r"train\.planner='hierarchical_2d'"):
        tiny_config(planner="hierarchical_2d", pipeline="semi_async")
    with pytest.raises(ConfigError, match=r"train\.replica_merge: 'sum' needs train\.planner="
                                          r"'hierarchical_2d'"):
        tiny_config(replica_merge="sum")
    with pytest.raises(ConfigError, match=r"train\.replica_merge: 'max' is not one of "
                                          r"\['mean', 'sum'\]"):
        tiny_config(planner="hierarchical_2d", replica_merge="max")
    assert tiny_config(planner="hierarchical_2d", sync_every=5).train.sync_every == 5
    from torchrec_ascend.distributed.planner.collection import TwoDimModelParallel
    from torchrec_ascend.distributed.planner import ReplicaMerge
    from torchrec_ascend.options import choices
    from torchrec_ascend.training.config import TrainConfig

    # the config's choice list is the model's (one Literal type)
    assert TrainConfig.__annotations__["replica_merge"] in ("ReplicaMerge", ReplicaMerge)
    assert choices(ReplicaMerge) == TwoDimModelParallel.MERGES
