"""Running a 2-D plan: TorchRec's ``DMPCollection`` from a :class:`.two_dim.TwoDimShardingPlanner`.

:func:`two_dim_model` wraps a module in :class:`TwoDimModelParallel`, TorchRec 1.8's
``DMPCollection`` with ``sharding_group_size`` = devices per host and
``use_inter_host_allreduce=True`` (each host one sharding group, replicas across hosts; the
default of TorchRec is the other way round, groups spread over hosts).  Three device fixes,
each at a ``DMPCollection`` method: its constructor asserts a cuda/mtia device before anything
else (the rest of it runs on cpu: the assertion is shown a stand-in whose ``type`` is "cuda",
every other use sees the real device); ``_remap_sharding_plan`` writes placements
``rank:<r>/cpu:<local rank>``, which torch's ShardedTensor refuses for a cpu tensor (cpu
placements get no index, as TorchRec's own ``placement`` writes them); and ``sync()``'s
``ReduceOp.AVG`` all-reduce, which gloo does not have, is replaced on gloo (and on the simulated
npu's gloo-based backend) by a sum and a division (:meth:`TwoDimModelParallel.average_replicas`,
through ``DMPCollection``'s ``custom_all_reduce`` hook).  :meth:`TwoDimModelParallel.step_done`
counts steps and syncs the replicas every ``sync_every``; :meth:`~TwoDimModelParallel.sync_replicas`
syncs now unless already in sync; :meth:`~TwoDimModelParallel.merged_weights` evaluates the
replicas merged as a sync would merge them and restores each host's own weights.  TorchRec's ``TrainPipelineSparseDist``
syncs a ``DMPCollection`` after every batch unless built with
``dmp_collection_sync_interval_batches=None``: pass that when ``step_done`` drives the syncs.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Dict, Iterator, List, Literal, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.remote_device import _remote_device
from torchrec.distributed.model_parallel import DistributedModelParallel, DMPCollection
from torchrec.distributed.types import EnumerableShardingSpec, ModuleSharder, ShardingPlan

from ...options import check_choice, choices
from ..model_parallel import ReplicaHooks
from .two_dim import TwoDimShardingPlanner

__all__ = ["ReplicaMerge", "TwoDimModelParallel", "two_dim_model"]

ReplicaMerge = Literal["mean", "sum"]
"""How a sync combines the hosts' replicas (:class:`TwoDimModelParallel`'s ``merge``)."""

# process-group backends without ReduceOp.AVG (gloo; the simulated npu's, gloo underneath)
_NO_AVG_BACKENDS = frozenset({"gloo", "simnpu"})


class _AssertedDevice:
    """Shown only to ``DMPCollection.__init__``'s first statement, ``assert device.type in
    (cuda, mtia)``; :class:`TwoDimModelParallel` hands the real device to everything else."""

    type = "cuda"

    def __init__(self, device: torch.device) -> None:
        self.device = device


class _RealDevice(DistributedModelParallel):
    """Between ``DMPCollection`` and ``DistributedModelParallel`` in the MRO: the device
    ``DMPCollection`` passes on is the real one again."""

    def __init__(self, module: nn.Module, env, device, *args, **kwargs) -> None:
        if isinstance(device, _AssertedDevice):
            device = device.device
        super().__init__(module, env, device, *args, **kwargs)


class TwoDimModelParallel(DMPCollection, _RealDevice, ReplicaHooks):
    """TorchRec's ``DMPCollection`` on any device (module docstring); ``sync_every``: steps
    between replica syncs, for :meth:`step_done`.  ``merge``: how a sync combines the replicas
    (weights and optimizer state alike):

    * ``"mean"`` (TorchRec's): their average.  With SGD and a sync every step this is 1-D
      training for tables whose gradient TorchRec divides by the sharding group's size (pooled
      tables: each host steps with its hosts' mean gradient);
    * ``"sum"``: the value at the last sync plus the sum of every replica's change since (what
      a parameter server applies when every worker pushes its updates).  With SGD and a sync
      every step this is 1-D training for tables whose gradient TorchRec sums over ranks
      (sequence tables, e.g. a loss scaled by the global batch: each host's step is its share
      of the world's); with longer intervals a row only one host touched keeps that host's
      whole change instead of ``1 / hosts`` of it.  Keeps a copy of the local shards' weights
      and optimizer state as of the last sync (taken at the first forward after
      construction or :meth:`restart_count`); the sync moves the same bytes as ``"mean"``.

    Arguments otherwise as ``DMPCollection``'s (``custom_all_reduce`` defaults to
    :meth:`average_replicas` on gloo; with ``merge="sum"`` it must be left unset)."""

    MERGES = choices(ReplicaMerge)

    def __init__(self, module: nn.Module, device: torch.device, plan: ShardingPlan,
                 world_size: int, sharding_group_size: int, global_pg: dist.ProcessGroup,
                 *, sync_every: int = 1, merge: ReplicaMerge = "mean", **kwargs) -> None:
        if not isinstance(sync_every, int) or isinstance(sync_every, bool) or sync_every < 1:
            raise ValueError(f"sync_every={sync_every!r}: must be an integer >= 1")
        if sharding_group_size < 1 or world_size % sharding_group_size:
            raise ValueError(f"sharding_group_size={sharding_group_size}: must divide "
                             f"world_size={world_size}")
        check_choice("merge", merge, ReplicaMerge)
        if merge == "sum" and kwargs.get("custom_all_reduce") is not None:
            raise ValueError("custom_all_reduce: must be unset with merge='sum' (the sum of "
                             "the replicas' changes is its own all-reduce)")
        self._real_device = device
        self.sync_every = sync_every
        self.merge = merge
        self.steps = 0
        self.synced_at = 0  # the step count at the last sync (0: the replicas start equal)
        self._anchors: Optional[Dict[int, torch.Tensor]] = None  # merge="sum": last sync's values
        self._previewing = False  # merged_weights: merge without moving the anchors
        if merge == "sum":
            kwargs["custom_all_reduce"] = self.sum_changes
        elif kwargs.get("custom_all_reduce") is None and \
                dist.get_backend(global_pg) in _NO_AVG_BACKENDS:
            kwargs["custom_all_reduce"] = self.average_replicas
        kwargs.setdefault("use_inter_host_allreduce", True)
        super().__init__(module=module, device=_AssertedDevice(device), plan=plan,
                         world_size=world_size, sharding_group_size=sharding_group_size,
                         global_pg=global_pg, **kwargs)
        if merge == "sum":
            self.register_forward_pre_hook(self._take_anchors)

    def _create_process_groups(self, *args, **kwargs):
        self._device = self._real_device  # DMPCollection stored the stand-in
        return super()._create_process_groups(*args, **kwargs)

    def _remap_sharding_plan(self, plan: ShardingPlan, *args, **kwargs) -> None:
        super()._remap_sharding_plan(plan, *args, **kwargs)
        if self._real_device.type != "cpu":
            return
        for module_plan in plan.plan.values():
            for ps in module_plan.values():  # type: ignore[union-attr]
                if isinstance(ps.sharding_spec, EnumerableShardingSpec):
                    for shard in ps.sharding_spec.shards:
                        shard.placement = _remote_device(f"rank:{shard.placement.rank()}/cpu")

    @property
    def replica_pg(self) -> dist.ProcessGroup:
        """The ranks holding this rank's replicas (one per sharding group)."""
        return self._default_ctx.replica_pg

    def average_replicas(self, tensors: List[torch.Tensor]) -> None:
        """Average ``tensors`` (one dtype) over :attr:`replica_pg` in place: one flat sum
        all-reduce, then a division by the number of replicas."""
        if not tensors:
            return
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        dist.all_reduce(flat, group=self.replica_pg)
        flat /= dist.get_world_size(self.replica_pg)
        offset = 0
        with torch.no_grad():
            for t in tensors:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()

    def _synced_tensors(self) -> Iterator[torch.Tensor]:
        for ctx in self._ctxs:
            for group in (ctx.weights_by_dtype, ctx.optimizer_tensors_by_dtype or {}):
                for tensors in group.values():
                    yield from tensors

    def _take_anchors(self, *_args) -> None:
        """Forward pre-hook (``merge="sum"``): keep the replicas' common values before the
        first step trains them (after the caller initialised or loaded the weights)."""
        if self._anchors is None:
            self._anchors = {id(t): t.detach().clone() for t in self._synced_tensors()}

    def sum_changes(self, tensors: List[torch.Tensor]) -> None:
        """Set ``tensors`` (one dtype) in place to their value at the last sync plus the sum,
        over :attr:`replica_pg`, of every replica's change since: one flat sum all-reduce."""
        if not tensors or self._anchors is None:  # nothing trained since the replicas were equal
            return
        anchors = [self._anchors[id(t)] for t in tensors]
        flat = torch.cat([(t.detach() - a).reshape(-1) for t, a in zip(tensors, anchors)])
        dist.all_reduce(flat, group=self.replica_pg)
        offset = 0
        with torch.no_grad():
            for t, a in zip(tensors, anchors):
                t.copy_(a + flat[offset:offset + t.numel()].view_as(t))
                if not self._previewing:
                    a.copy_(t)
                offset += t.numel()

    def step_done(self) -> bool:
        """Count a finished optimizer step; sync the replicas (weights and optimizer state)
        when ``sync_every`` steps have passed since the last sync.  Returns whether it
        synced."""
        self.steps += 1
        if self.steps % self.sync_every:
            return False
        return self.sync_replicas()

    @property
    def in_sync(self) -> bool:
        """No step since the last sync: every host holds the same replica."""
        return self.synced_at == self.steps

    def sync_replicas(self) -> bool:
        """Sync now unless :attr:`in_sync` (collective on every rank; for a checkpoint or the
        final evaluation, of the merged model).  Returns whether it synced."""
        if self.in_sync:
            return False
        self.sync()
        self.synced_at = self.steps
        return True

    @contextlib.contextmanager
    def merged_weights(self) -> Iterator[None]:
        """Inside: the replicas' weights merged as a sync would merge them (``merge``), on every
        host (an evaluation of the model a sync would make); on exit each host's own weights
        again, bit for bit, and the optimizer state and the ``"sum"`` anchors untouched, so
        training goes on as if nothing happened (collective)."""
        if self.in_sync:
            yield
            return
        kept = [(w, w.detach().clone()) for ctx in self._ctxs
                for ws in ctx.weights_by_dtype.values() for w in ws]
        self._previewing = True
        try:
            self.sync(include_optimizer_state=False)
            yield
        finally:
            self._previewing = False
            with torch.no_grad():
                for w, own in kept:
                    w.copy_(own)

    def restart_count(self, steps: int) -> None:
        """Resume at ``steps`` finished steps from a checkpoint (always of synced replicas;
        ``merge="sum"`` keeps the loaded values at the next forward)."""
        self.steps = self.synced_at = int(steps)
        self._anchors = None


