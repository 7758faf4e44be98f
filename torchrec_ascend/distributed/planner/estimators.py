"""The cost model: bytes each collective moves between every pair of ranks, per step, priced
separately on intra- and inter-host links; lookup time; memory per rank.

For one table (``T``: its per-rank ``samples`` = sum of feature batch sizes, ``ids`` = mean ids
per rank and step, ``N`` rows, shard ``s`` with ``rows_s`` x ``cols_s`` on rank ``o_s``; ``e``:
bytes of an output element, ``ib`` / ``lb``: bytes of an id / a length) it builds ``[world,
world]`` matrices ``M[src, dst]`` (bytes per step) for the phases TorchRec 1.8 runs:

* ``input`` (the KJT all-to-all): every rank sends each shard owner ``samples * lb`` lengths and
  ``ids * ib * rows_s / N`` ids (table-/column-wise: all ids; row-wise / table-row-wise / grid:
  the ids of the shard's row block); plus, once per (module, sharding type), the splits
  exchange: 3 int64 per rank pair (4 with weights);
* ``forward`` (output dist): sequence tables send each id's ``cols_s`` embedding from its owner
  to the requesting rank; pooled table-/column-/row-wise shards send every rank its samples'
  (partial) pooled vectors, ``samples * cols_s * e`` (row-wise: a reduce-scatter, so world
  times table-wise's bytes); pooled table-row-wise / grid: a reduce-scatter inside the owning
  host (``hosts * samples * cols * e`` per peer) then an all-to-all between same-local-rank
  peers (``samples * cols * e``);
* ``backward``: the transpose of ``forward`` (gradients take the way back);
* ``grad_sync``: data-parallel tables all-reduce their gradient, ``S = rows * dim * weight
  bytes``, by :func:`allreduce_matrix`.

Time is counted in three phases: input, forward, and backward together with grad_sync (DDP
all-reduces while the backward runs). A phase takes, on each rank, ``max(sent, received) /
bandwidth`` on each link class (links are full duplex), the slowest rank sets the phase time,
and each collective call adds its link's latency. Lookups are memory bound: ``ids on the shard *
cols * weight bytes * (1 + bwd multiplier) / memory bandwidth``. Memory per rank: weights +
optimizer state (fp32, per element or per row, :data:`.types.OPTIMIZERS`) + ``buffer_copies`` x
(received ids + output embeddings + their gradients) (+ a dense gradient of data-parallel
tables).

:class:`HierarchicalShardEstimator` is the TorchRec ``ShardEstimator`` that writes these
estimates into the enumerated sharding options (storage and perf of each shard).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from torchrec.distributed.planner.types import (
    Perf,
    ShardEstimator,
    ShardingOption,
    SharderDataMap,
    Storage,
    Topology,
)
from torchrec.distributed.types import ShardingType

from .topology import HierarchicalTopology
from .types import (
    HOST_GROUP_TYPES,
    HierarchicalPlannerError,
    OPTIMIZERS,
    PlacedTable,
    ShardSpec,
    TableWorkload,
    check_ranks,
    optimizer_of,
)

__all__ = [
    "PHASES",
    "TIME_PHASES",
    "CostModel",
    "PlanCost",
    "Loads",
    "link_time",
    "allreduce_matrix",
    "canonical_placement",
    "table_spec_from_option",
    "HierarchicalShardEstimator",
]

PHASES = ("input", "forward", "backward", "grad_sync")
TIME_PHASES = ("input", "forward", "backward")  # backward includes grad_sync
DP = ShardingType.DATA_PARALLEL.value
_SPLITS_INT64 = 3  # lengths splits, values splits, stride (KJTAllToAll's splits exchange)
# rows of Loads.link[phase]
LINK_ROWS = ("intra_sent", "intra_recv", "inter_sent", "inter_recv")

def allreduce_matrix(size: float, topology: HierarchicalTopology,
                     ranks: Optional[Sequence[int]] = None) -> np.ndarray:
    """Bytes rank i sends rank j to all-reduce ``size`` bytes over ``ranks`` (default: all).

    ``topology.allreduce == "hierarchical"`` (over whole hosts): reduce-scatter in the host,
    reduce-scatter + all-gather of the 1/local slice between same-local-rank peers, all-gather
    in the host: ``2 S / L`` to each host peer, ``2 S / (L H)`` to each cross-host peer (each host
    sends ``2 S (H - 1) / H`` over its inter-host links, the bandwidth optimum).  "direct" (or a
    subset of ranks): a reduce-scatter and an all-gather exchanging ``S / n`` with each of the
    ``n - 1`` other ranks."""
    W, L, H = topology.world_size, topology.devices_per_host, topology.hosts
    out = np.zeros((W, W))
    members = list(range(W)) if ranks is None else sorted(set(int(r) for r in ranks))
    if len(members) < 2:
        return out
    if topology.allreduce == "hierarchical" and len(members) == W:
        local = np.arange(W) % L
        same_host = topology.same_host()
        out[same_host] = 2.0 * size / L
        out[(~same_host) & (local[:, None] == local[None, :])] = 2.0 * size / (L * H)
    else:
        idx = np.array(members)
        out[np.ix_(idx, idx)] = 2.0 * size / len(members)
    np.fill_diagonal(out, 0.0)
    return out


def canonical_placement(table: TableWorkload, sharding_type: str, compute_kernel: str,
                        sizes: Sequence[Tuple[Sequence[int], Sequence[int]]],
                        topology: HierarchicalTopology) -> PlacedTable:
    """A placement of shard ``sizes`` ([(size, offset)]) that prices an option before it has
    ranks: table-/column-wise shard k on rank k; row-wise and data-parallel shard k on rank k;
    table-row-wise / grid column group g on host g (one shard per local rank).  By the
    topology's symmetry any host gives the same inter-host bytes."""
    W, L, H = topology.world_size, topology.devices_per_host, topology.hosts
    shards = []
    if sharding_type in HOST_GROUP_TYPES:
        groups: Dict[int, int] = {}
        for size, offset in sizes:
            g = groups.setdefault(int(offset[1]), len(groups))
            within = sum(1 for s in shards if s.col_offset == int(offset[1]))
            shards.append(ShardSpec(int(size[0]), int(size[1]), int(offset[0]), int(offset[1]),
                                    (g % H) * L + within % L))
    else:
        for k, (size, offset) in enumerate(sizes):
            shards.append(ShardSpec(int(size[0]), int(size[1]), int(offset[0]), int(offset[1]),
                                    k % W))
    return PlacedTable(table, sharding_type, compute_kernel, tuple(shards))


