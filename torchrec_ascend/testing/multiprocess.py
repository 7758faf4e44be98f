"""Run a function on N spawned ranks with a gloo process group (``npu`` tensors included).

Each rank gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``
and ``MASTER_PORT`` in its environment (TorchRec reads ``LOCAL_WORLD_SIZE`` for table-row-wise
sharding), enables the simulated NPU when ``device_type="npu"`` and ``torch_npu`` is absent,
initialises the default process group (``gloo``, plus the simulated device's staging backend
or HCCL for ``npu``), calls ``fn(rank, world_size, *args)`` and returns each rank's result.
"""

from __future__ import annotations

import os
import socket
import tempfile
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["free_port", "run_multiprocess", "rank_device"]


def free_port() -> int:
    """A TCP port that was free a moment ago on localhost."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_device(device_type: str, local_rank: int) -> torch.device:
    """The device a rank trains on: ``cpu``, or ``<type>:<local_rank>``."""
    if device_type == "cpu":
        return torch.device("cpu")
    return torch.device(device_type, local_rank)


def _worker(rank: int, world_size: int, local_world_size: int, port: int, device_type: str,
            fn: Callable[..., Any], args: Sequence[Any], out_dir: str) -> None:
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank % local_world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    os.environ.update(env)
    torch.set_num_threads(1)
    backend = "gloo"
    if device_type == "npu":
        from . import simulated_npu

        backend = simulated_npu.dist_backend()
        torch.get_device_module("npu").set_device(rank % local_world_size)
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_multiprocess(
    fn: Callable[..., Any],
    world_size: int = 2,
    args: Sequence[Any] = (),
    local_world_size: Optional[int] = None,
    device_type: str = "cpu",
) -> List[Any]:
    """Spawn ``world_size`` ranks running ``fn(rank, world_size, *args)``; return their results.

    ``fn`` must be importable (module level).  Results travel through ``torch.save`` (tensors
    are best returned on cpu).  A rank's exception is re-raised here with its traceback.
    """
    if world_size < 1:
        raise ValueError(f"world_size={world_size}: must be >= 1")
    lws = world_size if local_world_size is None else local_world_size
    if lws < 1 or world_size % lws:
        raise ValueError(f"local_world_size={lws}: must divide world_size={world_size}")
    if device_type not in ("cpu", "npu", "cuda"):
        raise ValueError(f"device_type={device_type!r}: must be cpu, npu or cuda")
    with tempfile.TemporaryDirectory(prefix="tra_mp_") as out_dir:
        mp.start_processes(
            _worker,
            args=(world_size, lws, free_port(), device_type, fn, tuple(args), out_dir),
            nprocs=world_size,
            join=True,
            start_method="spawn",
        )
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False)
                for r in range(world_size)]
