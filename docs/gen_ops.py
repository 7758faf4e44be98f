"""Generate the tables of docs/ops.md from the op registry and benchmarks/results/ops_<cpu kind>.json.

``python docs/gen_ops.py`` rewrites the generated sections of docs/ops.md (between
``<!-- BEGIN <name> -->`` / ``<!-- END <name> -->`` markers); ``--check`` exits 1 when the
coverage section or the benchmark table is out of date (tests/ops/test_sparse.py runs the same
comparisons), so neither can drift from ``torchrec_ascend.ops.registry`` and the committed
full runs of benchmarks/ops.py.

Sections:
* ``coverage``: op x backend, from the registered :class:`OpSpec` s (what implementations
  exist; the same on every machine with fbgemm-gpu-cpu 1.8.0 installed);
* ``resolved``: op x device -> backend chosen on the generating machine, from
  ``registry.describe_rows()`` (depends on what is installed/built there);
* ``benchmark``: the measured tables of benchmarks/results/ops_<cpu kind>.json, one per kind.
"""

from __future__ import annotations

import os
import sys
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "ops.md")
sys.path.insert(0, ROOT)

from benchmarks.common import doc_section, replace_doc_section  # noqa: E402
from benchmarks.ops import benchmark_markdown  # noqa: E402  (the section's body)


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


def documented_coverage(path: str = DOC) -> Optional[str]:
    """The coverage table as docs/ops.md has it now."""
    with open(path) as f:
        return doc_section(f.read(), "coverage")


def documented_benchmark(path: str = DOC) -> Optional[str]:
    """The benchmark table as docs/ops.md has it now."""
    with open(path) as f:
        return doc_section(f.read(), "benchmark")


def update(path: str = DOC) -> None:
    """Rewrite the generated sections of docs/ops.md."""
    with open(path) as f:
        text = f.read()
    text = replace_doc_section(text, "coverage", coverage_markdown())
    text = replace_doc_section(text, "resolved", resolved_markdown())
    bench = benchmark_markdown()
    if bench is not None:
        text = replace_doc_section(text, "benchmark", bench)
    with open(path, "w") as f:
        f.write(text)


def main(argv: List[str]) -> int:
    if "--check" in argv:
        if documented_coverage() != coverage_markdown().strip():
            print("docs/ops.md: coverage table is out of date; run python docs/gen_ops.py")
            return 1
        bench = benchmark_markdown()
        if bench is not None and documented_benchmark() != bench.strip():
            print("docs/ops.md: benchmark tables differ from benchmarks/results/ops_<cpu kind>.json; run "
                  "python docs/gen_ops.py")
            return 1
        print("docs/ops.md: coverage and benchmark tables up to date")
        return 0
    update()
    print(f"updated {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
