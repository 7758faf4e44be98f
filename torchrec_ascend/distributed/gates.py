"""TorchRec's device gates, opened for ``npu`` (and the pipelines fixed for ``cpu``).

TorchRec 1.8 decides by device *name* what a device may do: the planner's ``Topology`` accepts
only cpu/cuda/mtia, sharders offer row-wise / table-row-wise / grid only on cuda, the train
pipelines create streams only for cuda/mtia, and the semi-sync pipeline assumes cuda when it
has no stream.  :func:`open_gates` (run by ``import torchrec_ascend``) opens each gate, once:

* an NPU is planned like the other HBM accelerators (cuda/mtia): HBM capacity, HBM storage,
  HBM bandwidth, and shards placed on ``npu:<local rank>``;
* embedding sharders offer ROW_WISE, TABLE_ROW_WISE and GRID_SHARD on ``npu`` and ``cpu``;
* the train pipelines create and use the device's own streams on ``npu``
  (``torch.get_device_module("npu").Stream``), and run on ``cpu`` without streams.

Every gate is a small wrapper around one TorchRec function, marked so a second
:func:`open_gates` is a no-op; :data:`GATES` lists each with the TorchRec file it concerns
(docs/integration.md is generated from the same list).  They are written against TorchRec
:data:`TORCHREC_VERSION`; another version gets a warning, and a gate whose target is missing is
reported (not applied) instead of failing the import.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import threading
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

__all__ = [
    "TORCHREC_VERSION",
    "STREAM_DEVICE_TYPES",
    "Gate",
    "GATES",
    "open_gates",
    "gate_status",
]

TORCHREC_VERSION = "1.8"
# device types TorchRec does not know, that have HBM and streams like cuda/mtia
STREAM_DEVICE_TYPES = frozenset({"npu"})
_MARK = "_torchrec_ascend_gate"
_LOCK = threading.Lock()
_STATUS: Dict[str, str] = {}


@dataclasses.dataclass(frozen=True)
class Gate:
    """One opened TorchRec gate: what it changes, where, and how it is applied."""

    name: str
    torchrec_file: str
    target: str
    change: str
    apply: Callable[[], None]


def _is_npu(device_type: Any) -> bool:
    return isinstance(device_type, str) and device_type in STREAM_DEVICE_TYPES


def _mark(fn: Callable, orig: Callable) -> Callable:
    setattr(fn, _MARK, True)
    fn.__wrapped__ = orig  # type: ignore[attr-defined]
    return fn


def _patch_attr(owner: Any, attr: str, make: Callable[[Callable], Callable],
                rebind_in: Sequence[str] = ()) -> None:
    """Replace ``owner.attr`` by ``make(original)`` once; also in modules that imported it by
    name (``from x import f``), where they still hold the original."""
    orig = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
    if getattr(orig, _MARK, False):
        return
    new = _mark(make(orig), orig)
    setattr(owner, attr, new)
    for modname in rebind_in:
        mod = importlib.import_module(modname)
        if getattr(mod, attr, None) is orig:
            setattr(mod, attr, new)


def _swap_arg(orig: Callable, arg: str, to: str = "cuda") -> Callable:
    """Wrapper of ``orig`` that passes ``to`` where argument ``arg`` names an npu device."""
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        if _is_npu(bound.arguments.get(arg)):
            bound.arguments[arg] = to
            return orig(*bound.args, **bound.kwargs)
        return orig(*args, **kwargs)

    return wrapper


# --------------------------------------------------------------------------- planner


def _gate_topology() -> None:
    from torchrec.distributed.planner.types import Topology

    def make(orig):
        sig = inspect.signature(orig)

        @functools.wraps(orig)
        def __init__(self, *args, **kwargs):
            bound = sig.bind(self, *args, **kwargs)
            device = bound.arguments.get("compute_device")
            if not _is_npu(device):
                return orig(self, *args, **kwargs)
            bound.arguments["compute_device"] = "cuda"  # HBM capacity per device, like cuda
            orig(*bound.args, **bound.kwargs)
            self._compute_device = device

        return __init__

    _patch_attr(Topology, "__init__", make)


def _gate_kernel_bw() -> None:
    from torchrec.distributed.planner import constants

    _patch_attr(constants, "kernel_bw_lookup", lambda f: _swap_arg(f, "compute_device"),
                rebind_in=("torchrec.distributed.planner.estimator.types",
                           "torchrec.distributed.planner.shard_estimators"))


def _gate_shard_storage() -> None:
    from torchrec.distributed.planner import shard_estimators

    _patch_attr(shard_estimators, "calculate_shard_storages",
                lambda f: _swap_arg(f, "compute_device"))


def _gate_placement() -> None:
    from torchrec.distributed import sharding_plan

    def make(orig):
        @functools.wraps(orig)
        def placement(compute_device: str, rank: int, local_size: int) -> str:
            if _is_npu(compute_device):
                return f"rank:{rank}/{compute_device}:{rank % local_size}"
            return orig(compute_device, rank, local_size)

        return placement

    _patch_attr(sharding_plan, "placement", make,
                rebind_in=("torchrec.distributed.planner.planners",))


# --------------------------------------------------------------------------- sharders

_EXTRA_SHARDING_TYPES = ("row_wise", "table_row_wise", "grid_shard")


def _gate_sharding_types() -> None:
    from torchrec.distributed.embedding_types import BaseEmbeddingSharder

    def make(orig):
        @functools.wraps(orig)
        def sharding_types(self, compute_device_type: str) -> List[str]:
            types = list(orig(self, compute_device_type))
            if compute_device_type == "cpu" or _is_npu(compute_device_type):
                types += [t for t in _EXTRA_SHARDING_TYPES if t not in types]
            return types

        return sharding_types

    _patch_attr(BaseEmbeddingSharder, "sharding_types", make)


# --------------------------------------------------------------------------- pipelines

# stream attributes each pipeline creates for cuda/mtia (and their priority there)
_PIPELINE_STREAMS = {
    "TrainPipelineBase": {"_memcpy_stream": 0},
    "TrainPipelineSparseDist": {"_memcpy_stream": -1, "_data_dist_stream": -1},
    "PrefetchTrainPipelineSparseDist": {"_prefetch_stream": 0, "_default_stream": 0},
}


def _fix_pipeline_streams(self, cls_name: str, bound: inspect.BoundArguments) -> None:
    device = getattr(self, "_device", None)
    if not isinstance(device, torch.device) or not _is_npu(device.type):
        return
    mod = torch.get_device_module(device)
    if hasattr(self, "_stream_context"):
        self._stream_context = mod.stream
    for attr, priority in _PIPELINE_STREAMS.get(cls_name, {}).items():
        if getattr(self, attr, None) is None:
            setattr(self, attr, mod.Stream(device=device, priority=priority))
    if cls_name in ("TrainPipelineSemiSync", "TrainPipelineFusedSparseDist"):
        choice = bound.arguments.get("emb_lookup_stream", "data_dist")
        if getattr(self, "_emb_lookup_stream", None) is None:
            if choice == "new":
                self._emb_lookup_stream = mod.Stream(device=device)
            elif choice == "data_dist":
                self._emb_lookup_stream = self._data_dist_stream


def _gate_pipeline_streams() -> None:
    from torchrec.distributed.train_pipeline import train_pipelines as tp

    for cls_name in ("TrainPipelineBase", "TrainPipelineSparseDist", "TrainPipelineFusedSparseDist",
                     "TrainPipelineSemiSync", "PrefetchTrainPipelineSparseDist"):
        cls = getattr(tp, cls_name)

        def make(orig, cls_name=cls_name):
            sig = inspect.signature(orig)

            @functools.wraps(orig)
            def __init__(self, *args, **kwargs):
                orig(self, *args, **kwargs)
                bound = sig.bind(self, *args, **kwargs)
                bound.apply_defaults()
                _fix_pipeline_streams(self, cls_name, bound)

            return __init__

        _patch_attr(cls, "__init__", make)


def _gate_runtime_forward_device() -> None:
    from torchrec.distributed.train_pipeline.runtime_forwards import BaseForward

    def make(orig):
        @functools.wraps(orig)
        def __init__(self, name, args, module, context, stream=None):
            orig(self, name, args, module, context, stream)
            if stream is None:
                # TorchRec assumes cuda here; a pipeline without streams runs on cpu
                self._device = torch.device("cpu")

        return __init__

    _patch_attr(BaseForward, "__init__", make)


def _is_cpu_stream(stream: Any) -> bool:
    return isinstance(stream, torch.cpu.Stream) or (
        isinstance(stream, torch.Stream) and stream.device.type == "cpu")


def _without_cpu_streams(orig: Callable, args: Sequence[str]) -> Callable:
    """Wrapper of ``orig`` that passes None for each stream argument of ``args`` on cpu."""
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def wrapper(*a, **kw):
        bound = sig.bind(*a, **kw)
        for name in args:
            if _is_cpu_stream(bound.arguments.get(name)):
                bound.arguments[name] = None  # cpu work is ordered; tensors cannot record it
        return orig(*bound.args, **bound.kwargs)

    return wrapper


def _gate_cpu_record_stream() -> None:
    from torchrec.distributed.train_pipeline import utils

    rebind = ("torchrec.distributed.train_pipeline.train_pipelines",
              "torchrec.distributed.train_pipeline.pipeline_stage")
    _patch_attr(utils, "_wait_for_events", lambda f: _without_cpu_streams(f, ("stream",)),
                rebind_in=rebind)
    _patch_attr(utils, "_start_embedding_lookup",
                lambda f: _without_cpu_streams(f, ("source_stream", "target_stream")),
                rebind_in=rebind)
    # the semi-sync forward records the current (cpu) stream on the looked-up embeddings
    from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor, KeyedTensor

    def make(orig):
        @functools.wraps(orig)
        def record_stream(self, stream):
            if _is_cpu_stream(stream):
                return None
            return orig(self, stream)

        return record_stream

    for cls in (JaggedTensor, KeyedJaggedTensor, KeyedTensor):
        _patch_attr(cls, "record_stream", make)


# --------------------------------------------------------------------------- kernels


def _gate_dense_tbe_device() -> None:
    from torchrec.distributed import batched_embedding_kernel as bek

    for cls in (bek.BatchedDenseEmbedding, bek.BatchedDenseEmbeddingBag):
        def make(orig):
            sig = inspect.signature(orig)

            @functools.wraps(orig)
            def __init__(self, *args, **kwargs):
                orig(self, *args, **kwargs)
                device = sig.bind(self, *args, **kwargs).arguments.get("device")
                if not isinstance(device, torch.device) or not _is_npu(device.type):
                    return
                # TorchRec built fbgemm's dense TBE on cpu (use_cpu: "no cuda/mtia"): move it,
                # and re-slice the per-table parameters from the moved weights
                self._emb_module = self._emb_module.to(device)
                self._emb_module.current_device = device
                self._param_per_table = dict(bek._gen_named_parameters_by_table_dense(
                    self._emb_module, self.table_name_to_count.copy(), self._config))

            return __init__

        _patch_attr(cls, "__init__", make)


GATES: List[Gate] = [
    Gate("topology", "torchrec/distributed/planner/types.py", "Topology.__init__",
         'accepts compute_device="npu"; HBM capacity per device as for cuda', _gate_topology),
    Gate("kernel_bandwidth", "torchrec/distributed/planner/constants.py",
         "kernel_bw_lookup (also bound in planner/estimator/types.py)",
         "npu kernels get HBM bandwidth, as on cuda", _gate_kernel_bw),
    Gate("shard_storage", "torchrec/distributed/planner/shard_estimators.py",
         "calculate_shard_storages", "npu shards are stored in HBM, as on cuda",
         _gate_shard_storage),
    Gate("placement", "torchrec/distributed/sharding_plan.py",
         "placement (also bound in planner/planners.py)",
         'npu shards are placed on "rank:<r>/npu:<r % local_size>"', _gate_placement),
    Gate("sharding_types", "torchrec/distributed/embedding_types.py",
         "BaseEmbeddingSharder.sharding_types",
         "row_wise, table_row_wise, grid_shard offered on npu and cpu (EmbeddingBagCollection "
         "and every sharder inheriting it)", _gate_sharding_types),
    Gate("pipeline_streams", "torchrec/distributed/train_pipeline/train_pipelines.py",
         "TrainPipelineBase / SparseDist / FusedSparseDist / SemiSync / "
         "PrefetchTrainPipelineSparseDist .__init__",
         "on npu: memcpy / data-dist / embedding-lookup / prefetch streams from "
         "torch.get_device_module('npu').Stream and its stream() context, as on cuda",
         _gate_pipeline_streams),
    Gate("runtime_forward_device", "torchrec/distributed/train_pipeline/runtime_forwards.py",
         "BaseForward.__init__",
         "without a stream the forward runs on cpu (TorchRec assumed cuda, which broke "
         "TrainPipelineSemiSync and TrainPipelineFusedSparseDist on cpu)",
         _gate_runtime_forward_device),
    Gate("cpu_record_stream", "torchrec/distributed/train_pipeline/utils.py",
         "_wait_for_events, _start_embedding_lookup (also bound in train_pipelines.py, "
         "pipeline_stage.py); torchrec/sparse/jagged_tensor.py: JaggedTensor / "
         "KeyedJaggedTensor / KeyedTensor .record_stream",
         "cpu streams are passed as None (TrainPipelineSemiSync's embedding lookup recorded "
         "torch.cpu's current stream on the batch and its KJTs and failed on cpu)",
         _gate_cpu_record_stream),
    Gate("dense_tbe_device", "torchrec/distributed/batched_embedding_kernel.py",
         "BatchedDenseEmbedding / BatchedDenseEmbeddingBag .__init__",
         "data_parallel tables live on npu: TorchRec builds fbgemm's dense TBE on cpu when "
         "cuda/mtia are absent; the gate moves it to the npu and re-slices the table parameters",
         _gate_dense_tbe_device),
]


def open_gates() -> Dict[str, str]:
    """Open every gate (idempotent).  Returns {gate name: "open" | "failed: <why>"}."""
    with _LOCK:
        if _STATUS and all(v == "open" for v in _STATUS.values()):
            return dict(_STATUS)
        import torchrec

        version = getattr(torchrec, "__version__", "unknown")
        if not version.startswith(TORCHREC_VERSION):
            warnings.warn(
                f"torchrec_ascend's device gates are written for torchrec {TORCHREC_VERSION}, "
                f"found {version}: check docs/integration.md"
            )
        for gate in GATES:
            try:
                gate.apply()
                _STATUS[gate.name] = "open"
            except Exception as e:  # keep `import torchrec_ascend` working; report it
                _STATUS[gate.name] = f"failed: {type(e).__name__}: {e}"
                warnings.warn(f"torchrec_ascend gate {gate.name!r} ({gate.target}) not opened: {e}")
        return dict(_STATUS)


def gate_status() -> Dict[str, str]:
    """{gate name: "open" | "failed: ..." | "closed"} for every gate."""
    return {g.name: _STATUS.get(g.name, "closed") for g in GATES}


def is_patched(fn: Optional[Callable]) -> bool:
    """Whether ``fn`` is a gate wrapper (for tests and docs)."""
    return bool(getattr(fn, _MARK, False))
