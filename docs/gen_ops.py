"""Generate the tables of docs/ops.md from the op registry and benchmarks/results/ops.json.

``python docs/gen_ops.py`` rewrites the generated sections of docs/ops.md (between
``<!-- BEGIN <name> -->`` / ``<!-- END <name> -->`` markers); ``--check`` exits 1 when the
coverage section or the benchmark table is out of date (tests/ops/test_sparse.py runs the same
comparisons), so neither can drift from ``torchrec_ascend.ops.registry`` and
benchmarks/results/ops.json.

Sections:
* ``coverage``: op x backend, from the registered :class:`OpSpec` s (what implementations
  exist; the same on every machine with fbgemm-gpu-cpu 1.8.0 installed);
* ``resolved``: op x device -> backend chosen on the generating machine, from
  ``registry.describe_rows()`` (depends on what is installed/built there);
* ``benchmark``: the measured table of benchmarks/results/ops.json.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "ops.md")
RESULTS = os.path.join(ROOT, "benchmarks", "results", "ops.json")
sys.path.insert(0, ROOT)


def _registry():
    import torchrec_ascend.ops  # noqa: F401  (registers every op)
    from torchrec_ascend.ops import registry

    return registry


def _fbgemm_cell(name: str) -> str:
    """fbgemm column: which devices fbgemm_gpu has a kernel for (CPU wheel: CPU is knowable)."""
    import torch

    reg = _registry()
    s = reg.spec(name)
    if not s.fbgemm:
        return "-"
    if not reg.fbgemm_loaded():
        return "cpu?, cuda"
    qual = f"fbgemm::{name}"
    cpu = any(torch._C._dispatch_has_kernel_for_dispatch_key(qual, k)
              for k in ("CPU", "CompositeImplicitAutograd"))
    return "cpu, cuda" if cpu else "cuda"


def _partial(s, backend: str, devices: str) -> str:
    """A backend cell: its devices, and the cases it covers where it declares a Limit (the other
    calls go to the next backend)."""
    lim = s.limits.get(backend)
    return devices if lim is None else f"{devices} ({lim.covers})"


def coverage_markdown() -> str:
    """The op x backend coverage table (devices per backend), from the registered specs."""
    reg = _registry()
    lines = ["| op | fbgemm | fbgemm-ascend 1.5 | triton | cpu kernel | reference |",
             "|---|---|---|---|---|---|"]
    for s in reg.all_specs():
        lines.append("| `{}` | {} | {} | {} | {} | {} |".format(
            s.name, _fbgemm_cell(s.name), "npu" if s.fbgemm_ascend else "-",
            _partial(s, "triton", "cuda, npu") if s.triton is not None else "-",
            _partial(s, "cpu_kernel", "cpu") if s.cpu_kernel is not None else "-",
            "cpu, cuda, npu"))
    return "\n".join(lines)


def resolved_markdown() -> str:
    """op x device -> chosen backend on this machine (``registry.describe_rows()``)."""
    reg = _registry()
    chosen: Dict[str, Dict[str, str]] = {}
    for op, dev, backend, _why in reg.describe_rows():
        chosen.setdefault(op, {})[dev] = backend
    lines = ["| op | " + " | ".join(reg.DEVICES) + " |",
             "|---|" + "---|" * len(reg.DEVICES)]
    for op, per_dev in chosen.items():
        lines.append(f"| `{op}` | " + " | ".join(per_dev[d] for d in reg.DEVICES) + " |")
    return "\n".join(lines)


def benchmark_markdown(path: str = RESULTS) -> Optional[str]:
    """The measured table of benchmarks/results/ops.json (None if absent)."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        doc = json.load(f)
    m = doc.get("machine", {})
    head = (f"Measured {m.get('time', '?')} on {m.get('cpu', '?')}, {doc.get('torch_threads')} "
            f"torch threads, torch {m.get('torch', '?')}"
            f"{' (--quick)' if doc.get('quick') else ''}; {doc.get('shape_note', '')}.")

    def fmt(v, nd=None):
        if v is None:
            return "-"
        if not isinstance(v, float):
            return str(v)
        return f"{v:.{nd}f}" if nd is not None else f"{v:.4g}"

    lines = [head, "",
             "| op | ours ms | baseline | baseline ms | ratio | target | met | backend | shapes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        met = {True: "yes", False: "**no**", None: "-"}[r["meets_target"]]
        base = r.get("baseline", "fbgemm")
        base_ms = r.get("baseline_ms", r.get("fbgemm_ms"))
        lines.append(f"| `{r['op']}` | {fmt(r['ours_ms'])} | {base} | {fmt(base_ms)} | "
                     f"{fmt(r['ratio'], 2)} | {fmt(r['target'], 1)} | {met} | {r['backend']} | "
                     f"{r['shapes']} |")
    return "\n".join(lines)


def _section(text: str, name: str) -> Optional[str]:
    m = re.search(rf"<!-- BEGIN {name} -->\n(.*?)<!-- END {name} -->", text, re.S)
    return m.group(1).strip() if m else None


def _replace(text: str, name: str, body: str) -> str:
    pattern = rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)"
    if not re.search(pattern, text, re.S):
        raise ValueError(f"{DOC}: has no '<!-- BEGIN {name} -->' ... '<!-- END {name} -->' section")
    return re.sub(pattern, lambda m: m.group(1) + body + "\n" + m.group(2), text, flags=re.S)


def documented_coverage(path: str = DOC) -> Optional[str]:
    """The coverage table as docs/ops.md has it now."""
    with open(path) as f:
        return _section(f.read(), "coverage")


def documented_benchmark(path: str = DOC) -> Optional[str]:
    """The benchmark table as docs/ops.md has it now."""
    with open(path) as f:
        return _section(f.read(), "benchmark")


def update_benchmark(path: str = DOC) -> None:
    """Rewrite only the benchmark section (benchmarks/ops.py calls this after a full run)."""
    bench = benchmark_markdown()
    if bench is None:
        return
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(_replace(text, "benchmark", bench))


def update(path: str = DOC) -> None:
    """Rewrite the generated sections of docs/ops.md."""
    with open(path) as f:
        text = f.read()
    text = _replace(text, "coverage", coverage_markdown())
    text = _replace(text, "resolved", resolved_markdown())
    bench = benchmark_markdown()
    if bench is not None:
        text = _replace(text, "benchmark", bench)
    with open(path, "w") as f:
        f.write(text)


def main(argv: List[str]) -> int:
    if "--check" in argv:
        if documented_coverage() != coverage_markdown().strip():
            print("docs/ops.md: coverage table is out of date; run python docs/gen_ops.py")
            return 1
        bench = benchmark_markdown()
        if bench is not None and documented_benchmark() != bench.strip():
            print("docs/ops.md: benchmark table differs from benchmarks/results/ops.json; run "
                  "python docs/gen_ops.py")
            return 1
        print("docs/ops.md: coverage and benchmark tables up to date")
        return 0
    update()
    print(f"updated {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