@dataclasses.dataclass
class Loads:
    """Per-rank loads of one table (or of a partial plan): ``link[phase]`` holds the bytes
    each rank sends / receives on each link class (:data:`LINK_ROWS`), ``compute`` its lookup
    seconds, ``memory`` its bytes.  Placement search adds them up (:func:`link_time`)."""

    link: np.ndarray  # [len(PHASES), 4, world]
    compute: np.ndarray  # [world]
    memory: np.ndarray  # [world]


def link_time(link: np.ndarray, compute: np.ndarray, topology: HierarchicalTopology) -> np.ndarray:
    """Estimated step seconds of loads ``link`` ``[..., phases, 4, world]`` and ``compute``
    ``[..., world]``: per phase the slowest rank's ``max(sent, received) / bandwidth`` on each
    link class, summed over the :data:`TIME_PHASES`, plus the slowest rank's lookups
    (latencies excluded)."""
    lk = link[..., :3, :, :].copy()
    lk[..., 2, :, :] += link[..., 3, :, :]  # grad_sync runs with the backward
    per_rank = (np.maximum(lk[..., 0, :], lk[..., 1, :]) / topology.intra_host.bandwidth
                + np.maximum(lk[..., 2, :], lk[..., 3, :]) / topology.inter_host.bandwidth)
    return per_rank.max(-1).sum(-1) + compute.max(-1)


