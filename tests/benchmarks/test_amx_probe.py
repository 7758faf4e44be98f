"""benchmarks/probes/amx_tile_rate.cpp: builds, and where the CPU has AMX-BF16 reports rates."""

import json
import pathlib
import platform
import shutil
import subprocess

import pytest

PROBE = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "probes" / "amx_tile_rate.cpp"


def _cpu_flags() -> set:
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(shutil.which("g++") is None or platform.machine() not in ("x86_64", "AMD64"),
                    reason="no g++, or not an x86-64 machine")
def test_probe_builds_and_reports(tmp_path):
    exe = tmp_path / "amx_tile_rate"
    subprocess.run(["g++", "-O2", "-mamx-tile", "-mamx-bf16", str(PROBE), "-o", str(exe)], check=True)
    if "amx_bf16" not in _cpu_flags():
        pytest.skip("CPU without AMX-BF16: built, not run")
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    if out.returncode == 2:
        pytest.skip(out.stderr.strip())
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["probe"] == "amx_tile_rate" and rep["threads"] == 1
    assert rep["tdp_gflops"] > 0 and rep["tdp_l1_loads_gflops"] > 0
    # tile 0 after the last run: 1e6 products of bf16 ones into it, each adding 32 per element
    # (exact in fp32: 3.2e7 < 2^25, whose spacing 2 divides 32)
    assert rep["check"] == 1_000_000 * 32
