"""Move a jagged batch between ranks so that every rank gets about the same cost.

:class:`AllToAllBalancer` runs, on every rank of the process group (a collective):

1. validate the local batch and price its sequences (costs must come out finite and >= 0, checked
   here, where they are computed); one ``all_gather`` of a header ``[B, schema hash, error flag,
   words]`` plus each sample's cost (float64 bits) and lengths, padded to a capacity every rank
   learns alike (a second ``all_gather`` only when a batch outgrows it).  Bad input, or ranks that
   disagree on field names/dtypes/shapes, raise the same ``ValueError`` on every rank instead of
   hanging.  The field layout (its :class:`~.packing.Field` list and hash) is cached per layout;
2. plan the global batch with :class:`~.assign.RankPlanner`'s rules (deterministic, so every
   rank computes the same plan; costs are computed where the sample lives, so ranks need not
   share a cost model; the gathered data is not checked a second time);
3. work out the exchange and pack the send buffer in one call (:func:`~.packing.plan_pack`:
   the csrc kernel ``lb_exchange_pack`` on the CPU), then one ``all_to_all_single`` of that byte
   buffer: per destination rank, the token fields of each jagged group, then the sample fields
   (names sorted), every segment padded to 16 bytes.  Lengths are not sent (every rank has them
   from step 1); the receiver copies every field out in one call (``lb_unpack``).

A rank receives its samples ordered by (source rank, source index), i.e. by global index (rank
``r``'s samples are global indices ``sum(B[:r]) ..``).  :meth:`BalancedBatch.restore` sends
per-sample results back (one ``all_to_all_single``) in the original order on the original rank.
The exchange moves data: fields must not require grad (balance inputs before the model), and
``restore`` is not differentiable (it is for metrics and per-sample outputs).

Without an initialised process group (one process) the balancer is the identity.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

from .assign import RankPlanner
from .cost import HSTUCostModel
from .packing import ExchangePlan, Field, plan_pack, scatter_rows, to_bytes, token_index, unpack

__all__ = ["AllToAllBalancer", "BalancedBatch", "PendingRestore"]

_HEADER = 4  # int64 words: local batch size, schema hash, error flag, metadata words
_TARGETS = "\0num_targets"  # internal field name of num_targets (no user name starts with NUL)


# ---------------------------------------------------------------------- collectives
def _pg(group):
    """The process group object of ``group`` (None: the default group)."""
    return dist.group.WORLD if group is None else group


def _world(group) -> Tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        return 1, 0
    pg = _pg(group)
    return pg.size(), pg.rank()


# The collectives below call the process group's own methods (``ProcessGroup.all_gather_single`` /
# ``alltoall_base``, what ``torch.distributed``'s functions end in) and skip those functions'
# Python argument handling: a few dozen microseconds of CPU per call, three calls per step.
def _all_gather(t: torch.Tensor, world: int, group) -> torch.Tensor:
    """``[world, *t.shape]``: every rank's ``t`` (same shape everywhere)."""
    if world == 1:
        return t.unsqueeze(0)
    out = torch.empty((world * t.shape[0],) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    gather = getattr(_pg(group), "all_gather_single", None)
    if gather is not None:
        gather(out, t.contiguous()).wait()  # concatenated form: gloo refuses the stacked one
    else:  # older torch
        (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, t.contiguous(), group=group)
    return out.reshape((world,) + tuple(t.shape))


def _all_to_all(send: torch.Tensor, send_splits: List[int], recv_splits: List[int], world: int,
                group, async_op: bool = False):
    """One ``all_to_all_single`` along dim 0 (the identity for one rank); ``async_op``: returns
    ``(recv, work)`` (``work`` None for one rank), the receive buffer filled once ``work.wait()``."""
    if world == 1:
        return (send, None) if async_op else send
    recv = torch.empty((sum(recv_splits),) + tuple(send.shape[1:]), dtype=send.dtype, device=send.device)
    work = _pg(group).alltoall_base(recv, send, recv_splits, send_splits)
    if async_op:
        return recv, work
    work.wait()
    return recv


# ---------------------------------------------------------------------- one exchange
@dataclasses.dataclass
class _Exchange:
    """Who sent which sample where (:class:`~.packing.ExchangePlan`, the same on every rank but
    for ``rank``), with the plan's costs and lengths (host arrays)."""

    world: int
    group: object
    plan: ExchangePlan
    costs: np.ndarray            # [N] float64
    glengths: np.ndarray         # [N, G] lengths of every jagged group

    @property
    def counts(self) -> List[int]:
        return self.plan.counts

    @property
    def owner(self) -> np.ndarray:
        """``[N]`` source rank of every global sample."""
        return np.repeat(np.arange(self.world, dtype=np.int64), self.plan.counts)

    @property
    def local_lengths(self) -> np.ndarray:
        p = self.plan
        return self.glengths[p.start:p.start + p.counts[p.rank]]


# ---------------------------------------------------------------------- result
@dataclasses.dataclass
class BalancedBatch:
    """This rank's share of the balanced global batch.

    ``lengths [B']`` (the input's dtype), ``token_fields`` (``[T', ...]``), ``sample_fields``
    (``[B', ...]``), ``num_targets [B']`` if given; samples in ascending global index.
    ``source_rank`` / ``source_index`` (CPU) say where each sample came from; ``rank_costs`` is
    the plan's cost per rank (float64 ``[world]``) and ``imbalance`` its ``max / mean - 1``."""

    lengths: torch.Tensor
    token_fields: Dict[str, torch.Tensor]
    sample_fields: Dict[str, torch.Tensor]
    num_targets: Optional[torch.Tensor]
    _ex: _Exchange
    _groups: List[Tuple[torch.Tensor, Dict[str, torch.Tensor]]] = dataclasses.field(
        default_factory=list, repr=False)

    @property
    def offsets(self) -> torch.Tensor:
        """``[B' + 1]`` int64 offsets of ``lengths``."""
        out = torch.zeros(self.lengths.numel() + 1, dtype=torch.int64, device=self.lengths.device)
        torch.cumsum(self.lengths.to(torch.int64), 0, out=out[1:])
        return out

    @property
    def source_rank(self) -> torch.Tensor:
        return torch.from_numpy(self._ex.owner[self._ex.plan.recv_global])

    @property
    def source_index(self) -> torch.Tensor:
        ex = self._ex
        starts = np.cumsum(ex.counts) - np.asarray(ex.counts)
        return torch.from_numpy(ex.plan.recv_global - starts[ex.owner[ex.plan.recv_global]])

    @property
    def rank_costs(self) -> torch.Tensor:
        ex = self._ex
        return torch.from_numpy(np.bincount(ex.plan.bins, ex.costs, ex.world).astype(np.float64))

    @property
    def imbalance(self) -> float:
        c = self.rank_costs
        return float(c.max() / c.mean() - 1.0) if float(c.sum()) > 0 else 0.0

    def restore(self, per_sample: torch.Tensor, group=None, *, async_op: bool = False):
        """``per_sample [B', ...]`` (one row per balanced sample, any dtype) -> ``[B, ...]`` on the
        rank the samples came from, in their original order.  Collective: every rank calls it,
        with the same trailing shape and dtype (the row count is checked locally, before the
        collective: pass the right tensor on every rank).  ``group``: the process group (default:
        the one :meth:`AllToAllBalancer.balance` used; give another one when balance calls run
        on another thread meanwhile, e.g. ``BatchBuilder``'s balancing one step ahead: a group's
        collectives must come in the same order on every rank).  ``async_op=True`` returns a
        :class:`PendingRestore` at once (the exchange runs in the background; its ``wait()``
        gives the tensor)."""
        p = self._ex.plan
        return self._send_back(per_sample, p.recv_counts, p.send_counts, p.send_order, "per_sample",
                               group, async_op)

    def restore_tokens(self, per_token: torch.Tensor, group=None, *, async_op: bool = False):
        """``per_token [T', ...]`` (one row per balanced token of ``lengths``) -> ``[T, ...]`` on
        the original rank in the original order.  Collective, like :meth:`restore` (same
        ``group`` / ``async_op``)."""
        ex = self._ex
        order = torch.from_numpy(token_index(ex.local_lengths[:, 0], ex.plan.order))
        return self._send_back(per_token, ex.plan.recv_tokens(0), ex.plan.send_tokens(0), order, "per_token",
                               group, async_op)

    def _send_back(self, t: torch.Tensor, back: List[int], home: List[int], order: torch.Tensor,
                   name: str, group, async_op: bool):
        if not isinstance(t, torch.Tensor) or t.dim() < 1 or t.shape[0] != sum(back):
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name}: expected {sum(back)} rows (this rank's balanced batch), got {shape}")
        ex = self._ex
        d = t.detach()
        rb = d.element_size() * math.prod(d.shape[1:])
        send = to_bytes(d)
        got, work = _all_to_all(send, [n * rb for n in back], [n * rb for n in home], ex.world,
                                ex.group if group is None else group, async_op=True)

        def finish() -> torch.Tensor:
            return scatter_rows(got, order, d)

        pending = PendingRestore(work, finish, send)
        return pending if async_op else pending.wait()


class PendingRestore:
    """A restore issued with ``async_op=True``: :meth:`wait` blocks until the exchange is done
    and returns the restored tensor (the same one on every call)."""

    def __init__(self, work, finish, send: torch.Tensor) -> None:
        self._work, self._finish, self._out = work, finish, None
        self._send = send  # the send buffer lives until the exchange is done

    def done(self) -> bool:
        """Whether :meth:`wait` would not block."""
        return self._out is not None or self._work is None or self._work.is_completed()

    def wait(self) -> torch.Tensor:
        if self._out is None:
            if self._work is not None:
                self._work.wait()
            self._out, self._send = self._finish(), None
        return self._out


# ---------------------------------------------------------------------- balancer
class AllToAllBalancer(RankPlanner):
    """Balance jagged batches across the ranks of a process group by cost (module docstring);
    constructor arguments (cost model, per-rank limits, empty ranks): :class:`~.assign.RankPlanner`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._capacity: Dict[object, int] = {}  # metadata words per process group (None: default)
        self._schemas: Dict[tuple, int] = {}

    # -------------------------------------------------------------- public entry points
    def balance(self, lengths: torch.Tensor, token_fields: Optional[Mapping[str, torch.Tensor]] = None,
                sample_fields: Optional[Mapping[str, torch.Tensor]] = None, group=None, *,
                num_targets: Optional[torch.Tensor] = None) -> BalancedBatch:
        """Balance ``lengths [B]`` with ``token_fields`` (``[sum(lengths), ...]`` each) and
        ``sample_fields`` (``[B, ...]`` each) over ``group``; ``num_targets [B]`` feeds the cost
        model's target term and travels with the samples."""
        return self._balance([(lengths, dict(token_fields or {}))], dict(sample_fields or {}),
                             num_targets, group)

    def balance_jagged(self, jt, sample_fields: Optional[Mapping[str, torch.Tensor]] = None, group=None,
                       *, num_targets: Optional[torch.Tensor] = None):
        """A TorchRec ``JaggedTensor`` (values, lengths, optional weights) in, ``(JaggedTensor,
        BalancedBatch)`` out (the batch carries ``sample_fields`` and :meth:`~BalancedBatch.restore`)."""
        from torchrec.sparse.jagged_tensor import JaggedTensor

        if not isinstance(jt, JaggedTensor):
            raise ValueError(f"jt: expected a torchrec JaggedTensor, got {type(jt).__name__}")
        fields = {"values": jt.values()}
        if jt.weights_or_none() is not None:
            fields["weights"] = jt.weights()
        out = self._balance([(jt.lengths(), fields)], dict(sample_fields or {}), num_targets, group)
        return JaggedTensor(values=out.token_fields["values"], lengths=out.lengths,
                            weights=out.token_fields.get("weights")), out

    def balance_kjt(self, kjt, sample_fields: Optional[Mapping[str, torch.Tensor]] = None, group=None,
                    *, cost_key: Optional[str] = None, num_targets: Optional[torch.Tensor] = None):
        """A TorchRec ``KeyedJaggedTensor`` in (sample ``b`` is column ``b`` of every key; its cost
        comes from the lengths of ``cost_key``, default the first key), ``(KeyedJaggedTensor,
        BalancedBatch)`` out with the same keys; the batch's ``lengths``/``token_fields`` are
        ``cost_key``'s.  Variable-stride KJTs are refused."""
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        if not isinstance(kjt, KeyedJaggedTensor):
            raise ValueError(f"kjt: expected a torchrec KeyedJaggedTensor, got {type(kjt).__name__}")
        if kjt.variable_stride_per_key():
            raise ValueError("kjt: variable stride per key is not supported (every key needs B samples)")
        keys = list(kjt.keys())
        if not keys:
            raise ValueError("kjt: has no keys")
        key = keys[0] if cost_key is None else cost_key
        if key not in keys:
            raise ValueError(f"cost_key: {key!r} is not a key of the KJT ({keys})")
        B = kjt.stride()
        lengths = kjt.lengths().reshape(len(keys), B)
        per_key = kjt.length_per_key()
        values = kjt.values().split(per_key)
        weights = kjt.weights().split(per_key) if kjt.weights_or_none() is not None else None
        order = [keys.index(key)] + [i for i in range(len(keys)) if keys[i] != key]
        groups = []
        for i in order:
            fields = {"values": values[i]}
            if weights is not None:
                fields["weights"] = weights[i]
            groups.append((lengths[i], fields))
        out = self._balance(groups, dict(sample_fields or {}), num_targets, group)
        back = {i: out._groups[j] for j, i in enumerate(order)}
        per = [back[i] for i in range(len(keys))]
        kjt_out = KeyedJaggedTensor(
            keys=keys, values=torch.cat([p[1]["values"] for p in per]),
            weights=torch.cat([p[1]["weights"] for p in per]) if weights is not None else None,
            lengths=torch.cat([p[0] for p in per]), stride=out.lengths.numel())
        return kjt_out, out

    # -------------------------------------------------------------- core
    def _validate(self, groups, sample_fields, num_targets):
        """Local checks -> (schema, tensors in schema order, lengths int64 [B, G], costs float64
        [B]); raises ValueError.  Costs must come out finite and >= 0: the plan trusts them."""
        tensors: List[torch.Tensor] = []
        layout: List[tuple] = []
        dev = groups[0][0].device if isinstance(groups[0][0], torch.Tensor) else None
        B = None
        lens: List[np.ndarray] = []
        for g, (lengths, tok) in enumerate(groups):
            if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1:
                got = tuple(lengths.shape) if isinstance(lengths, torch.Tensor) else type(lengths).__name__
                raise ValueError(f"lengths: expected a 1-D integer tensor, got {got}")
            if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
                raise ValueError(f"lengths: expected an integer dtype, got {lengths.dtype}")
            if lengths.device != dev:
                raise ValueError(f"lengths: on {lengths.device}, the batch is on {dev}")
            if B is not None and lengths.numel() != B:
                raise ValueError(f"lengths: jagged group {g} has {lengths.numel()} samples, expected {B}")
            B = lengths.numel()
            if lengths.dtype == torch.int64 and lengths.device.type == "cpu":
                lc = lengths.numpy()  # integer tensors never require grad
            else:
                lc = lengths.detach().to("cpu", torch.int64).numpy()
            if B and lc.min() < 0:
                raise ValueError(f"lengths: must be >= 0, got min {int(lc.min())}")
            lens.append(lc)
            T = int(lc.sum())
            for name in sorted(tok):
                t = tok[name]
                self._check_tensor("token_fields", name, t, T, "sum(lengths)", dev)
                tensors.append(t)
                layout.append((name, g, t.dtype, tuple(t.shape[1:])))
        for name in sorted(sample_fields):
            t = sample_fields[name]
            self._check_tensor("sample_fields", name, t, B, "len(lengths)", dev)
            tensors.append(t)
            layout.append((name, -1, t.dtype, tuple(t.shape[1:])))
        if num_targets is not None:
            self._check_tensor("num_targets", "", num_targets, B, "len(lengths)", dev)
            tensors.append(num_targets)
            layout.append((_TARGETS, -1, num_targets.dtype, tuple(num_targets.shape[1:])))
        schema = self._schema(tuple(layout), len(groups), groups[0][0].dtype)
        if num_targets is None and type(self.cost_model) is HSTUCostModel:
            # lengths checked above; a, b >= 0 and finite: the costs are finite and >= 0
            costs = self.cost_model.cost_host(lens[0])
        else:  # any cost model (it checks num_targets): check what it returns
            nt = num_targets.detach().cpu() if num_targets is not None else None
            costs = np.asarray(self.cost_model.cost(torch.from_numpy(lens[0]), nt), dtype=np.float64)
            if costs.shape != (B,):
                raise ValueError(f"cost_model: returned shape {tuple(costs.shape)} for {B} sequences")
            if B and not (np.isfinite(costs).all() and costs.min() >= 0):
                raise ValueError("cost_model: returned a non-finite or negative cost")
        out = np.empty((B, len(groups)), dtype=np.int64)
        for g, lc in enumerate(lens):
            out[:, g] = lc
        return schema, tensors, out, costs

    @staticmethod
    def _check_tensor(kind: str, name: str, t, rows: int, what: str, dev) -> None:
        label = f"{kind}[{name!r}]" if name else kind
        if not isinstance(t, torch.Tensor) or t.dim() < 1:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{label}: expected a tensor with a first dimension, got {got}")
        if t.shape[0] != rows:
            raise ValueError(f"{label}: has {t.shape[0]} rows, expected {what} = {rows}")
        if t.device != dev:
            raise ValueError(f"{label}: on {t.device}, the batch (lengths) is on {dev}")
        if t.requires_grad:
            raise ValueError(f"{label}: requires grad; the exchange moves data and is not differentiable "
                             f"(balance the inputs, before the model)")

    def _schema(self, layout: tuple, num_groups: int, lengths_dtype: torch.dtype) -> "_Schema":
        """The batch's fields and a 56-bit hash of its layout, the same in every process (sha1, not
        ``hash``); cached per layout."""
        key = (layout, num_groups, lengths_dtype)
        got = self._schemas.get(key)
        if got is None:
            text = repr((tuple((n, g, str(dt), tr) for n, g, dt, tr in layout), num_groups, str(lengths_dtype)))
            got = self._schemas[key] = _Schema(
                tuple(Field(n, g, dt, tr) for n, g, dt, tr in layout),
                int.from_bytes(hashlib.sha1(text.encode()).digest()[:7], "little"))
        return got

    def _gather_metadata(self, header: List[int], meta: np.ndarray, error: Optional[ValueError],
                         world: int, rank: int, group, dev: torch.device) -> Tuple[np.ndarray, np.ndarray]:
        """One ``all_gather`` of ``[B, schema hash, error flag, words] + metadata`` padded to the
        capacity learnt so far (every rank learns the same); a second one only when some rank's
        metadata outgrows it.  Raises the same error on every rank for bad input.  Returns the
        headers ``[world, 4]`` and metadata ``[world, >= max words]`` (host arrays)."""
        cap = self._capacity.get(group, 0)
        words = meta.size
        send = np.zeros(_HEADER + cap, dtype=np.int64)
        send[:_HEADER] = header + [words]
        if words <= cap:
            send[_HEADER:_HEADER + words] = meta
        got = self._gather_host(send, world, group, dev)
        heads = got[:, :_HEADER]
        rows = heads.tolist()  # a few words per rank: Python lists beat numpy here
        if error is not None:
            raise ValueError(f"rank {rank}: {error}") from error
        if any(r[2] for r in rows):
            bad = [i for i, r in enumerate(rows) if r[2]]
            raise ValueError(f"balance: bad input on rank(s) {bad} (their error says which)")
        if any(r[1] != rows[0][1] for r in rows):
            raise ValueError(f"balance: ranks disagree on the batch's fields, dtypes, trailing shapes "
                             f"or jagged groups (schema hash per rank: {[r[1] for r in rows]})")
        need = max(r[3] for r in rows)
        if need <= cap:
            return heads, got[:, _HEADER:]
        self._capacity[group] = 2 * need  # headroom: the next batches fit in one gather
        body = np.zeros(need, dtype=np.int64)
        body[:words] = meta
        return heads, self._gather_host(body, world, group, dev)

    @staticmethod
    def _gather_host(a: np.ndarray, world: int, group, dev: torch.device) -> np.ndarray:
        """``[world, *a.shape]``: every rank's host array ``a`` (sent from ``dev``)."""
        t = torch.from_numpy(a)
        if dev.type != "cpu":
            return _all_gather(t.to(dev), world, group).cpu().numpy()
        return _all_gather(t, world, group).numpy()

    def _balance(self, groups, sample_fields, num_targets, group) -> BalancedBatch:
        world, rank = _world(group)
        dev = groups[0][0].device if isinstance(groups[0][0], torch.Tensor) else torch.device("cpu")
        G = len(groups)
        error, header, meta = None, [0, 0, 1], np.zeros(0, dtype=np.int64)
        try:
            schema, tensors, lens, costs = self._validate(groups, sample_fields, num_targets)
            header = [costs.size, schema.hash, 0]
            meta = np.empty((costs.size, 1 + G), dtype=np.int64)
            meta[:, 0] = costs.view(np.int64)
            meta[:, 1:] = lens
            meta = meta.reshape(-1)
        except ValueError as exc:
            error = exc
        heads, body = self._gather_metadata(header, meta, error, world, rank, group, dev)
        counts = np.ascontiguousarray(heads[:, 0])
        rows = np.concatenate([body[r, :int(counts[r]) * (1 + G)] for r in range(world)]).reshape(-1, 1 + G)
        gcosts = np.ascontiguousarray(rows[:, 0]).view(np.float64)  # checked where they were computed
        glengths = rows[:, 1:]
        sizes = glengths[:, 0].astype(np.float64) if self.max_tokens_per_rank is not None else None
        bins = self._plan_host(gcosts, sizes, world)
        plan, buf = plan_pack(rows, counts, bins, rank, tensors, schema.fields, dev, schema.groups, schema.row_bytes)
        ex = _Exchange(world, group, plan, gcosts, glengths)
        # ---- one all_to_all of every field
        got = unpack(_all_to_all(buf, plan.send_bytes, plan.recv_bytes, world, group), schema.fields,
                     plan.recv_rows)
        # ---- assemble
        out_groups = []
        for g in range(G):
            ln = plan.recv_lengths[g]
            if ln.dtype != groups[g][0].dtype or dev.type != "cpu":
                ln = ln.to(device=dev, dtype=groups[g][0].dtype)
            out_groups.append((ln, {}))
        out_samples: Dict[str, torch.Tensor] = {}
        nt = None
        for f, t in zip(schema.fields, got):
            if f.group >= 0:
                out_groups[f.group][1][f.name] = t
            elif f.name == _TARGETS:
                nt = t
            else:
                out_samples[f.name] = t
        return BalancedBatch(out_groups[0][0], out_groups[0][1], out_samples, nt, ex, out_groups)


@dataclasses.dataclass(frozen=True)
class _Schema:
    """The fields of a batch layout (the order they travel in) and its cross-process hash."""

    fields: Tuple[Field, ...]
    hash: int
    groups: List[int] = dataclasses.field(init=False, compare=False)     # per field, for the kernels
    row_bytes: List[int] = dataclasses.field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", [f.group for f in self.fields])
        object.__setattr__(self, "row_bytes", [f.row_bytes for f in self.fields])