@dataclasses.dataclass
class PlanCost:
    """A priced plan.  Per-rank arrays are indexed by global rank; byte counts are per step
    (forward + backward) and count each byte once, at its sender."""

    topology: HierarchicalTopology
    memory: np.ndarray
    intra_sent: np.ndarray
    inter_sent: np.ndarray
    intra_recv: np.ndarray
    inter_recv: np.ndarray
    comm_s: np.ndarray
    compute_s: np.ndarray
    phase_s: Dict[str, float]  # per TIME_PHASES
    phase_intra: Dict[str, float]  # per PHASES
    phase_inter: Dict[str, float]
    tables: List[Dict[str, object]]

    @property
    def intra_bytes(self) -> float:
        return float(self.intra_sent.sum())

    @property
    def inter_bytes(self) -> float:
        return float(self.inter_sent.sum())

    @property
    def step_comm_s(self) -> float:
        return float(sum(self.phase_s.values()))

    @property
    def step_s(self) -> float:
        return self.step_comm_s + float(self.compute_s.max(initial=0.0))

    @property
    def peak_memory(self) -> float:
        return float(self.memory.max(initial=0.0))


MAX_PRICED_RANKS = 2048
"""The largest world the cost model prices: it keeps ``[world, world]`` byte matrices per
collective phase (2048 ranks: 32 MiB each)."""


