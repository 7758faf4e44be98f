"""HierarchicalTopology: presets, the launcher's environment, YAML / JSON files, and the round
trip through TorchRec's Topology (built by TopologyFactory, no warning)."""

from __future__ import annotations

import json
import logging
import os
import warnings

import pytest

pytest.importorskip("torchrec")

import torchrec_ascend  # noqa: E402,F401
import torch  # noqa: E402
from torchrec.distributed.planner.types import Topology  # noqa: E402

from torchrec_ascend.distributed.planner import (  # noqa: E402
    PRESETS, HierarchicalTopology, LinkSpec)
from torchrec_ascend.distributed.planner.topology import (  # noqa: E402
    device_name_known, ensure_device_name)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_round_trips_through_torchrec_without_warnings(name, caplog):
    topo = HierarchicalTopology.from_preset(name, hosts=3)
    p = PRESETS[name]
    assert topo.world_size == 3 * p.devices_per_host and topo.compute_device == p.compute_device
    ensure_device_name(topo.compute_device)  # npu placements parse (as the CLI does)
    assert device_name_known(topo.compute_device)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with caplog.at_level(logging.WARNING):
            trc = topo.to_torchrec()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert (trc.world_size, trc.local_world_size) == (topo.world_size, topo.devices_per_host)
    store = trc.devices[0].storage
    assert (store.ddr if topo.compute_device == "cpu" else store.hbm) == p.memory_bytes
    assert trc.intra_host_bw == pytest.approx(p.intra_host.bandwidth / 1000)  # bytes/ms
    assert trc.inter_host_bw == pytest.approx(p.inter_host.bandwidth / 1000)
    back = HierarchicalTopology.from_torchrec(trc)
    for f in ("hosts", "devices_per_host", "compute_device", "memory_bytes"):
        assert getattr(back, f) == getattr(topo, f)
    assert back.memory_bandwidth == pytest.approx(topo.memory_bandwidth)
    assert back.inter_host.bandwidth == pytest.approx(topo.inter_host.bandwidth)


def test_published_figures():
    """The presets hold the vendors' figures (per direction: bidirectional halved)."""
    a2, h100, h200 = PRESETS["ascend-a2"], PRESETS["h100"], PRESETS["h200"]
    assert a2.memory_bytes == 64 << 30 and a2.inter_host.bandwidth == 25e9
    assert h100.memory_bytes == 80 << 30 and h100.intra_host.bandwidth == 450e9
    assert h200.memory_bytes == 141e9 and h200.memory_bandwidth == 4.8e12
    assert PRESETS["ascend-a3"].devices_per_host == 16
    assert all(p.source for p in PRESETS.values())


def test_from_env():
    env = {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}
    t = HierarchicalTopology.from_env(compute_device="npu", environ=env)
    assert (t.hosts, t.devices_per_host, t.name) == (2, 8, "ascend-a2")
    t = HierarchicalTopology.from_env(compute_device="cuda", environ=env, preset="h200")
    assert t.name == "h200" and t.world_size == 16
    cpu = HierarchicalTopology.from_env(compute_device="cpu", environ={"WORLD_SIZE": "4"})
    assert (cpu.hosts, cpu.devices_per_host) == (1, 4)
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert cpu.memory_bytes == physical // 4
    assert HierarchicalTopology.from_env(compute_device="cpu", environ={}).world_size == 1
    for bad, match in (({"WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "4"}, "divide"),
                       ({"WORLD_SIZE": "x"}, "WORLD_SIZE"), ({"WORLD_SIZE": "0"}, ">= 1")):
        with pytest.raises(ValueError, match=match):
            HierarchicalTopology.from_env(compute_device="cpu", environ=bad)
    with pytest.raises(ValueError, match="compute_device"):
        HierarchicalTopology.from_env(compute_device="tpu", environ={})


@pytest.mark.parametrize("ext", ["yaml", "json"])
def test_file_round_trip(tmp_path, ext):
    topo = HierarchicalTopology.from_preset("h100", hosts=4, memory_bytes=40 << 30,
                                            inter_host=LinkSpec(25e9, 2e-5), allreduce="direct")
    path = tmp_path / f"topo.{ext}"
    if ext == "json":
        path.write_text(json.dumps(topo.to_dict()))
    else:
        import yaml

        path.write_text(yaml.safe_dump(topo.to_dict()))
    assert HierarchicalTopology.from_file(str(path)) == topo
    path.write_text("preset: ascend-a2\nhosts: 2\ninter_host: {bandwidth: 5.0e10}\n"
                    if ext == "yaml" else
                    '{"preset": "ascend-a2", "hosts": 2, "inter_host": {"bandwidth": 5e10}}')
    t = HierarchicalTopology.from_file(str(path))
    assert t.world_size == 16 and t.inter_host == LinkSpec(5e10, 0.0)


def test_bad_files_and_fields(tmp_path):
    bad = tmp_path / "t.yaml"
    bad.write_text("hosts: 2\nspeed: 3\n")
    with pytest.raises(ValueError, match="unknown keys"):
        HierarchicalTopology.from_file(str(bad))
    bad.write_text("preset: cpu\ninter_host: 12\n")
    with pytest.raises(ValueError, match="inter_host"):
        HierarchicalTopology.from_file(str(bad))
    bad.write_text("hosts: 2\n")
    with pytest.raises(ValueError, match="missing keys"):
        HierarchicalTopology.from_file(str(bad))
    txt = tmp_path / "t.txt"
    txt.write_text("{}")
    with pytest.raises(ValueError, match=".yaml"):
        HierarchicalTopology.from_file(str(txt))
    with pytest.raises(ValueError, match="preset"):
        HierarchicalTopology.from_preset("a100")
    with pytest.raises(ValueError, match="hosts"):
        HierarchicalTopology.from_preset("cpu", hosts=0)
    with pytest.raises(ValueError, match="allreduce"):
        HierarchicalTopology.from_preset("cpu", allreduce="ring")
    with pytest.raises(ValueError, match="unknown topology fields"):
        HierarchicalTopology.from_preset("cpu", nics=2)


def test_shape_helpers():
    t = HierarchicalTopology.from_preset("cpu", hosts=3, devices_per_host=2)
    assert [t.host_of(r) for r in range(6)] == [0, 0, 1, 1, 2, 2]
    assert list(t.host_ranks(1)) == [2, 3]
    assert t.same_host()[2, 3] and not t.same_host()[1, 2]
    with pytest.raises(ValueError, match="rank"):
        t.host_of(6)


def test_plain_torchrec_topology_is_one_host_unless_told():
    one = HierarchicalTopology.from_torchrec(Topology(world_size=4, compute_device="cpu"))
    assert (one.hosts, one.devices_per_host) == (1, 4)
    two = HierarchicalTopology.from_torchrec(
        Topology(world_size=4, local_world_size=2, compute_device="cpu"))
    assert (two.hosts, two.devices_per_host) == (2, 2)


def test_ensure_device_name():
    ensure_device_name("cpu")  # known: nothing to do
    with pytest.raises(ValueError, match="does not know"):
        ensure_device_name("tpu")


def test_ensure_device_name_leaves_torch_usable():
    """After naming PrivateUse1 ``npu`` offline, torch's RNG forking (which asks the current
    accelerator's module) still works: the planner registers a "no device" ``torch.npu``."""
    ensure_device_name("npu")
    assert device_name_known("npu")
    with torch.random.fork_rng():
        torch.manual_seed(3)
        a = torch.rand(2)
    torch.manual_seed(3)
    assert torch.equal(a, torch.rand(2))
