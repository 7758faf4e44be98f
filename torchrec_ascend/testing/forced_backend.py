"""TorchRec on fbgemm's CPU kernels vs TorchRec on ours forced in their place.

:class:`KernelLog` records every call that reaches one of our registered Python kernels (seen by
:func:`torchrec_ascend.ops.registry.observe`) together with the backend that served it, and,
through a ``TorchDispatchMode``, every ``fbgemm::`` op that reached the dispatcher.  With both, a test can prove that a forced run really ran on our kernels: every
fbgemm op of our registry that TorchRec dispatched was served by us, by a non-fbgemm backend.

:func:`compare_worker` is the body of ``tests/distributed/test_forced_backend.py``: in one
process group it trains :mod:`.torchrec_workload` (EmbeddingBagCollection + EmbeddingCollection
+ dense, DistributedModelParallel, TrainPipelineSparseDist) once on fbgemm's kernels and once
under ``registry.use_backend(backend, replace_fbgemm=True)``, and returns both results with the
kernel logs.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Dict, Iterator, List, Sequence, Set, Tuple

import torch

from .trace_ops import OpRecorder

__all__ = ["KernelLog", "kernel_log", "replaceable_ops", "forced", "compare_worker"]


@dataclasses.dataclass
class KernelLog:
    """What ran inside :func:`kernel_log`.

    Attributes:
        ours: ``(op, device, backend)`` of every call served by one of our registered kernels.
        dispatched: ``namespace::op`` of every fbgemm / torchrec_ascend op that reached the
            dispatcher (seen by a ``TorchDispatchMode``).
    """

    ours: List[Tuple[str, str, str]] = dataclasses.field(default_factory=list)
    dispatched: Set[str] = dataclasses.field(default_factory=set)

    def served(self) -> Dict[str, Set[str]]:
        """{op: backends that served it}."""
        out: Dict[str, Set[str]] = {}
        for op, _, backend in self.ours:
            out.setdefault(op, set()).add(backend)
        return out


def replaceable_ops() -> Set[str]:
    """fbgemm ops of our registry whose fbgemm CPU kernel ``replace_fbgemm=True`` overrides."""
    from torchrec_ascend.ops import registry

    return {s.name for s in registry.all_specs()
            if s.fbgemm and "CPU" in registry.fbgemm_keys(s.name)}


@contextlib.contextmanager
def kernel_log() -> Iterator[KernelLog]:
    """Record our kernels' calls (op, device, backend) and the fbgemm ops dispatched in the block.

    Every Python kernel of the registry reports its calls to :func:`registry.observe` (under
    ``use_backend(..., replace_fbgemm=True)`` a replaced op can never choose ``fbgemm``)."""
    from torchrec_ascend.ops import registry

    log = KernelLog()
    with registry.observe(lambda op, device, backend: log.ours.append((op, device, backend))), \
            OpRecorder(("fbgemm",)) as rec:
        yield log
    log.dispatched = set(rec.ops)


@contextlib.contextmanager
def forced(backend: str) -> Iterator[None]:
    """Our kernels in place of fbgemm's CPU kernels: ``use_backend(backend, replace_fbgemm=True)``
    (ops without a ``backend`` implementation fall back by the registry's order)."""
    from torchrec_ascend.ops import registry

    with registry.use_backend(backend, replace_fbgemm=True):
        yield


def compare_worker(rank: int, world_size: int, shardings: Sequence[str], backends: Sequence[str],
                   steps: int, pipeline: str = "sparse_dist") -> Dict[str, dict]:
    """Per sharding type: the workload trained on fbgemm's CPU kernels (``"fbgemm"``) and under
    each forced backend (:func:`forced`), each with its kernel log.

    Returns ``{sharding: {run: {"result": train(...), "ours": {op: [backends]},
    "dispatched": [fbgemm ops]}}}``.  The fbgemm run keeps
    :data:`~.torchrec_workload.FBGEMM_CPU_BROKEN`'s exceptions (fbgemm-gpu-cpu 1.8.0's dense
    lookup pools sequence tables)."""
    from . import torchrec_workload as W

    cpu = torch.device("cpu")
    out: Dict[str, dict] = {}
    for sharding in shardings:
        runs: Dict[str, dict] = {}
        for backend in ("fbgemm",) + tuple(backends):
            ctx = (W.fbgemm_cpu_kernels(sharding) if backend == "fbgemm"
                   else forced(backend))
            with ctx, kernel_log() as log:
                result = W.train(cpu, sharding, pipeline, steps)
            runs[backend] = {"result": result,
                             "ours": {k: sorted(v) for k, v in log.served().items()},
                             "dispatched": sorted(log.dispatched)}
            torch.distributed.barrier()
        out[sharding] = runs
    return out

