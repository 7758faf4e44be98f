"""A TorchRec training job written as a user writes one: plain TorchRec plus ``import torchrec_ascend``.

EmbeddingBagCollection (2 pooled tables) + EmbeddingCollection (1 sequence table, sum-pooled by
the model) + a small dense part, trained with DistributedModelParallel through a TorchRec train
pipeline.  :func:`train` runs it on one device in the current process group and returns the loss
of every step and the rank's local embedding shards after training; :func:`assemble` rebuilds
the full tables from every rank's shards.  ``tests/distributed/`` runs it on ``npu`` (the real
device with torch_npu, the simulated one without) and on ``cpu`` with fbgemm's own kernels, and
compares; :mod:`torchrec_ascend.testing.trace_ops` traces the fbgemm ops it dispatches.

Nothing below names a simulated device or a backend: the device is an argument.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Dict, List, Optional, Tuple, Union

import torch
import torch.nn as nn

import torchrec_ascend  # noqa: F401  (the one import: opens TorchRec's gates for npu)
from torchrec import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
)
from torchrec.distributed.comm import get_local_size
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.train_pipeline.train_pipelines import (
    TrainPipelineBase,
    TrainPipelineFusedSparseDist,
    TrainPipelineSemiSync,
    TrainPipelineSparseDist,
)
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.streamable import Pipelineable

from ..distributed.sharded_state import local_pieces

__all__ = [
    "SHARDINGS",
    "PIPELINES",
    "Batch",
    "Model",
    "make_batch",
    "initial_state",
    "train",
    "progress_losses",
    "assemble",
    "fbgemm_cpu_kernels",
]

DIM = 16
BAG_TABLES = (("bag0", 40, "f_bag0"), ("bag1", 64, "f_bag1"))
SEQ_TABLES = (("seq0", 48, "f_seq0"),)
DENSE_IN = 4
BATCH = 6
LR = 0.1
SHARDINGS = ("table_wise", "row_wise", "column_wise", "data_parallel", "table_row_wise")
# semi-sync from the first batch (TorchRec's default start_batch=900 would run it synchronously)
PIPELINES = {
    "base": TrainPipelineBase,
    "sparse_dist": TrainPipelineSparseDist,
    "semi_sync": functools.partial(TrainPipelineSemiSync, start_batch=0),
    "fused_sparse_dist": TrainPipelineFusedSparseDist,
}


@dataclasses.dataclass
class Batch(Pipelineable):
    """Dense features, the two KJTs (bags, sequences) and the labels of one batch."""

    dense: torch.Tensor
    bag: KeyedJaggedTensor
    seq: KeyedJaggedTensor
    labels: torch.Tensor

    def to(self, device: torch.device, non_blocking: bool = False) -> "Batch":
        return Batch(self.dense.to(device, non_blocking=non_blocking),
                     self.bag.to(device, non_blocking=non_blocking),
                     self.seq.to(device, non_blocking=non_blocking),
                     self.labels.to(device, non_blocking=non_blocking))

    def record_stream(self, stream: torch.Stream) -> None:
        self.dense.record_stream(stream)
        self.bag.record_stream(stream)
        self.seq.record_stream(stream)
        self.labels.record_stream(stream)

    def pin_memory(self) -> "Batch":
        return self


def sum_pool(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Sum of each sequence's embeddings (a leaf for the pipelines' fx tracer)."""
    rows = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)
    out = torch.zeros(lengths.numel(), values.shape[1], device=values.device, dtype=values.dtype)
    return out.index_add(0, rows, values)


torch.fx.wrap("sum_pool")


