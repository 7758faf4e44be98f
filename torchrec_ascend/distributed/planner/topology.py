"""``HierarchicalTopology``: hosts x devices per host, two link classes, per-device memory.

Built from arguments, from a preset (:mod:`.presets`), from the launcher's environment
(``WORLD_SIZE`` / ``LOCAL_WORLD_SIZE``) or from a YAML / JSON file; converts to TorchRec's
``Topology`` through TorchRec's own ``TopologyFactory`` (so TorchRec's components see the same
memory and bandwidths), and back from a plain TorchRec ``Topology``.

Ranks are host-major, as torchrun numbers them: rank ``r`` is device ``r % devices_per_host``
of host ``r // devices_per_host``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
from typing import Any, Dict, Mapping, Optional

import numpy as np
from torchrec.distributed.planner.types import (
    HardwareConfig,
    KernelConfig,
    Topology,
    TopologyFactory,
    TrainerConfig,
)

from .presets import DEFAULT_PRESET, DevicePreset, preset
from .types import LinkSpec, format_bytes

__all__ = ["HierarchicalTopology", "COMPUTE_DEVICES", "ALLREDUCE_ALGORITHMS", "device_name_known",
           "ensure_device_name"]

COMPUTE_DEVICES = ("npu", "cuda", "cpu")
# how a data-parallel table's gradient all-reduce moves bytes (see estimators.allreduce_matrix)
ALLREDUCE_ALGORITHMS = ("hierarchical", "direct")
_MS = 1000.0  # TorchRec's bandwidths are bytes per millisecond


@dataclasses.dataclass(frozen=True)
class _DeviceKernelConfig(KernelConfig):
    """TorchRec's ``KernelConfig`` (an extension point per device kind) accepting ``npu``, which
    ``import torchrec_ascend`` lets ``Topology`` take (docs/integration.md, gate ``topology``)."""

    def validate(self) -> None:
        if self.compute_device not in ("cuda", "mtia", "cpu", "npu"):
            raise ValueError(f"compute_device={self.compute_device!r}: must be cuda, mtia, cpu "
                             "or npu")


@dataclasses.dataclass(frozen=True)
class HierarchicalTopology:
    """``hosts`` x ``devices_per_host`` devices of ``compute_device``.

    ``memory_bytes``: memory per device for embeddings (HBM; on cpu the DDR of one rank);
    ``memory_bandwidth``: bytes/s of that memory (prices lookups); ``peak_flops``: per-device
    peak dense FLOP/s (reported, not used by the lookup model); ``intra_host`` /
    ``inter_host``: per-device links inside a host and between hosts; ``allreduce``: how the
    gradient all-reduce of data-parallel tables moves bytes ("hierarchical": reduce-scatter in
    the host, all-reduce across hosts, all-gather in the host, as HCCL and NCCL do; "direct":
    every rank exchanges a 1/world slice with every other rank)."""

    hosts: int
    devices_per_host: int
    compute_device: str
    memory_bytes: int
    memory_bandwidth: float
    intra_host: LinkSpec
    inter_host: LinkSpec
    peak_flops: float = 0.0
    allreduce: str = "hierarchical"
    name: str = "custom"

    def __post_init__(self) -> None:
        for field in ("hosts", "devices_per_host", "memory_bytes"):
            v = getattr(self, field)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{field}={v!r}: must be an integer >= 1")
        if self.compute_device not in COMPUTE_DEVICES:
            raise ValueError(f"compute_device={self.compute_device!r}: must be one of "
                             f"{COMPUTE_DEVICES}")
        if not self.memory_bandwidth > 0:
            raise ValueError(f"memory_bandwidth={self.memory_bandwidth}: must be > 0 bytes/s")
        if not self.peak_flops >= 0:
            raise ValueError(f"peak_flops={self.peak_flops}: must be >= 0")
        for field in ("intra_host", "inter_host"):
            if not isinstance(getattr(self, field), LinkSpec):
                raise ValueError(f"{field}: must be a LinkSpec, got {getattr(self, field)!r}")
        if self.allreduce not in ALLREDUCE_ALGORITHMS:
            raise ValueError(f"allreduce={self.allreduce!r}: must be one of "
                             f"{ALLREDUCE_ALGORITHMS}")

    # ------------------------------------------------------------------ shape

    @property
    def world_size(self) -> int:
        return self.hosts * self.devices_per_host

    @property
    def local_world_size(self) -> int:
        return self.devices_per_host

    def host_of(self, rank: int) -> int:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank={rank}: must be in [0, {self.world_size})")
        return rank // self.devices_per_host

    def host_ranks(self, host: int) -> range:
        if not 0 <= host < self.hosts:
            raise ValueError(f"host={host}: must be in [0, {self.hosts})")
        return range(host * self.devices_per_host, (host + 1) * self.devices_per_host)

    def same_host(self) -> np.ndarray:
        """``[world, world]`` bool: ranks i and j share a host."""
        h = np.arange(self.world_size) // self.devices_per_host
        return h[:, None] == h[None, :]

    def replace(self, **changes: Any) -> "HierarchicalTopology":
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ constructors

    @staticmethod
    def from_preset(name: str, hosts: int = 1, devices_per_host: Optional[int] = None,
                    **overrides: Any) -> "HierarchicalTopology":
        """A preset's host kind (:data:`.presets.PRESETS`), ``hosts`` of them; any field can be
        overridden (``memory_bytes=...``, ``inter_host=LinkSpec(...)``, ...)."""
        p: DevicePreset = preset(name)
        fields = dict(
            hosts=hosts,
            devices_per_host=p.devices_per_host if devices_per_host is None else devices_per_host,
            compute_device=p.compute_device, memory_bytes=p.memory_bytes,
            memory_bandwidth=p.memory_bandwidth, peak_flops=p.peak_flops,
            intra_host=p.intra_host, inter_host=p.inter_host, name=p.name)
        unknown = set(overrides) - {f.name for f in dataclasses.fields(HierarchicalTopology)}
        if unknown:
            raise ValueError(f"unknown topology fields {sorted(unknown)}")
        fields.update(overrides)
        return HierarchicalTopology(**fields)

    @staticmethod
    def from_env(compute_device: Optional[str] = None, preset: Optional[str] = None,
                 environ: Optional[Mapping[str, str]] = None,
                 **overrides: Any) -> "HierarchicalTopology":
        """The job's topology from the launcher's ``WORLD_SIZE`` (default 1) and
        ``LOCAL_WORLD_SIZE`` (default: the world size, one host), with the defaults of
        ``preset`` or of the device kind (npu: ascend-a2, cuda: h100, cpu: cpu).  On cpu the
        memory per rank is this host's physical memory divided by the local world size."""
        env = os.environ if environ is None else environ
        world = _env_int(env, "WORLD_SIZE", 1)
        local = _env_int(env, "LOCAL_WORLD_SIZE", world)
        if world % local:
            raise ValueError(f"LOCAL_WORLD_SIZE={local} must divide WORLD_SIZE={world}")
        if compute_device is None and preset is None:
            from torchrec_ascend import device as _device

            compute_device = _device.device_type()
        if preset is None:
            if compute_device not in DEFAULT_PRESET:
                raise ValueError(f"compute_device={compute_device!r}: must be one of "
                                 f"{COMPUTE_DEVICES}")
            preset = DEFAULT_PRESET[compute_device]
        topo = HierarchicalTopology.from_preset(preset, hosts=world // local,
                                                devices_per_host=local, **overrides)
        if compute_device is not None and topo.compute_device != compute_device:
            topo = topo.replace(compute_device=compute_device)
        if topo.compute_device == "cpu" and "memory_bytes" not in overrides:
            host_mem = _host_memory_bytes()
            if host_mem:
                topo = topo.replace(memory_bytes=max(1, host_mem // local))
        return topo

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "HierarchicalTopology":
        """From :meth:`to_dict`'s layout; ``preset`` (optional) supplies the fields not given.
        Links are ``{"bandwidth": bytes/s, "latency": s}``."""
        d = dict(d)
        known = {f.name for f in dataclasses.fields(HierarchicalTopology)} | {"preset"}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"topology: unknown keys {sorted(unknown)} (known: {sorted(known)})")
        for link in ("intra_host", "inter_host"):
            if link in d and not isinstance(d[link], LinkSpec):
                spec = d[link]
                if not isinstance(spec, Mapping) or set(spec) - {"bandwidth", "latency"} \
                        or "bandwidth" not in spec:
                    raise ValueError(f"topology: {link} must be {{bandwidth: bytes/s, latency: "
                                     f"s}}, got {spec!r}")
                d[link] = LinkSpec(float(spec["bandwidth"]), float(spec.get("latency", 0.0)))
        name = d.pop("preset", None)
        if name is not None:
            return HierarchicalTopology.from_preset(name, **d)
        missing = [f.name for f in dataclasses.fields(HierarchicalTopology)
                   if f.default is dataclasses.MISSING and f.name not in d]
        if missing:
            raise ValueError(f"topology: missing keys {missing} (or give a preset)")
        return HierarchicalTopology(**d)

    @staticmethod
    def from_file(path: str) -> "HierarchicalTopology":
        """From a ``.yaml`` / ``.yml`` / ``.json`` file in :meth:`to_dict`'s layout."""
        return HierarchicalTopology.from_dict(load_mapping(path, "topology"))

    @staticmethod
    def from_torchrec(topology: Topology, preset: Optional[str] = None) -> "HierarchicalTopology":
        """A TorchRec ``Topology`` read as hosts of ``local_world_size`` devices: its memory per
        device (HBM, or DDR on cpu), bandwidths and HBM bandwidth; latencies and peak FLOP/s
        from ``preset`` (default: the device kind's)."""
        dev = topology.compute_device
        if dev not in COMPUTE_DEVICES:
            raise ValueError(f"topology.compute_device={dev!r}: must be one of {COMPUTE_DEVICES}")
        local = topology.local_world_size
        if topology.world_size % local:
            raise ValueError(f"topology: local_world_size={local} must divide "
                             f"world_size={topology.world_size}")
        p = _preset_for(dev, preset)
        store = topology.devices[0].storage
        memory = store.ddr if dev == "cpu" else store.hbm
        mem_bw = topology.ddr_mem_bw if dev == "cpu" else topology.hbm_mem_bw
        return HierarchicalTopology(
            hosts=topology.world_size // local, devices_per_host=local, compute_device=dev,
            memory_bytes=int(memory), memory_bandwidth=mem_bw * _MS, peak_flops=p.peak_flops,
            intra_host=LinkSpec(topology.intra_host_bw * _MS, p.intra_host.latency),
            inter_host=LinkSpec(topology.inter_host_bw * _MS, p.inter_host.latency),
            name=f"torchrec:{dev}")

    # ------------------------------------------------------------------ conversions

    def to_dict(self) -> Dict[str, Any]:
        d = dataclasses.asdict(self)
        d["intra_host"] = dataclasses.asdict(self.intra_host)
        d["inter_host"] = dataclasses.asdict(self.inter_host)
        return d

    def to_torchrec(self) -> Topology:
        """TorchRec's ``Topology`` of the same shape, memory and bandwidths, built by
        ``TopologyFactory`` (the path TorchRec asks for; no "constructed directly" warning)."""
        mem = self.memory_bytes
        on_cpu = self.compute_device == "cpu"
        hardware = HardwareConfig(
            hbm_cap_bytes=None if on_cpu else mem, ddr_cap_bytes=mem if on_cpu else None,
            intra_host_bw=self.intra_host.bandwidth / _MS,
            inter_host_bw=self.inter_host.bandwidth / _MS,
            hbm_mem_bw=None if on_cpu else self.memory_bandwidth / _MS,
            ddr_mem_bw=self.memory_bandwidth / _MS if on_cpu else None)
        return TopologyFactory.create_topology(
            trainer_config=TrainerConfig(world_size=self.world_size,
                                         local_world_size=self.devices_per_host),
            hardware_config=hardware,
            kernel_config=_DeviceKernelConfig(compute_device=self.compute_device,
                                              use_hardware_based_bandwidth=True))

    def describe(self) -> str:
        gbs = 1e9
        return (f"{self.name}: {self.hosts} host(s) x {self.devices_per_host} {self.compute_device}"
                f", {format_bytes(self.memory_bytes).split(' (')[0]} per device, intra "
                f"{self.intra_host.bandwidth / gbs:.1f} GB/s, inter "
                f"{self.inter_host.bandwidth / gbs:.1f} GB/s per device, all-reduce "
                f"{self.allreduce}")


def device_name_known(compute_device: str) -> bool:
    """Whether torch parses ``"<compute_device>:0"`` (TorchRec writes shard placements so)."""
    import torch

    try:
        torch.device(f"{compute_device}:0")
    except RuntimeError:
        return False
    return True


def ensure_device_name(compute_device: str) -> None:
    """Let torch parse ``npu`` placements on a machine without an NPU, to plan a cluster offline
    (the CLI and the benchmark call it): names PrivateUse1 ``npu``, as torch_npu and the
    simulated npu do, unless torch knows the name already.  Anything else PrivateUse1 is named
    is an error."""
    import torch

    if device_name_known(compute_device):
        return
    if compute_device != "npu":
        raise ValueError(f"compute_device={compute_device!r}: torch does not know this device")
    current = torch._C._get_privateuse1_backend_name()
    if current != "privateuseone":
        raise RuntimeError(f"PrivateUse1 is named {current!r}; cannot name it 'npu'")
    torch.utils.rename_privateuse1_backend("npu")
    if not hasattr(torch, "npu"):
        # torch now reports ``npu`` as the current accelerator; code asking for its module
        # (``torch.random.fork_rng``, ``torch.get_device_module``) must find one that says
        # "no device here" rather than fail.
        torch._register_device_module("npu", _OfflineNpuModule("torch.npu"))


class _OfflineNpuModule(types.ModuleType):
    """``torch.npu`` on a machine that only plans for NPUs: no device, nothing to run on.
    The simulated npu (:mod:`torchrec_ascend.testing.simulated_npu`) replaces it when enabled."""

    OFFLINE_PLACEHOLDER = True

    @staticmethod
    def is_available() -> bool:
        return False

    @staticmethod
    def device_count() -> int:
        return 0


def _preset_for(compute_device: str, name: Optional[str]) -> DevicePreset:
    return preset(name if name is not None else DEFAULT_PRESET[compute_device])


def _env_int(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{key}={raw!r}: must be an integer") from None
    if value < 1:
        raise ValueError(f"{key}={value}: must be >= 1")
    return value


def _host_memory_bytes() -> Optional[int]:
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def load_mapping(path: str, what: str) -> Dict[str, Any]:
    """A YAML (``.yaml`` / ``.yml``) or JSON (``.json``) file holding a mapping."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".yaml", ".yml", ".json"):
        raise ValueError(f"{what} file {path!r}: must end in .yaml, .yml or .json")
    with open(path) as f:
        text = f.read()
    try:
        if ext == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as e:  # json.JSONDecodeError, yaml.YAMLError: one line naming the file
        detail = " ".join(str(e).split())
        raise ValueError(f"{what} file {path!r} does not parse: {detail}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} file {path!r}: must hold a mapping, got {type(data).__name__}")
    return data
