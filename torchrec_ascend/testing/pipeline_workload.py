"""The TorchRec workload (:mod:`.torchrec_workload`) under a chosen DMP and train pipeline.

Used by ``tests/distributed/test_semi_async.py`` and ``tests/distributed/train_pipeline/``.
A run is ``(dmp, pipeline, staleness,
sharding, steps)`` with ``dmp`` in ``{"torchrec", "ours"}`` and ``pipeline`` one of
``torchrec_sparse_dist`` / ``torchrec_semi_sync`` (TorchRec's classes, the references) or a
kind of :func:`make_train_pipeline`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch
from torchrec.distributed.comm import get_local_size
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel as TorchRecDMP
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.train_pipeline.train_pipelines import (
    TrainPipelineSemiSync,
    TrainPipelineSparseDist,
)
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from torchrec_ascend.distributed import DistributedModelParallel, make_train_pipeline
from . import torchrec_workload as W

Run = Tuple[str, str, int, str, int]  # (dmp, pipeline, staleness, sharding, steps)


def build(dmp: str, sharding: str, staleness: int, device: torch.device):
    """The workload model sharded by ``sharding`` under TorchRec's or our DMP, with its
    initial weights loaded, and the dense optimizer."""
    model = W.Model(torch.device("meta"))
    apply_optimizer_in_backward(
        torch.optim.SGD, list(model.ebc.parameters()) + list(model.ec.parameters()),
        {"lr": W.LR})
    world = torch.distributed.get_world_size()
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world, compute_device=device.type,
                          local_world_size=get_local_size(world)),
        constraints=W._constraints(sharding))
    sharders = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
    plan = planner.collective_plan(model, sharders, torch.distributed.GroupMember.WORLD)
    if dmp == "torchrec":
        dmp_model = TorchRecDMP(model, device=device, plan=plan, sharders=sharders)
    else:
        dmp_model = DistributedModelParallel(model, device=device, plan=plan, sharders=sharders,
                                             staleness=staleness)
    W.load_global(dmp_model, W.initial_state())
    dense = dict(in_backward_optimizer_filter(dmp_model.named_parameters()))
    opt = KeyedOptimizerWrapper(dense, lambda params: torch.optim.SGD(params, lr=W.LR))
    return dmp_model, opt


def pipeline_for(kind: str, model, opt, device: torch.device, staleness: int, **kw: Any):
    """TorchRec's reference pipelines by name, else :func:`make_train_pipeline`
    (``track_versions`` goes to ``semi_async`` only)."""
    if kind != "semi_async":
        kw = {k: v for k, v in kw.items() if k != "track_versions"}
    if kind == "torchrec_sparse_dist":
        return TrainPipelineSparseDist(model, opt, device)
    if kind == "torchrec_semi_sync":
        return TrainPipelineSemiSync(model, opt, device, start_batch=0)
    return make_train_pipeline(kind, model, opt, device, staleness=staleness, **kw)


def state(model) -> Dict[str, List[Tuple[List[int], torch.Tensor]]]:
    """Every state-dict entry's local pieces on cpu (DDP's ``module.`` prefix removed)."""
    out = {}
    for key, value in model.state_dict().items():
        out[key.replace("module.", "")] = [(o, t.detach().cpu().clone())
                                           for o, t in W._local_pieces(value)]
    return out


def run(run: Run, device: torch.device = torch.device("cpu"), **pipeline_kw: Any) -> dict:
    """Train one run; ``losses``, ``state``, and (semi_async with track_versions) the
    per-batch staleness read from the weights."""
    dmp, kind, staleness, sharding, steps = run
    rank = torch.distributed.get_rank()
    model, opt = build(dmp, sharding, staleness, device)
    pipe = pipeline_for(kind, model, opt, device, staleness, **pipeline_kw)
    batches = iter([W.make_batch(rank, s) for s in range(steps)])
    losses = []
    while True:
        try:
            loss, _ = pipe.progress(batches)
        except StopIteration:
            break
        losses.append(float(loss.detach().cpu()))
    out = {"losses": losses, "state": state(model)}
    versions = getattr(pipe, "versions", None)
    if versions is not None:
        out["staleness"] = versions.staleness()
        out["distinct"] = versions.distinct()
    out["stats"] = list(getattr(pipe, "stats", []))
    if hasattr(pipe, "close"):
        pipe.close()
    torch.distributed.barrier()
    return out


def worker(rank: int, world_size: int, runs: List[Run], pipeline_kw: dict) -> List[dict]:
    """Every run of ``runs`` in order on this rank."""
    return [run(r, **pipeline_kw) for r in runs]
