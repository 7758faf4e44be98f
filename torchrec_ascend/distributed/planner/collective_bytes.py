"""Checking the cost model against the bytes TorchRec's collectives really move.

:class:`CommCounter` wraps ``torch.distributed``'s collectives in this process (the module
attributes TorchRec calls: ``all_to_all_single``, ``all_to_all``, ``reduce_scatter``,
``reduce_scatter_tensor``, ``all_gather``, ``all_gather_into_tensor``, ``all_reduce``) and adds
up, per destination global rank, the bytes this rank hands each peer: an all-to-all chunk goes
to its peer; a reduce-scatter chunk to the rank it is for; an all-gather sends the input to
every peer; an all-reduce over the world (DDP's gradient buckets too, once
:meth:`CommCounter.ddp_hook` routes them through Python) is recorded as its payload and spread
over rank pairs by the same :func:`.estimators.allreduce_matrix` the cost model uses; one over
a subgroup of ``n`` ranks (a 2-D replica sync) as ``2 S / n`` bytes to each other member, the
cost model's formula for a subset.  Self-chunks are not link traffic.

The validation workload (:func:`validation_tables`, :class:`ValidationModel`,
:func:`make_batch`, :func:`train_planned`) is a small EmbeddingBagCollection +
EmbeddingCollection model trained under DistributedModelParallel with a given plan;
``benchmarks/planner.py`` measures ``estimator_error`` with it and ``tests/distributed/planner``
checks both the bytes and the training against an unsharded model.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torchrec import (EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection,
                      EmbeddingConfig, KeyedJaggedTensor)
from torchrec.distributed.types import ShardingPlan

from .. import sharded_state
from .estimators import PlanCost, allreduce_matrix
from .tables import TableRow
from .topology import HierarchicalTopology

__all__ = [
    "VALIDATION_PLANS",
    "VALIDATION_BATCH",
    "VALIDATION_MEMORY",
    "validation_topology",
    "validation_constraints",
    "CommCounter",
    "measured_matrix",
    "compare",
    "validation_tables",
    "ValidationModel",
    "ValidationBatch",
    "make_batch",
    "train_planned",
    "local_pieces",
    "load_state",
]

_WRAPPED = ("all_to_all_single", "all_to_all", "reduce_scatter", "reduce_scatter_tensor",
            "all_gather", "all_gather_into_tensor", "all_reduce")


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class CommCounter:
    """Bytes this rank sends each global rank through ``torch.distributed`` collectives while
    active (a context manager; not re-entrant).  ``sent``: {collective: [world] bytes};
    ``allreduce``: payload bytes of each all-reduce (DDP buckets too, with :meth:`ddp_hook`)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.sent: Dict[str, np.ndarray] = {}
        self.allreduce: List[int] = []
        self._orig: Dict[str, Callable] = {}
        self.active = False

    # ------------------------------------------------------------------ recording

    def _add(self, kind: str, group, chunks: Sequence[int]) -> None:
        ranks = dist.get_process_group_ranks(group if group is not None
                                             else dist.GroupMember.WORLD)
        row = self.sent.setdefault(kind, np.zeros(self.world_size))
        me = dist.get_rank()
        for peer, n in zip(ranks, chunks):
            if peer != me:
                row[peer] += n

    def _record(self, name: str, args: tuple, kwargs: dict) -> None:
        a = dict(zip(_SIGNATURES[name], args))
        a.update(kwargs)
        group = a.get("group")
        size = dist.get_world_size(group)
        if name == "all_to_all_single":
            inp = a["input"]
            row = _nbytes(inp) // max(inp.shape[0], 1) if inp.dim() else inp.element_size()
            splits = a.get("input_split_sizes")
            if not splits:
                splits = [inp.shape[0] // size] * size
            self._add("all_to_all", group, [s * row for s in splits])
        elif name == "all_to_all":
            self._add("all_to_all", group, [_nbytes(t) for t in a["input_tensor_list"]])
        elif name == "reduce_scatter":
            self._add("reduce_scatter", group, [_nbytes(t) for t in a["input_list"]])
        elif name == "reduce_scatter_tensor":
            self._add("reduce_scatter", group, [_nbytes(a["input"]) // size] * size)
        elif name == "all_gather":
            self._add("all_gather", group, [_nbytes(a["tensor"])] * size)
        elif name == "all_gather_into_tensor":
            self._add("all_gather", group, [_nbytes(a["input_tensor"])] * size)
        elif name == "all_reduce":
            if group is not None and size != self.world_size:  # e.g. a 2-D replica sync
                n = _nbytes(a["tensor"])  # a reduce-scatter + all-gather: 2 S / n to each peer
                self._add("all_reduce_group", group, [2.0 * n / size] * size)
            else:
                self.allreduce.append(_nbytes(a["tensor"]))

    @staticmethod
    def ddp_hook():
        """DDP's default all-reduce comm hook, which calls ``torch.distributed.all_reduce`` from
        Python (where this counter sees it) instead of the C++ reducer's built-in call; for
        the DDP instances TorchRec wraps data-parallel tables in."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        return default_hooks.allreduce_hook

    # ------------------------------------------------------------------ patching

    def __enter__(self) -> "CommCounter":
        for name in _WRAPPED:
            orig = getattr(dist, name)
            self._orig[name] = orig

            def wrapper(*args, _name=name, _orig=orig, **kwargs):
                if self.active:
                    self._record(_name, args, kwargs)
                return _orig(*args, **kwargs)

            setattr(dist, name, wrapper)
        self.active = True
        return self

    def __exit__(self, *exc) -> None:
        self.active = False
        for name, orig in self._orig.items():
            setattr(dist, name, orig)
        self._orig.clear()

    def row(self) -> Dict[str, object]:
        """This rank's record (picklable): per-collective sent bytes and all-reduce payloads."""
        return {"sent": {k: v.copy() for k, v in self.sent.items()},
                "allreduce": list(self.allreduce)}


# argument names of the wrapped functions, in order (torch 2.x signatures)
_SIGNATURES = {
    "all_to_all_single": ("output", "input", "output_split_sizes", "input_split_sizes", "group"),
    "all_to_all": ("output_tensor_list", "input_tensor_list", "group"),
    "reduce_scatter": ("output", "input_list", "op", "group"),
    "reduce_scatter_tensor": ("output", "input", "op", "group"),
    "all_gather": ("tensor_list", "tensor", "group"),
    "all_gather_into_tensor": ("output_tensor", "input_tensor", "group"),
    "all_reduce": ("tensor", "op", "group"),
}


def measured_matrix(rows: Sequence[Mapping[str, object]],
                    topology: HierarchicalTopology) -> np.ndarray:
    """``[world, world]`` bytes from every rank's :meth:`CommCounter.row` (all-reduces spread by
    :func:`.estimators.allreduce_matrix`; every rank must report the same payloads)."""
    W = topology.world_size
    if len(rows) != W:
        raise ValueError(f"measured_matrix: {len(rows)} rows for world size {W}")
    m = np.zeros((W, W))
    for r, row in enumerate(rows):
        for sent in row["sent"].values():  # type: ignore[union-attr]
            m[r] += sent
    payloads = [tuple(row["allreduce"]) for row in rows]  # type: ignore[arg-type]
    if len(set(payloads)) != 1:
        raise ValueError(f"measured_matrix: ranks all-reduced different payloads {payloads}")
    for size in payloads[0]:
        m += allreduce_matrix(float(size), topology)
    return m


def compare(estimate: PlanCost, measured: np.ndarray) -> Dict[str, float]:
    """Estimated vs measured intra- and inter-host bytes per step; ``error`` is the larger
    relative error of the two (a class with no measured bytes counts only if estimated)."""
    same = estimate.topology.same_host()
    off = ~np.eye(len(same), dtype=bool)
    meas_intra = float(measured[same & off].sum())
    meas_inter = float(measured[~same].sum())
    out = {"intra_est": estimate.intra_bytes, "intra_measured": meas_intra,
           "inter_est": estimate.inter_bytes, "inter_measured": meas_inter}
    errs = []
    for k in ("intra", "inter"):
        est, meas = out[f"{k}_est"], out[f"{k}_measured"]
        err = abs(est - meas) / meas if meas > 0 else (0.0 if est == 0 else float("inf"))
        out[f"{k}_error"] = err
        errs.append(err)
    out["error"] = max(errs)
    return out


# ---------------------------------------------------------------------- the workload

DIM = 8


def validation_tables() -> List[TableRow]:
    """Pooled (``ebc``): user, hot (a tiny table), big (two features); sequence (``ec``):
    item, tag (a tiny table).  Mean ids per sample in ``pooling``."""
    return [
        TableRow("user", 64, DIM, (1.0,), ("f_user",)),
        TableRow("hot", 8, DIM, (2.0,), ("f_hot",)),
        TableRow("big", 4000, DIM, (3.0, 1.0), ("f_big_a", "f_big_b")),
        TableRow("item", 3000, DIM, (6.0,), ("f_item",), pooled=False),
        TableRow("tag", 8, DIM, (4.0,), ("f_tag",), pooled=False),
    ]


# None: the planner's own plan; the forced ones run every sharding type, pooled and sequence
VALIDATION_PLANS: Dict[str, Optional[Dict[str, str]]] = {
    "ours": None,
    "forced_a": {"user": "table_row_wise", "hot": "data_parallel", "big": "grid_shard",
                 "item": "row_wise", "tag": "table_wise"},
    "forced_b": {"user": "column_wise", "hot": "row_wise", "big": "table_wise",
                 "item": "column_wise", "tag": "data_parallel"},
}
VALIDATION_BATCH = 64  # per rank: enough ids per rank pair for the mean to be the estimate's
VALIDATION_MEMORY = 600_000  # bytes per device: "big" (4000 x 8 fp32) cannot be data parallel


def validation_topology(compute_device: str = "cpu",
                        memory_bytes: int = VALIDATION_MEMORY) -> HierarchicalTopology:
    """2 hosts x 2 devices (the world-4 test layout, LOCAL_WORLD_SIZE=2), cpu preset links."""
    return HierarchicalTopology.from_preset("cpu", hosts=2, devices_per_host=2,
                                            memory_bytes=memory_bytes,
                                            compute_device=compute_device)


def validation_constraints(forced: Optional[Mapping[str, str]] = None
                           ) -> Dict[str, "ParameterConstraints"]:
    """Pooling factors of :func:`validation_tables` (column shards >= 4 wide), and one sharding
    type per table when ``forced``."""
    from torchrec.distributed.planner import ParameterConstraints

    return {t.name: ParameterConstraints(pooling_factors=list(t.pooling), min_partition=4,
                                         sharding_types=[forced[t.name]] if forced else None)
            for t in validation_tables()}


@dataclasses.dataclass
class ValidationBatch:
    bags: KeyedJaggedTensor
    seqs: KeyedJaggedTensor
    labels: torch.Tensor

    def to(self, device: torch.device) -> "ValidationBatch":
        return ValidationBatch(self.bags.to(device), self.seqs.to(device), self.labels.to(device))


class ValidationModel(nn.Module):
    """EBC + EC of :func:`validation_tables`, sequence outputs summed per sample, a linear head
    and a logistic loss; ``forward(batch)`` returns the loss."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        tables = validation_tables()
        self.ebc = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                                       feature_names=list(t.features)) for t in tables if t.pooled],
            device=device)
        self.ec = EmbeddingCollection(
            tables=[EmbeddingConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                                    feature_names=list(t.features))
                    for t in tables if not t.pooled],
            device=device)
        self.bag_features = [f for t in tables if t.pooled for f in t.features]
        self.seq_features = [f for t in tables if not t.pooled for f in t.features]
        width = DIM * sum(len(t.features) for t in tables)
        self.head = nn.Linear(width, 1, device=device)

    def forward(self, batch: ValidationBatch) -> torch.Tensor:
        pooled = self.ebc(batch.bags)  # by key: a sharded EBC orders its outputs by shard
        parts = [pooled[f] for f in self.bag_features]
        seqs = self.ec(batch.seqs)
        for f in self.seq_features:
            jt = seqs[f]
            rows = torch.repeat_interleave(torch.arange(jt.lengths().numel(),
                                                        device=jt.lengths().device), jt.lengths())
            summed = torch.zeros(jt.lengths().numel(), DIM, device=jt.values().device,
                                 dtype=jt.values().dtype)
            parts.append(summed.index_add(0, rows, jt.values()))
        logits = self.head(torch.cat(parts, dim=1)).squeeze(-1)
        return nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)


def make_batch(rank: int, step: int, batch_size: int) -> ValidationBatch:
    """A seeded batch of one rank and step: lengths uniform in ``[0, 2 * pooling]`` (mean
    ``pooling``), ids uniform over each table's rows."""
    g = torch.Generator().manual_seed(7919 * step + 104729 * rank + 17)
    tables = validation_tables()

    def kjt(pooled: bool) -> KeyedJaggedTensor:
        keys, lengths, values = [], [], []
        for t in tables:
            if t.pooled != pooled:
                continue
            for f, p in zip(t.features, t.pooling):
                n = torch.randint(0, int(2 * p) + 1, (batch_size,), generator=g)
                keys.append(f)
                lengths.append(n)
                values.append(torch.randint(0, t.rows, (int(n.sum()),), generator=g))
        return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.cat(values),
                                                   lengths=torch.cat(lengths))

    return ValidationBatch(kjt(True), kjt(False),
                           torch.randint(0, 2, (batch_size,), generator=g).float())


LR = 0.5


def local_pieces(dmp: nn.Module) -> Dict[str, List[Tuple[List[int], torch.Tensor]]]:
    """{state key: [(global offsets, local tensor)]} of a sharded model's tables on this rank:
    a ShardedTensor's local shards; a DTensor (what a 2-D ``DMPCollection`` returns) by its
    local shards wrapper's offsets, else by the shards its (remapped) plan puts on this rank;
    a plain tensor (data parallel) whole.  The tensors are the model's own (writing them
    writes the tables)."""
    rank = dist.get_rank()
    out: Dict[str, List[Tuple[List[int], torch.Tensor]]] = {}
    for key, value in dmp.state_dict().items():
        if not key.startswith(("ebc.", "ec.")):
            continue
        pieces = sharded_state.local_pieces(value)
        if pieces is not None:
            out[key] = pieces
        else:  # a DTensor without offsets: the (remapped) plan says where it goes
            module, _, table, _ = key.split(".")
            ps = dmp.plan.plan[module][table]  # type: ignore[union-attr,index]
            mine = [m for m in ps.sharding_spec.shards if m.placement.rank() == rank]
            local = value.to_local()
            if len(mine) > 1:
                raise ValueError(f"local_pieces: {key} has {len(mine)} shards on rank {rank}; "
                                 "a DTensor's local tensor holds at most one here")
            if mine and list(local.shape) != list(mine[0].shard_sizes):
                raise ValueError(f"local_pieces: {key}: local tensor {list(local.shape)}, "
                                 f"plan shard {list(mine[0].shard_sizes)}")
            out[key] = [(list(mine[0].shard_offsets), local)] if mine else []
    return out


@torch.no_grad()
def load_state(dmp: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy an unsharded model's ``state`` into the sharded ``dmp``: tables into their local
    pieces, the dense parameters whole."""
    pieces = local_pieces(dmp)
    for key, value in dmp.state_dict().items():
        for offsets, t in pieces.get(key, [([0] * value.dim(), value)]):
            t.copy_(state[key][tuple(slice(o, o + n) for o, n in zip(offsets, t.shape))])


def train_planned(plan: ShardingPlan, device: torch.device, steps: int, batch_size: int,
                  count: bool = True,
                  init: Optional[Callable[[nn.Module], None]] = None,
                  wrap: Optional[Callable[[nn.Module, ShardingPlan, list], nn.Module]] = None
                  ) -> Dict[str, object]:
    """Train :class:`ValidationModel` under ``plan`` for ``steps`` steps on this rank (the
    process group is set up): fused SGD on the tables, SGD on the head.  Returns ``losses``,
    ``shards`` ({state key: [(offsets, cpu tensor)]} of the rank's tables after training) and,
    with ``count``, ``comm`` (this rank's :meth:`CommCounter.row` over the steps).  ``init`` is
    called with the sharded model before training (to load weights).  ``wrap(model, plan,
    sharders)`` shards the model (default: ``DistributedModelParallel``; a 2-D
    :class:`.collection.TwoDimModelParallel`'s ``step_done`` runs after every step)."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    rank = dist.get_rank()
    model = ValidationModel(torch.device("meta"))
    apply_optimizer_in_backward(torch.optim.SGD,
                                list(model.ebc.parameters()) + list(model.ec.parameters()),
                                {"lr": LR})
    sharders = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
    if wrap is None:
        dmp = DistributedModelParallel(model, device=device, plan=plan, sharders=sharders)
    else:
        dmp = wrap(model, plan, sharders)
    step_done = getattr(dmp, "step_done", None)
    if init is not None:
        init(dmp)
    dense = [p for _, p in in_backward_optimizer_filter(dmp.named_parameters())]
    opt = torch.optim.SGD(dense, lr=LR)
    counter = CommCounter(dist.get_world_size())
    if count:  # TorchRec wraps each data-parallel lookup in a DDP of its own (in _lookups)
        for m in dmp.modules():
            for lookup in getattr(m, "_lookups", None) or ():
                if isinstance(lookup, nn.parallel.DistributedDataParallel):
                    lookup.register_comm_hook(None, counter.ddp_hook())
    losses = []
    with counter if count else contextlib.nullcontext():
        for step in range(steps):
            batch = make_batch(rank, step, batch_size).to(device)
            loss = dmp(batch)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if step_done is not None:
                step_done()
            losses.append(float(loss.detach().cpu()))
    shards = {key: [(o, t.detach().cpu().clone()) for o, t in pieces]
              for key, pieces in local_pieces(dmp).items()}
    out: Dict[str, object] = {"losses": losses, "shards": shards}
    if count:
        out["comm"] = counter.row()
    return out