class CostModel:
    """Prices placed tables on a :class:`HierarchicalTopology` (module docstring: the model).

    ``tables`` maps table fqn -> :class:`TableWorkload`; the TorchRec components fill it while
    enumerating (:class:`HierarchicalShardEstimator`) and read it to price sharding options.
    A topology of more than :data:`MAX_PRICED_RANKS` ranks is refused
    (:class:`HierarchicalPlannerError`) before anything is allocated."""

    def __init__(self, topology: HierarchicalTopology, *, index_bytes: int = 8,
                 length_bytes: int = 8, buffer_copies: int = 2,
                 bwd_compute_multiplier: float = 2.0) -> None:
        for name, v in (("index_bytes", index_bytes), ("length_bytes", length_bytes)):
            if v not in (4, 8):
                raise ValueError(f"{name}={v}: must be 4 (int32) or 8 (int64)")
        if buffer_copies < 0:
            raise ValueError(f"buffer_copies={buffer_copies}: must be >= 0")
        if bwd_compute_multiplier < 0:
            raise ValueError(f"bwd_compute_multiplier={bwd_compute_multiplier}: must be >= 0")
        if topology.world_size > MAX_PRICED_RANKS:
            raise HierarchicalPlannerError(
                f"topology: {topology.hosts} hosts x {topology.devices_per_host} devices = "
                f"{topology.world_size} ranks; the cost model prices every pair of ranks and "
                f"plans at most {MAX_PRICED_RANKS} ranks")
        self.topology = topology
        self.index_bytes = index_bytes
        self.length_bytes = length_bytes
        self.buffer_copies = buffer_copies
        self.bwd_compute_multiplier = bwd_compute_multiplier
        self.tables: Dict[str, TableWorkload] = {}
        self._last_price: Optional[Tuple[tuple, PlanCost]] = None
        self.loads_cache: Dict[tuple, "Loads"] = {}  # canonical unit loads (partitioners.Placer)
        same = topology.same_host()
        self._intra = same & ~np.eye(topology.world_size, dtype=bool)
        self._inter = ~same

    # ------------------------------------------------------------------ one table

    def _id_bytes(self, t: TableWorkload) -> int:
        return self.index_bytes + (4 if t.weighted else 0)

    def traffic(self, pt: PlacedTable) -> Dict[str, np.ndarray]:
        """``{phase: [world, world] bytes}`` of one table (diagonal: rank-local, no link)."""
        topo = self.topology
        check_ranks([pt], topo.world_size)
        W, L, H = topo.world_size, topo.devices_per_host, topo.hosts
        t = pt.table
        m = {p: np.zeros((W, W)) for p in PHASES}
        if pt.sharding_type == DP:
            m["grad_sync"] = allreduce_matrix(float(t.weight_size), topo, pt.ranks)
            return m
        e = t.output_bytes
        for s in pt.shards:
            frac = s.rows / t.rows
            m["input"][:, s.rank] += (t.samples * self.length_bytes
                                      + t.ids * self._id_bytes(t) * frac)
            if not t.pooled:
                m["forward"][s.rank, :] += t.ids * frac * s.cols * e
        if t.pooled and pt.sharding_type in HOST_GROUP_TYPES:
            for host, cols, group in _host_groups(pt, topo):
                peers = np.array(topo.host_ranks(host))
                for s in group:  # reduce-scatter inside the host: peer l' gets its cross group
                    m["forward"][s.rank, peers] += H * t.samples * cols * e
                for j in peers:  # all-to-all between same-local-rank peers of every host
                    m["forward"][j, np.arange(H) * L + j % L] += t.samples * cols * e
        elif t.pooled:
            for s in pt.shards:
                m["forward"][s.rank, :] += t.samples * s.cols * e
        m["backward"] = m["forward"].T.copy()
        return m

    def memory(self, pt: PlacedTable) -> np.ndarray:
        """Bytes per rank: weights, optimizer state, buffers (module docstring)."""
        W = self.topology.world_size
        t = pt.table
        per_el, per_row = OPTIMIZERS[t.optimizer]
        out = np.zeros(W)
        dp = pt.sharding_type == DP
        for s in pt.shards:
            frac = s.rows / t.rows
            weights = s.rows * s.cols * t.weight_bytes
            state = 4 * (per_el * s.rows * s.cols + per_row * s.rows)
            senders = 1 if dp else W
            ids_in = senders * (t.samples * self.length_bytes
                                + t.ids * self._id_bytes(t) * (1.0 if dp else frac))
            vectors = t.samples if t.pooled else t.ids * (1.0 if dp else frac)
            emb_out = senders * vectors * s.cols * t.output_bytes
            grad = weights if dp else 0
            out[s.rank] += weights + state + grad + self.buffer_copies * (ids_in + 2 * emb_out)
        return out

    def compute(self, pt: PlacedTable) -> np.ndarray:
        """Lookup seconds per rank (forward + backward, memory bound)."""
        topo = self.topology
        t = pt.table
        out = np.zeros(topo.world_size)
        dp = pt.sharding_type == DP
        for s in pt.shards:
            ids = t.ids if dp else topo.world_size * t.ids * s.rows / t.rows
            read = ids * s.cols * t.weight_bytes
            dense_grad = s.rows * s.cols * t.weight_bytes if dp else 0.0
            out[s.rank] += (read * (1 + self.bwd_compute_multiplier) + dense_grad) \
                / topo.memory_bandwidth
        return out

    def loads(self, pt: PlacedTable) -> Loads:
        """The table's :class:`Loads`."""
        link = np.stack([self._link_rows(m) for m in self.traffic(pt).values()])
        return Loads(link, self.compute(pt), self.memory(pt))

    def _link_rows(self, m: np.ndarray) -> np.ndarray:
        a, b = m * self._intra, m * self._inter
        return np.stack([a.sum(1), a.sum(0), b.sum(1), b.sum(0)])

    # ------------------------------------------------------------------ whole plans

    def placed(self, so: ShardingOption) -> PlacedTable:
        """A partitioned TorchRec sharding option, with its table's spec."""
        if so.fqn not in self.tables:
            raise KeyError(f"no TableWorkload for {so.fqn!r}: enumerate with "
                           "HierarchicalShardEstimator first")
        return PlacedTable.from_sharding_option(so, self.tables[so.fqn])

    def supports(self, sharding_type: str) -> bool:
        """Every TorchRec sharding type is priced."""
        return True

    # hooks of :meth:`price` (a replicated plan, :mod:`.two_dim`, prices a whole world from
    # one host group's tables)

    @property
    def price_topology(self) -> HierarchicalTopology:
        """The topology :meth:`price` reports on (its per-rank arrays, its masks)."""
        return self.topology

    def rank_memory(self, pt: PlacedTable) -> np.ndarray:
        """:meth:`memory` on :attr:`price_topology`'s ranks."""
        return self.memory(pt)

    def rank_compute(self, pt: PlacedTable) -> np.ndarray:
        """:meth:`compute` on :attr:`price_topology`'s ranks."""
        return self.compute(pt)

    def split_pairs(self) -> np.ndarray:
        """Rank pairs that exchange the KJT all-to-all's splits (every pair of the world)."""
        return ~np.eye(self.price_topology.world_size, dtype=bool)

    def table_row(self, pt: PlacedTable, total: np.ndarray) -> Dict[str, object]:
        """One table's row of :attr:`PlanCost.tables` (``total``: its bytes over all phases)."""
        topo = self.price_topology
        return {
            "table": pt.table.fqn, "sharding_type": pt.sharding_type,
            "compute_kernel": pt.compute_kernel, "ranks": sorted(set(pt.ranks)),
            "hosts": sorted({topo.host_of(r) for r in pt.ranks}),
            "memory_bytes": float(self.rank_memory(pt).sum()),
            "intra_host_bytes": float((total * self._intra).sum()),
            "inter_host_bytes": float((total * self._inter).sum()),
        }

    def price(self, placed: Sequence[PlacedTable]) -> PlanCost:
        """Every phase's traffic, times, memory and compute of a whole plan."""
        topo = self.price_topology
        W = topo.world_size
        mats = {p: np.zeros((W, W)) for p in PHASES}
        memory, compute = np.zeros(W), np.zeros(W)
        rows: List[Dict[str, object]] = []
        groups: Dict[Tuple[str, str], bool] = {}
        for pt in placed:
            tm = self.traffic(pt)
            for p in PHASES:
                mats[p] += tm[p]
            memory += self.rank_memory(pt)
            compute += self.rank_compute(pt)
            rows.append(self.table_row(pt, sum(tm.values())))
            if pt.sharding_type != DP:
                key = (pt.table.module, pt.sharding_type)
                groups[key] = groups.get(key, False) or pt.table.weighted
        splits = self.split_pairs()
        for (module, stype), weighted in groups.items():
            mats["input"][splits] += (_SPLITS_INT64 + int(weighted)) * 8
        if any(pt.sharding_type == DP for pt in placed):
            groups[("", DP)] = False
        latency = self.latency(groups)
        intra_s, intra_r = np.zeros(W), np.zeros(W)
        inter_s, inter_r = np.zeros(W), np.zeros(W)
        comm = np.zeros(W)
        phase_s, phase_intra, phase_inter = {}, {}, {}
        for p in PHASES:
            a, b = mats[p] * self._intra, mats[p] * self._inter
            phase_intra[p], phase_inter[p] = float(a.sum()), float(b.sum())
            intra_s += a.sum(1)
            intra_r += a.sum(0)
            inter_s += b.sum(1)
            inter_r += b.sum(0)
        mats["backward"] = mats["backward"] + mats["grad_sync"]
        for p in TIME_PHASES:
            a, b = mats[p] * self._intra, mats[p] * self._inter
            t = (np.maximum(a.sum(1), a.sum(0)) / topo.intra_host.bandwidth
                 + np.maximum(b.sum(1), b.sum(0)) / topo.inter_host.bandwidth)
            phase_s[p] = float(t.max(initial=0.0)) + latency[p]
            comm += t + latency[p]
        return PlanCost(topo, memory, intra_s, inter_s, intra_r, inter_r, comm, compute,
                        phase_s, phase_intra, phase_inter, rows)

    def latency(self, groups: Mapping[Tuple[str, str], bool]) -> Dict[str, float]:
        """Latency seconds per time phase of the collective calls of ``groups`` ({(module,
        sharding type): weighted}; data parallel as one group): per group the KJT all-to-all
        (splits, lengths, values, weights) and one output call each way (two for table-row-wise
        / grid: a reduce-scatter in the host, then an all-to-all); the gradient all-reduce."""
        topo = self.topology
        link = topo.inter_host.latency if topo.hosts > 1 else topo.intra_host.latency
        out = {p: 0.0 for p in TIME_PHASES}
        for (_, stype), weighted in groups.items():
            if stype == DP:
                out["backward"] += link
                continue
            out["input"] += (3 + int(weighted)) * link
            calls = link + (topo.intra_host.latency if stype in HOST_GROUP_TYPES else 0.0)
            out["forward"] += calls
            out["backward"] += calls
        return out

    def price_options(self, options: Sequence[ShardingOption]) -> PlanCost:
        """:meth:`price` of partitioned sharding options (the last result is reused for the
        same placement: the perf model and the proposer both ask)."""
        placed = [self.placed(so) for so in options]
        key = tuple((pt.table, pt.sharding_type, pt.compute_kernel, pt.shards) for pt in placed)
        if self._last_price is None or self._last_price[0] != key:
            self._last_price = (key, self.price(placed))
        return self._last_price[1]