def two_dim_model(module: nn.Module, planner: TwoDimShardingPlanner, device: torch.device,
                  sharders: Optional[List[ModuleSharder[nn.Module]]] = None,
                  pg: Optional[dist.ProcessGroup] = None,
                  plan: Optional[ShardingPlan] = None, **kwargs) -> TwoDimModelParallel:
    """``module`` under ``planner``'s 2-D plan (``plan``, or ``planner.collective_plan`` on
    ``pg``, default the world): a :class:`TwoDimModelParallel` with the planner's sharding
    group size and ``sync_every``, on a copy of the plan (``DMPCollection`` remaps its ranks to
    this rank's host group; ``planner.explain(plan)`` still takes the group plan).  ``kwargs``
    go to ``DMPCollection``."""
    pg = pg if pg is not None else dist.GroupMember.WORLD
    if pg.size() != planner.world_topology.world_size:
        raise ValueError(f"two_dim_model: the process group has {pg.size()} ranks, the "
                         f"planner's topology {planner.world_topology.world_size}")
    if plan is None:
        plan = planner.collective_plan(module, sharders, pg)
    plan = copy.deepcopy(plan)  # DMPCollection remaps its plan's ranks to this rank's group
    return TwoDimModelParallel(module, device, plan, pg.size(), planner.sharding_group_size,
                               pg, sync_every=planner.sync_every, sharders=sharders, **kwargs)
