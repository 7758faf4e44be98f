"""The dense part's data parallelism: TorchRec ``DataParallelWrapper`` s.

* :class:`SumDataParallelWrapper`: the dense part under DDP with the current arguments
  (``forward_sync_buffers``, not the deprecated ``broadcast_buffers``) and a comm hook that
  **sums** gradients over ranks instead of averaging them (a trainer that scales each rank's
  loss by 1 / (the global batch) gets the single-process gradient, like the sharded tables',
  which TorchRec's backward sums);
* :class:`DeferredGradWrapper` + :class:`DenseGradSync`: a dense gradient all-reduce that a
  pipeline starts and waits for itself (no DDP), for ``staleness >= 1``;
* :func:`summed_sparse_gradients`: inside it TorchRec's sharded embedding backward sums the
  ranks' gradients instead of averaging them (``torchrec.distributed.comm_ops``' gradient
  division, on by default, divides by the world size): with the loss scaled by 1 / the global
  batch, every table then gets the single-process gradient too.  Row-wise Adagrad hides a
  constant factor but for its ``eps``: small gradients (ranking's) showed the difference.

TorchRec's DistributedModelParallel wraps the unsharded (dense) part in DDP, whose all-reduce
finishes inside ``loss.backward()``.  With ``staleness >= 1`` our DistributedModelParallel uses
:class:`DeferredGradWrapper` instead: the dense parameters are broadcast from rank 0 once (as
DDP does) and :class:`DenseGradSync` averages their gradients when the pipeline asks
(:meth:`DenseGradSync.start` after the dense backward, :meth:`DenseGradSync.wait` before the
optimizer step), on a process group of its own, so the all-reduce runs while the compute thread
does the next batch's sparse work.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from torchrec.distributed.model_parallel import DataParallelWrapper
from torchrec.distributed.types import ShardingEnv

if TYPE_CHECKING:  # pragma: no cover
    from torchrec.distributed.model_parallel import DistributedModelParallel

__all__ = ["DenseGradSync", "DeferredGradWrapper", "SumDataParallelWrapper",
           "UnsyncedGradientsError", "summed_sparse_gradients"]


class UnsyncedGradientsError(RuntimeError):
    """A training forward ran while the previous backward's dense gradients were not averaged."""


class DenseGradSync:
    """Averages (``average=True``) or sums the gradients of ``params`` over ``group`` with one
    flat async all-reduce per dtype.  ``pending`` is True between a backward that produced a
    gradient and :meth:`start`."""

    def __init__(self, params: List[nn.Parameter], group: Optional[dist.ProcessGroup],
                 average: bool = True) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.group = group
        self.world = dist.get_world_size(group) if dist.is_initialized() else 1
        self.average = average
        self.pending = False
        self._work: List[tuple] = []
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._mark)

    def _mark(self, _p: torch.Tensor) -> None:
        self.pending = True

    def start(self) -> None:
        """Launch the all-reduce of every present gradient (returns at once)."""
        if self._work:
            raise RuntimeError("DenseGradSync.start: the previous all-reduce was never waited")
        self.pending = False
        if self.world == 1:
            return
        by_dtype: Dict[torch.dtype, List[torch.Tensor]] = {}
        for p in self.params:
            if p.grad is not None:
                by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
        for grads in by_dtype.values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            work = dist.all_reduce(flat, group=self.group, async_op=True)
            self._work.append((work, flat, grads))

    def wait(self) -> None:
        """Wait for the all-reduce and write the averaged gradients back."""
        work, self._work = self._work, []
        for handle, flat, grads in work:
            handle.wait()
            if self.average:
                flat.div_(self.world)
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()


class DeferredGradWrapper(DataParallelWrapper):
    """DMP's data-parallel wrapper for ``staleness >= 1``: broadcasts the dense parameters from
    rank 0 and attaches a :class:`DenseGradSync` as ``dmp.dense_grad_sync`` (``average=False``:
    gradients summed over ranks, for losses already scaled by the global batch)."""

    def __init__(self, average: bool = True) -> None:
        self.average = average

    def wrap(self, dmp: "DistributedModelParallel", env: ShardingEnv,
             device: torch.device) -> None:
        if getattr(dmp, "dense_grad_sync", None) is not None:
            return
        sharded = set(type(dmp)._sharded_parameter_names(dmp._dmp_wrapped_module))
        dense = [p for n, p in dmp._dmp_wrapped_module.named_parameters() if n not in sharded]
        pg = env.process_group
        group = None
        if pg is not None and dist.get_world_size(pg) > 1:
            ranks = dist.get_process_group_ranks(pg)
            group = dist.new_group(ranks=ranks)  # collective: every rank builds its DMP
            src = ranks[0]
            with torch.no_grad():
                for p in dense:
                    dist.broadcast(p.data, src=src, group=pg)
        dmp.dense_grad_sync = DenseGradSync(dense, group, self.average)


def _sum_hook(state, bucket):  # DDP checks the annotations: none (strings would fail its check)
    """DDP comm hook: all-reduce SUM of the bucket (no division by the world size)."""
    group = state if state is not None else dist.group.WORLD
    fut = dist.all_reduce(bucket.buffer(), group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


class SumDataParallelWrapper:
    """TorchRec ``DataParallelWrapper``: DDP over the unsharded parameters, gradients summed."""

    def __init__(self, bucket_cap_mb: int = 25, static_graph: bool = True) -> None:
        self.bucket_cap_mb, self.static_graph = bucket_cap_mb, static_graph

    def wrap(self, dmp: Any, env: Any, device: torch.device) -> None:
        from torch.nn.parallel import DistributedDataParallel
        from torchrec.distributed.model_parallel import DistributedModelParallel

        if isinstance(dmp._dmp_wrapped_module, DistributedDataParallel):
            return
        pg = env.process_group
        if not dist.is_initialized() or dist.get_world_size(pg) == 1:
            # one rank: nothing to sum (DDP would only copy every gradient into its buckets); the
            # dense part still goes to the device, as DDP's wrapping would have put it
            dmp._dmp_wrapped_module.to(device)
            return
        ignore = set(DistributedModelParallel._sharded_parameter_names(dmp._dmp_wrapped_module))
        if not set(dict(dmp.named_parameters())) - ignore:
            return
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            module=dmp._dmp_wrapped_module, params_and_buffers_to_ignore=ignore)
        ddp = DistributedDataParallel(
            module=dmp._dmp_wrapped_module.to(device),
            device_ids=None if device.type == "cpu" else [device],
            process_group=env.process_group, gradient_as_bucket_view=True,
            forward_sync_buffers=False, static_graph=self.static_graph,
            bucket_cap_mb=self.bucket_cap_mb)
        ddp.register_comm_hook(env.process_group, _sum_hook)
        dmp._dmp_wrapped_module = ddp


@contextlib.contextmanager
def summed_sparse_gradients() -> Iterator[None]:
    """Inside: TorchRec's embedding all-to-all / reduce-scatter backward does not divide the
    gradients by the world size (module docstring); the previous setting after."""
    from torchrec.distributed import comm_ops

    before = comm_ops.get_gradient_division()
    comm_ops.set_gradient_division(False)
    try:
        yield
    finally:
        comm_ops.set_gradient_division(before)