class Model(nn.Module):
    """EBC + EC + dense tower -> one logit; forward returns (loss, (loss, logits))."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name=n, embedding_dim=DIM, num_embeddings=r,
                                       feature_names=[f]) for n, r, f in BAG_TABLES],
            device=device)
        self.ec = EmbeddingCollection(
            tables=[EmbeddingConfig(name=n, embedding_dim=DIM, num_embeddings=r, feature_names=[f])
                    for n, r, f in SEQ_TABLES],
            device=device)
        self.dense = nn.Linear(DENSE_IN, DIM, device=device)
        width = DIM * (len(BAG_TABLES) + len(SEQ_TABLES) + 1)
        self.over = nn.Sequential(nn.Linear(width, 16, device=device), nn.ReLU(),
                                  nn.Linear(16, 1, device=device))

    def forward(self, batch: Batch) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        parts = [self.ebc(batch.bag).values()]
        seqs = self.ec(batch.seq)
        for _, _, feature in SEQ_TABLES:
            parts.append(sum_pool(seqs[feature].values(), seqs[feature].lengths()))
        parts.append(torch.relu(self.dense(batch.dense)))
        logits = self.over(torch.cat(parts, dim=1)).squeeze(-1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, (loss.detach(), logits.detach())


def make_batch(rank: int, step: int) -> Batch:
    """Deterministic cpu batch for a rank and step: bag/sequence lengths 0..3 (0 always present),
    ids over the whole table (so every row-wise shard sees traffic)."""
    g = torch.Generator().manual_seed(1000 * step + rank)

    def kjt(tables) -> KeyedJaggedTensor:
        lengths = torch.randint(0, 4, (len(tables) * BATCH,), generator=g)
        lengths[0] = 0
        values = []
        for i, (_, rows, _) in enumerate(tables):
            n = int(lengths[i * BATCH:(i + 1) * BATCH].sum())
            values.append(torch.randint(0, rows, (n,), generator=g))
        return KeyedJaggedTensor.from_lengths_sync(
            keys=[f for _, _, f in tables], values=torch.cat(values), lengths=lengths)

    return Batch(torch.randn(BATCH, DENSE_IN, generator=g), kjt(BAG_TABLES), kjt(SEQ_TABLES),
                 torch.randint(0, 2, (BATCH,), generator=g).float())


def initial_state() -> Dict[str, torch.Tensor]:
    """The unsharded model's starting weights (cpu), the same on every rank and device."""
    g = torch.random.fork_rng()
    with g:
        torch.manual_seed(7)
        model = Model(torch.device("cpu"))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@torch.no_grad()
def load_global(model: nn.Module, state: Dict[str, torch.Tensor]) -> None:
    """Copy the unsharded weights into the sharded model's local shards."""
    for key, value in model.state_dict().items():
        full = state[key]
        for offsets, t in local_pieces(value):
            sl = tuple(slice(o, o + n) for o, n in zip(offsets, t.shape))
            t.copy_(full[sl])


Sharding = Union[str, Dict[str, str]]


def constraints_for(sharding: Sharding) -> Dict[str, ParameterConstraints]:
    """Every table constrained to ``sharding`` (one type for all tables, or {table: type}).
    EmbeddingCollection has no table_row_wise in TorchRec 1.8: its table takes row_wise then.
    Column-wise shards are DIM/2 wide."""
    half = DIM // 2
    if isinstance(sharding, dict):
        tables = {n for n, _, _ in BAG_TABLES + SEQ_TABLES}
        if set(sharding) != tables:
            raise ValueError(f"sharding: needs a type for exactly the tables {sorted(tables)}, "
                             f"got {sorted(sharding)}")
        return {n: ParameterConstraints(sharding_types=[t], min_partition=half)
                for n, t in sharding.items()}
    seq = "row_wise" if sharding == "table_row_wise" else sharding
    out = {n: ParameterConstraints(sharding_types=[sharding], min_partition=half)
           for n, _, _ in BAG_TABLES}
    out.update({n: ParameterConstraints(sharding_types=[seq], min_partition=half)
                for n, _, _ in SEQ_TABLES})
    return out


def sharded_model(device: torch.device, sharding: Optional[Sharding]) -> DistributedModelParallel:
    """The model under DMP: every table ``sharding`` (a type, or {table: type}; a plan from
    TorchRec's planner), or with ``sharding=None`` DMP's own default planning (no plan given)."""
    model = Model(torch.device("meta"))
    apply_optimizer_in_backward(
        torch.optim.SGD, list(model.ebc.parameters()) + list(model.ec.parameters()), {"lr": LR})
    if sharding is None:
        return DistributedModelParallel(model, device=device)
    world = torch.distributed.get_world_size()
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world, compute_device=device.type,
                          local_world_size=get_local_size(world)),
        constraints=constraints_for(sharding))
    sharders = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
    plan = planner.collective_plan(model, sharders, torch.distributed.GroupMember.WORLD)
    return DistributedModelParallel(model, device=device, plan=plan, sharders=sharders)


