"""The TorchRec workload (:mod:`.torchrec_workload`) under a chosen DMP and train pipeline.

Used by ``tests/distributed/test_semi_async.py`` and ``tests/distributed/train_pipeline/``.
A run is ``(dmp, pipeline, staleness,
sharding, steps)`` with ``dmp`` in ``{"torchrec", "ours"}`` and ``pipeline`` one of
``torchrec_sparse_dist`` / ``torchrec_semi_sync`` (TorchRec's classes, the references),
``semi_async_inline`` (semi_async with ``prefetch_depth=0``), ``semi_async_warmup<W>``
(semi_async with ``sync_warmup_steps=W``) or a kind of
:func:`make_train_pipeline`.  :class:`HSTUModel` (item EmbeddingCollection + HSTU
encoder + in-batch next-item softmax) and :func:`hstu_batch` are the benchmark's workload
(``benchmarks/pipeline.py``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Tuple

import torch
from torch import nn
from torchrec import EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor
from torchrec.distributed.comm import get_local_size
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel as TorchRecDMP
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.train_pipeline.train_pipelines import (
    TrainPipelineSemiSync,
    TrainPipelineSparseDist,
)
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.streamable import Pipelineable

from ..distributed.sharded_state import local_pieces

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
        constraints=W.constraints_for(sharding))
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
    if kind == "semi_async_inline":  # semi_async reading batches without the prefetch thread
        return make_train_pipeline("semi_async", model, opt, device, staleness=staleness,
                                   prefetch_depth=0, **kw)
    if kind.startswith("semi_async_warmup"):
        return make_train_pipeline("semi_async", model, opt, device, staleness=staleness,
                                   sync_warmup_steps=int(kind[len("semi_async_warmup"):]), **kw)
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
                                           for o, t in local_pieces(value)]
    return out


def run(run: Run, device: torch.device = torch.device("cpu"), **pipeline_kw: Any) -> dict:
    """Train one run; ``losses``, ``state``, and (semi_async with track_versions) the
    per-batch staleness read from the weights."""
    dmp, kind, staleness, sharding, steps = run
    rank = torch.distributed.get_rank()
    model, opt = build(dmp, sharding, staleness, device)
    pipe = pipeline_for(kind, model, opt, device, staleness, **pipeline_kw)
    losses = W.progress_losses(pipe, iter([W.make_batch(rank, s) for s in range(steps)]))
    out = {"losses": losses, "state": state(model),
           "devices": sorted({t.device.type for v in model.state_dict().values()
                              for _, t in local_pieces(v)})}
    versions = getattr(pipe, "versions", None)
    if versions is not None:
        out["staleness"] = versions.staleness()
        out["distinct"] = versions.distinct()
    out["stats"] = list(getattr(pipe, "stats", []))
    if hasattr(pipe, "close"):
        pipe.close()
    torch.distributed.barrier()
    return out


def worker(rank: int, world_size: int, runs: List[Run], pipeline_kw: dict,
           device_type: str = "cpu") -> List[dict]:
    """Every run of ``runs`` in order on this rank, on ``device_type`` (cpu, npu, cuda)."""
    from .multiprocess import rank_device

    device = rank_device(device_type, int(os.environ["LOCAL_RANK"]))
    return [run(r, device, **pipeline_kw) for r in runs]


# --- an HSTU-shaped model (benchmarks/pipeline.py) -----------------------------------------------

@dataclasses.dataclass(frozen=True)
class HSTUShape:
    """Sizes of :class:`HSTUModel` and its synthetic batches."""

    items: int = 20_000
    dim: int = 64
    layers: int = 2
    heads: int = 2
    attention_dim: int = 32
    linear_dim: int = 32
    max_len: int = 64
    min_len: int = 16
    batch: int = 16       # sequences per rank and step
    temperature: float = 0.1


@dataclasses.dataclass
class SeqBatch(Pipelineable):
    """One batch of item-id sequences (a KJT with the single feature ``item``)."""

    items: KeyedJaggedTensor

    def to(self, device: torch.device, non_blocking: bool = False) -> "SeqBatch":
        return SeqBatch(self.items.to(device, non_blocking=non_blocking))

    def record_stream(self, stream: torch.Stream) -> None:
        self.items.record_stream(stream)

    def pin_memory(self) -> "SeqBatch":
        return self


class NextItemLoss(nn.Module):
    """In-batch sampled softmax of next-item prediction: position ``t`` of a sequence predicts
    item ``t + 1``; the other targets of the batch are the negatives, except copies of the
    positive and of the query's own current item (masked out)."""

    def __init__(self, temperature: float) -> None:
        super().__init__()
        self.temperature = float(temperature)

    def forward(self, encoded: torch.Tensor, item_emb: torch.Tensor, ids: torch.Tensor,
                offsets: torch.Tensor) -> torch.Tensor:
        total = encoded.shape[0]
        rows = torch.arange(total, device=encoded.device)
        ends = offsets[1:].repeat_interleave(offsets[1:] - offsets[:-1])
        keep = rows + 1 < ends                      # not the last position of its sequence
        query = encoded[keep]
        pos_ids, cur_ids = ids[rows[keep] + 1], ids[keep]
        target = nn.functional.normalize(item_emb[rows[keep] + 1], dim=-1)
        logits = query @ target.t() / self.temperature
        labels = torch.arange(query.shape[0], device=encoded.device)
        masked = (pos_ids[None, :] == pos_ids[:, None]) | (pos_ids[None, :] == cur_ids[:, None])
        masked &= labels[None, :] != labels[:, None]
        logits = logits.masked_fill(masked, float("-inf"))
        return nn.functional.cross_entropy(logits, labels)