def _host_groups(pt: PlacedTable, topo: HierarchicalTopology):
    """(host, cols, shards) per column group of a table-row-wise / grid table; every shard of a
    group must be on one host."""
    by_col: Dict[int, List[ShardSpec]] = defaultdict(list)
    for s in pt.shards:
        by_col[s.col_offset].append(s)
    for col in sorted(by_col):
        group = by_col[col]
        hosts = {topo.host_of(s.rank) for s in group}
        if len(hosts) != 1:
            raise ValueError(f"table {pt.table.fqn}: {pt.sharding_type} column group at offset "
                             f"{col} spans hosts {sorted(hosts)}; it must fill one host")
        yield hosts.pop(), group[0].cols, group


# ---------------------------------------------------------------------- TorchRec estimator

_CLASS_OPTIMIZERS = {"sgd": "sgd", "rowwiseadagrad": "rowwise_adagrad", "adagrad": "adagrad",
                     "adam": "adam", "adamw": "adam"}
_TBE_OPTIMIZERS = {"exact_sgd": "sgd", "sgd": "sgd", "exact_rowwise_adagrad": "rowwise_adagrad",
                   "rowwise_adagrad": "rowwise_adagrad", "exact_adagrad": "adagrad",
                   "adagrad": "adagrad"}


def _infer_optimizer(so: ShardingOption, sharder_data_map: Optional[SharderDataMap]) -> str:
    """The table's optimizer: ``apply_optimizer_in_backward``'s class on the parameter, else the
    sharder's fused ``optimizer``, else TBE's default (SGD).  Unknown optimizers count as Adam
    (two states per element: never less memory than they use, for those TorchRec has)."""
    classes = getattr(so.tensor, "_optimizer_classes", None)
    if classes:
        return _CLASS_OPTIMIZERS.get(classes[0].__name__.lower(), "adam")
    data = (sharder_data_map or {}).get(so.module_type_key)
    opt = data.fused_params.get("optimizer") if data is not None else None
    if opt is None:
        return "sgd"
    name = getattr(opt, "name", str(opt)).lower()
    return _TBE_OPTIMIZERS.get(name, "adam")