def progress_losses(pipe, batches) -> List[float]:
    """``pipe.progress(batches)`` until StopIteration; the loss of every step (the model
    returns ``(loss, (loss, logits))``)."""
    losses = []
    while True:
        try:
            loss, _ = pipe.progress(batches)
        except StopIteration:
            return losses
        losses.append(float(loss.detach().cpu()))


def train(device: torch.device, sharding: Optional[Sharding], pipeline: str, steps: int) -> dict:
    """Train ``steps`` steps of rank-specific batches through ``PIPELINES[pipeline]``.

    Returns ``losses`` (per step), ``shards`` ({state key: [(offsets, cpu tensor)]} of the
    rank's embedding shards), ``devices`` (device types the shards lived on) and
    ``sharding_types`` ({table: sharding type} of the plan that ran)."""
    if pipeline not in PIPELINES:
        raise ValueError(f"pipeline={pipeline!r}: must be one of {sorted(PIPELINES)}")
    rank = torch.distributed.get_rank()
    model = sharded_model(device, sharding)
    load_global(model, initial_state())
    dense = dict(in_backward_optimizer_filter(model.named_parameters()))
    dense_opt = KeyedOptimizerWrapper(dense, lambda params: torch.optim.SGD(params, lr=LR))
    pipe = PIPELINES[pipeline](model, dense_opt, device)
    losses = progress_losses(pipe, iter([make_batch(rank, s) for s in range(steps)]))
    shards, devices = {}, set()
    for key, value in model.state_dict().items():
        if key.startswith(("ebc.", "ec.")):
            pieces = local_pieces(value)
            devices.update(t.device.type for _, t in pieces)
            shards[key] = [(o, t.detach().cpu().clone()) for o, t in pieces]
    types = {table: ps.sharding_type
             for module_plan in model.plan.plan.values() for table, ps in module_plan.items()}
    return {"losses": losses, "shards": shards, "devices": sorted(devices),
            "sharding_types": types}


def assemble(per_rank: List[dict]) -> Dict[str, torch.Tensor]:
    """Full tables from every rank's local shards (NaN where no rank holds a piece; replicated
    pieces, as in data_parallel, are taken from the last rank)."""
    tables: Dict[str, torch.Tensor] = {}
    init = initial_state()
    for result in per_rank:
        for key, pieces in result["shards"].items():
            full = tables.setdefault(key, torch.full_like(init[key], float("nan")))
            for offsets, t in pieces:
                sl = tuple(slice(o, o + n) for o, n in zip(offsets, t.shape))
                full[sl] = t
    return tables


# fbgemm-gpu-cpu 1.8.0's dense_embedding_codegen_lookup_function pools sequence tables (it
# ignores pooling_mode NONE), so a data_parallel EmbeddingCollection fails on fbgemm's CPU
# kernels; ours is checked against a float64 loop in tests/ops/test_embedding.py.
FBGEMM_CPU_BROKEN = {"data_parallel": ("dense_embedding_codegen_lookup_function",)}


def fbgemm_cpu_kernels(sharding: Optional[Sharding]) -> contextlib.AbstractContextManager:
    """Context for the cpu reference run: fbgemm's own CPU kernels, except the ops of
    :data:`FBGEMM_CPU_BROKEN` for the sharding type(s) of ``sharding``, where ours replace
    fbgemm's."""
    types = set(sharding.values()) if isinstance(sharding, dict) else {sharding or ""}
    broken = sorted({op for t in types for op in FBGEMM_CPU_BROKEN.get(t, ())})
    if not broken:
        return contextlib.nullcontext()
    from torchrec_ascend.ops import registry

    return registry.use_backend("reference", ops=list(broken), device="cpu", replace_fbgemm=True)
