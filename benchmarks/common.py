"""Shared benchmark plumbing: machine info, timing, JSON + table output.  (The peak GEMM rate
is :func:`torchrec_ascend.metrics.measure_peak_gemm_flops`.)

Every benchmark prints a table and writes ``benchmarks/results/<name>.json`` holding its rows and
:func:`machine_info`.  Ratios are always measured side by side, in one run, on the same inputs.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


CPU_KINDS = ("amx", "avx512bf16", "avx512", "avx2", "generic")  # what cpu_kind returns, fastest first


def cpu_kind() -> str:
    """The CPU's kind by the extensions that decide the fastest GEMM dtype and the HSTU engines:
    ``amx`` (AMX-BF16), ``avx512bf16`` (AVX512-BF16, no AMX), ``avx512``, ``avx2`` or ``generic``;
    result files measured per kind are named by it."""
    from torchrec_ascend.device import cpu_flags

    flags = cpu_flags()
    if "amx_bf16" in flags:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512bf16"
    if "avx512f" in flags:
        return "avx512"
    if "avx2" in flags:
        return "avx2"
    return "generic"


def machine_info() -> Dict[str, object]:
    """What ran the benchmark: CPU, threads, torch version, device."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    from torchrec_ascend.device import cpu_flags

    isa = sorted(f for f in cpu_flags() if f in ("avx2", "fma") or f.startswith(("avx512", "amx")))
    return {
        "cpu": cpu,
        "cpu_isa": isa,  # the vector/matrix extensions that decide GEMM speed per dtype
        "cpu_kind": cpu_kind(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def timeit(fn: Callable[[], object], warmup: int = 2, repeat: int = 5,
           sync: Optional[Callable[[], None]] = None) -> float:
    """Median wall time of ``fn()`` in milliseconds."""
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    times: List[float] = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def print_table(rows: Sequence[Dict[str, object]], columns: Optional[Sequence[str]] = None) -> None:
    """Print rows (dicts) as an aligned text table."""
    if not rows:
        print("(no rows)")
        return
    columns = list(columns or rows[0].keys())

    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def write_json(name: str, payload: Dict[str, object]) -> str:
    """Write ``benchmarks/results/<name>.json`` (with machine info) atomically; return its path."""
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{name}.json")
    doc = {"benchmark": name, "machine": machine_info(), **payload}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(tmp, path)
    return path


def heavy_tailed_lengths(batch: int, max_len: int, mean_frac: float = 0.25,
                         generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """KuaiRand-like sequence lengths: log-normal-ish long tail, mean about ``mean_frac * max_len``,
    clipped to [1, max_len] with at least one sequence at ``max_len``."""
    g = generator or torch.Generator().manual_seed(0)
    # lognormal with sigma 1: mean = exp(mu + 0.5)
    sigma = 1.0
    mu = torch.log(torch.tensor(mean_frac * max_len)) - 0.5 * sigma ** 2
    x = torch.exp(mu + sigma * torch.randn(batch, generator=g))
    lengths = x.round().clamp(1, max_len).to(torch.int64)
    if batch:
        lengths[int(torch.randint(batch, (1,), generator=g))] = max_len
    return lengths


def doc_section(text: str, name: str) -> Optional[str]:
    """The body of the generated section ``<!-- BEGIN name -->`` ... ``<!-- END name -->`` of a
    markdown text (None without one)."""
    m = re.search(rf"<!-- BEGIN {name} -->\n(.*?)<!-- END {name} -->", text, re.S)
    return m.group(1).strip() if m else None


def replace_doc_section(text: str, name: str, body: str) -> str:
    """``text`` with the body of its generated section ``name`` replaced by ``body``."""
    pattern = rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)"
    if not re.search(pattern, text, re.S):
        raise ValueError(f"no '<!-- BEGIN {name} -->' ... '<!-- END {name} -->' section")
    return re.sub(pattern, lambda m: m.group(1) + body + "\n" + m.group(2), text, flags=re.S)