def table_spec_from_option(so: ShardingOption, batch_sizes: Optional[Sequence[int]] = None,
                           optimizer: Optional[str] = None,
                           sharder_data_map: Optional[SharderDataMap] = None) -> TableWorkload:
    """The :class:`TableWorkload` of an enumerated TorchRec sharding option (its tensor, pooling
    factors, batch size, pooling, weights, output dtype; the optimizer given or inferred)."""
    rows, dim = int(so.tensor.shape[0]), int(so.tensor.shape[1])
    pfs = tuple(float(p) for p in so.input_lengths)
    bs = tuple(int(b) for b in batch_sizes) if batch_sizes else (int(so.batch_size),) * len(pfs)
    out_bytes = 4
    if so.output_dtype is not None:
        from torchrec.modules.embedding_configs import data_type_to_dtype

        out_bytes = int(data_type_to_dtype(so.output_dtype).itemsize)
    return TableWorkload(
        module=so.path, name=so.name, rows=rows, dim=dim, pooling_factors=pfs, batch_sizes=bs,
        pooled=bool(so.is_pooled), weighted=bool(so.is_weighted),
        weight_bytes=int(so.tensor.element_size()), output_bytes=out_bytes,
        optimizer=optimizer_of(optimizer) if optimizer else _infer_optimizer(so,
                                                                             sharder_data_map))


