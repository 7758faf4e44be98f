"""Which fbgemm ops does TorchRec's training path dispatch, per sharding type, and who serves them
on npu?

:class:`OpRecorder` is a ``TorchDispatchMode`` that records every ``fbgemm::`` (and
``torchrec_ascend::``) op reaching the dispatcher's Python key inside it: forward, backward
(the CPU autograd engine runs it on the calling thread), optimizer and module construction
(TBE's ``__init__`` calls fbgemm ops too).  Ops that fbgemm registers as
CompositeImplicitAutograd are seen as the ops they decompose into.

Run ``python -m torchrec_ascend.testing.trace_ops`` to reproduce the table of
docs/integration.md: it trains :mod:`.torchrec_workload` (EmbeddingBagCollection +
EmbeddingCollection + dense, DistributedModelParallel, TrainPipelineSparseDist, 3 steps) on cpu
with fbgemm's own kernels (but see FBGEMM_CPU_BROKEN) over gloo, world 2 (table_wise, row_wise, column_wise, data_parallel)
and world 4 with LOCAL_WORLD_SIZE=2 (table_row_wise), and prints, per op, the sharding types
that dispatched it and the backend :func:`torchrec_ascend.ops.registry.choose` picks for it on
npu.  ``tests/distributed/test_npu_training.py`` checks the documented table against a fresh
trace.
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpRecorder", "npu_backend", "format_table", "parse_table", "trace_worker", "trace",
           "main"]

NAMESPACES = ("fbgemm", "torchrec_ascend")
WORLD2_SHARDINGS = ("table_wise", "row_wise", "column_wise", "data_parallel")
WORLD4_SHARDINGS = ("table_row_wise",)
TABLE_BEGIN = "<!-- trace_ops table begin -->"
TABLE_END = "<!-- trace_ops table end -->"


class OpRecorder(TorchDispatchMode):
    """Records ``namespace::op`` (overload packet name) of every op of ``namespaces``."""

    def __init__(self, namespaces: Sequence[str] = NAMESPACES) -> None:
        super().__init__()
        self.namespaces = tuple(namespaces)
        self.ops: Set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ns = func.namespace
        if ns in self.namespaces:
            self.ops.add(f"{ns}::{func._schema.name.split('::', 1)[1]}")
        return func(*args, **(kwargs or {}))


def npu_backend(qualname: str) -> Tuple[str, str]:
    """(backend, why) serving ``qualname`` on npu: the registry's choice for ops of the suite;
    for other ops whether a PrivateUse1 kernel exists at all."""
    from torchrec_ascend.ops import registry

    from torchrec_ascend.distributed import fbgemm_tbe_npu

    ns, name = qualname.split("::", 1)
    if qualname in fbgemm_tbe_npu.REGISTERED:
        return "fbgemm_tbe_npu", "npu kernel of torchrec_ascend.distributed.fbgemm_tbe_npu"
    try:
        registry.spec(name)
    except Exception:
        has = torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "PrivateUse1")
        return ("(other)" if has else "MISSING",
                "PrivateUse1 kernel registered outside the registry" if has
                else "no PrivateUse1 kernel: fails on npu")
    return registry.choose(name, "npu")


def format_table(traces: Mapping[str, Iterable[str]]) -> str:
    """Markdown table: one row per op, a column per sharding type, the npu backend."""
    shardings = list(traces)
    ops = sorted(set().union(*[set(v) for v in traces.values()]))
    head = ["op"] + shardings + ["npu backend"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for op in ops:
        backend, _ = npu_backend(op)
        cells = ["x" if op in set(traces[s]) else "" for s in shardings]
        lines.append("| " + " | ".join([f"`{op}`"] + cells + [backend]) + " |")
    return "\n".join(lines)


def parse_table(text: str) -> Dict[str, Set[str]]:
    """{sharding: ops} from the table :func:`format_table` wrote (between the markers)."""
    body = text.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0].strip().splitlines()
    head = [c.strip() for c in body[0].strip().strip("|").split("|")]
    shardings = head[1:-1]
    out: Dict[str, Set[str]] = {s: set() for s in shardings}
    for line in body[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        op = cells[0].strip("`")
        for s, c in zip(shardings, cells[1:-1]):
            if c:
                out[s].add(op)
    return out


def trace_worker(rank: int, world_size: int, shardings: Sequence[str], steps: int) -> Dict[str, List[str]]:
    """Per sharding type: the ops one cpu training (fbgemm's kernels) dispatched on this rank."""
    from . import torchrec_workload as W

    out = {}
    for sharding in shardings:
        with W.fbgemm_cpu_kernels(sharding), OpRecorder() as rec:
            W.train(torch.device("cpu"), sharding, "sparse_dist", steps)
        out[sharding] = sorted(rec.ops)
        torch.distributed.barrier()
    return out


def trace(steps: int = 3) -> Dict[str, Set[str]]:
    """{sharding: ops dispatched on any rank} for every sharding type (two launches)."""
    from .multiprocess import run_multiprocess

    traces: Dict[str, Set[str]] = {}
    for world, lws, shardings in ((2, 2, WORLD2_SHARDINGS), (4, 2, WORLD4_SHARDINGS)):
        per_rank = run_multiprocess(trace_worker, world, (shardings, steps), local_world_size=lws)
        for s in shardings:
            traces[s] = set().union(*[set(r[s]) for r in per_rank])
    order = WORLD2_SHARDINGS[:3] + WORLD4_SHARDINGS + WORLD2_SHARDINGS[3:]
    return {s: traces[s] for s in order}


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args(argv)
    import torchrec_ascend  # noqa: F401  (registers our npu kernels: the backend column)

    print(format_table(trace(args.steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