class HSTUModel(nn.Module):
    """Item-id EmbeddingCollection (sharded by DMP) + HSTUEncoder + next-item loss; forward
    returns ``(loss, loss.detach())``."""

    def __init__(self, shape: HSTUShape, device: torch.device) -> None:
        super().__init__()
        from ..modules.hstu import HSTUEncoder

        self.ec = EmbeddingCollection(
            tables=[EmbeddingConfig(name="item_table", embedding_dim=shape.dim,
                                    num_embeddings=shape.items, feature_names=["item"])],
            device=device)
        self.encoder = HSTUEncoder(shape.dim, shape.layers, shape.heads, shape.attention_dim,
                                   shape.linear_dim, shape.max_len, use_time_bias=False)
        self.loss = NextItemLoss(shape.temperature)

    def forward(self, batch: SeqBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        jt = self.ec(batch.items)["item"]
        values, offsets = jt.values(), jt.offsets()
        loss = self.loss(self.encoder(values, offsets), values, batch.items.values(), offsets)
        return loss, loss.detach()


def hstu_batch(shape: HSTUShape, rank: int, step: int) -> SeqBatch:
    """Deterministic batch: lengths uniform in [min_len, max_len]; each sequence a random walk
    over item ids (start skewed to popular ids, steps of 1..8), so the next item is learnable."""
    g = torch.Generator().manual_seed(7919 * step + rank)
    lengths = torch.randint(shape.min_len, shape.max_len + 1, (shape.batch,), generator=g)
    starts = (shape.items * torch.rand(shape.batch, generator=g).pow(3.0)).long()
    steps = torch.randint(1, 9, (int(lengths.sum()),), generator=g)
    seq = torch.repeat_interleave(torch.arange(shape.batch), lengths)
    first = torch.cumsum(lengths, 0) - lengths
    steps[first] = 0
    walk = torch.cumsum(steps, 0)
    walk = walk - walk[first].repeat_interleave(lengths)
    ids = (starts[seq] + walk) % shape.items
    return SeqBatch(KeyedJaggedTensor.from_lengths_sync(keys=["item"], values=ids,
                                                        lengths=lengths))


def build_hstu(shape: HSTUShape, staleness: int, device: torch.device, seed: int = 3,
               lr: float = 1e-3, table_lr: float = 5e-3):
    """:class:`HSTUModel` row-wise sharded under our DMP (``staleness``), fused row-wise
    Adagrad (``table_lr``) on the table (fbgemm's CPU TBE has no fused Adam), Adam (``lr``) on the
    dense part; the same initial weights for every call."""
    from torchrec.optim import RowWiseAdagrad

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = HSTUModel(shape, torch.device("meta"))
        dense_init = {k: v for k, v in HSTUModel(shape, torch.device("cpu")).state_dict().items()
                      if not k.startswith("ec.")}
    apply_optimizer_in_backward(RowWiseAdagrad, list(model.ec.parameters()), {"lr": table_lr})
    world = torch.distributed.get_world_size()
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world, compute_device=device.type,
                          local_world_size=get_local_size(world)),
        constraints={"item_table": ParameterConstraints(sharding_types=["row_wise"])})
    sharders = [EmbeddingCollectionSharder()]
    plan = planner.collective_plan(model, sharders, torch.distributed.GroupMember.WORLD)
    dmp = DistributedModelParallel(model, device=device, plan=plan, sharders=sharders,
                                   staleness=staleness)
    with torch.no_grad():
        for key, value in dmp.state_dict().items():
            k = key.replace("module.", "")
            if k in dense_init:
                value.copy_(dense_init[k])
    dense = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    opt = KeyedOptimizerWrapper(dense, lambda params: torch.optim.Adam(params, lr=lr))
    return dmp, opt