class HierarchicalShardEstimator(ShardEstimator):
    """TorchRec ``ShardEstimator``: records each table's spec in ``cost_model.tables`` and sets
    every shard's ``storage`` (memory model, HBM on npu/cuda, DDR on cpu) and ``perf`` (the
    shard's rank's seconds under :func:`canonical_placement`: compute, and link time of the
    traffic it sends / receives per phase)."""

    def __init__(self, topology: Topology, constraints=None, *,
                 cost_model: Optional[CostModel] = None,
                 optimizer: Optional[str] = None) -> None:
        self._topology = topology
        self._constraints = constraints or {}
        self.cost_model = cost_model if cost_model is not None else CostModel(
            HierarchicalTopology.from_torchrec(topology))
        self._optimizer = optimizer

    def estimate(self, sharding_options: List[ShardingOption],
                 sharder_data_map: Optional[SharderDataMap] = None) -> None:
        cm = self.cost_model
        topo = cm.topology
        on_cpu = topo.compute_device == "cpu"
        for so in sharding_options:
            c = self._constraints.get(so.name)
            spec = table_spec_from_option(so, c.batch_sizes if c else None, self._optimizer,
                                          sharder_data_map)
            cm.tables[so.fqn] = spec
            pt = canonical_placement(spec, so.sharding_type, so.compute_kernel,
                                     [(s.size, s.offset) for s in so.shards], topo)
            mem = cm.memory(pt)
            comp = cm.compute(pt)
            tm = cm.traffic(pt)
            for shard, placed in zip(so.shards, pt.shards):
                r = placed.rank
                b = int(np.ceil(mem[r] / max(1, sum(1 for p in pt.shards if p.rank == r))))
                shard.storage = Storage(hbm=0 if on_cpu else b, ddr=b if on_cpu else 0)
                link = {p: _rank_link_seconds(cm, tm[p], r) for p in PHASES}
                shard.perf = Perf(fwd_compute=comp[r] / (1 + cm.bwd_compute_multiplier),
                                  fwd_comms=link["forward"],
                                  bwd_compute=comp[r] * cm.bwd_compute_multiplier
                                  / (1 + cm.bwd_compute_multiplier),
                                  bwd_comms=link["backward"] + link["grad_sync"],
                                  input_dist_comms=link["input"])


def _rank_link_seconds(cm: CostModel, m: np.ndarray, r: int) -> float:
    topo = cm.topology
    intra = max((m[r] * cm._intra[r]).sum(), (m[:, r] * cm._intra[:, r]).sum())
    inter = max((m[r] * cm._inter[r]).sum(), (m[:, r] * cm._inter[:, r]).sum())
    return float(intra / topo.intra_host.bandwidth + inter / topo.inter_host.bandwidth)
