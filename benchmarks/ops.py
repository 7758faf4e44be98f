"""Op suite on CPU: our best backend vs fbgemm-gpu-cpu's kernel (or, where fbgemm has no CPU
kernel, our torch-composite reference), same inputs, same run.

Usage: ``python benchmarks/ops.py [--quick] [--only SUBSTRING[,SUBSTRING]]``.

Cases come from benchmarks/op_cases/ (training-path sparse ops, TBE embedding lookups, jagged
family): B=256 sequences, heavy-tailed ragged lengths up to 512 (mean about a quarter of that),
D=256, fp32.  "ours" is what the registry picks with fbgemm excluded (csrc ``cpu_kernel`` where an
op has one, else the torch-composite reference), called through ``torch.ops.torchrec_ascend``;
the baseline is ``torch.ops.fbgemm.<op>`` where fbgemm-gpu-cpu has a CPU kernel, else our
reference implementation called directly.  Timings are interleaved (one call of each per round)
and the medians compared, so load changes on a shared machine hit both sides alike.  The clock is
the calling thread's CPU time (``time.thread_time``), in a process with one torch thread
(``--threads``, default 1): on a shared machine other processes preempt calls of both sides by a
scheduler slice each (10-40 ms; measured at load 10 on 2 cores, a 2 ms TBE forward took 30 ms of
wall time in half of its calls), so wall-clock medians of millisecond ops are the scheduler's,
while CPU time is the kernel's.  One thread makes the thread's CPU time all of the op's work:
fbgemm-gpu-cpu's kernels run on the calling thread anyway (built without OpenMP), and ours split
only above ``kParallelWork`` elements (csrc/parallel.h), more than any case here.  Multi-jagged
dimension cases (``J=2``/``J=3``) have rows of their own.

Writes benchmarks/results/ops_<cpu kind>.json (``amx``, ``avx512bf16``, ``avx512``, ``avx2``:
:func:`benchmarks.common.cpu_kind`; one per kind of CPU measured, each a table of docs/ops.md; a
run limited by ``--only`` or ``--areas`` writes benchmarks/results/ops_partial.json instead and
leaves both alone; ``--quick`` writes benchmarks/results/ops_quick_<cpu kind>.json): per op
``op``, ``ours_ms``, ``baseline`` (``fbgemm`` / ``reference``), ``baseline_ms``, ``fbgemm_ms``
(None where the baseline is the reference), ``ratio`` (ours / baseline), ``shapes``, ``backend``,
``area``, ``target``, ``meets_target``.  Targets: every row ratio <= 1.0, and <= 0.2 for
jagged_jagged_bmm / jagged_dense_bmm.  ``--quick`` uses smaller batches for the embedding (B=32)
and jagged (B=64) cases and fewer rounds (a few minutes on a loaded machine).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import statistics
import sys
import time
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.common import (CPU_KINDS, RESULTS_DIR, cpu_kind, print_table,  # noqa: E402
                               replace_doc_section, write_json)
from benchmarks.op_cases import Case, our_backend, ours_context  # noqa: E402

AREAS = ("sparse", "embedding", "jagged")
DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "ops.md")
BMM_TARGET = {"jagged_jagged_bmm": 0.2, "jagged_dense_bmm": 0.2}


def _time_once(fn) -> float:
    """CPU time of one call on the calling thread, ms (see the module docstring)."""
    t0 = time.thread_time()
    fn()
    return (time.thread_time() - t0) * 1e3


def paired_medians(ours, fbgemm, budget_s: float, min_rounds: int = 3,
                   max_rounds: int = 20_000) -> tuple:
    """Median ms of ``ours()`` and ``fbgemm()`` (or None), called alternately: one warm-up each,
    then rounds until ``budget_s`` is spent (at least ``min_rounds``, at most ``max_rounds``).
    Microsecond ops thus get thousands of rounds spread over the whole budget, so a second of
    noise from other processes cannot decide their median."""
    ours()
    if fbgemm is not None:
        fbgemm()
    t_ours: List[float] = []
    t_fb: List[float] = []
    start = time.perf_counter()
    while len(t_ours) < max_rounds and (len(t_ours) < min_rounds
                                        or time.perf_counter() - start < budget_s):
        t_ours.append(_time_once(ours))
        if fbgemm is not None:
            t_fb.append(_time_once(fbgemm))
    return statistics.median(t_ours), (statistics.median(t_fb) if t_fb else None)


def target_of(c: Case) -> float:
    """The ratio target of a case: every row <= 1.0 (the jagged GEMMs <= 0.2)."""
    return BMM_TARGET.get(c.op, 1.0)


def run_area(area: str, quick: bool, only: List[str]) -> List[Dict[str, object]]:
    """Time every case of benchmarks/op_cases/<area>.py."""
    mod = importlib.import_module(f"benchmarks.op_cases.{area}")
    rows = []
    budget = 0.3 if quick else 1.5
    # entered once per area: entering and leaving use_backend rewrites the dispatcher's tables
    with torch.no_grad(), ours_context():
        for c in mod.cases(quick):
            if only and not any(s in c.op for s in only):
                continue
            rows.append(_row(area, c, our_backend(c.op), *paired_medians(
                c.ours, c.baseline, budget, min_rounds=2 if quick else 3)))
    gc.collect()
    return rows


def _row(area: str, c: Case, backend: str, ours_ms: float, base_ms: Optional[float]
         ) -> Dict[str, object]:
    """One row of the table (printed as it is made)."""
    ratio = ours_ms / base_ms if base_ms else None
    target = target_of(c)
    print(f"  {c.op:<62} ours {ours_ms:9.3f} ms  {c.baseline_name} {base_ms:9.3f} ms  "
          f"[{backend}]", flush=True)
    return {
        "op": c.op, "ours_ms": round(ours_ms, 4),
        "baseline": c.baseline_name, "baseline_ms": round(base_ms, 4),
        "fbgemm_ms": round(base_ms, 4) if c.baseline_name == "fbgemm" else None,
        "ratio": None if ratio is None else round(ratio, 3),
        "target": target,
        "meets_target": None if ratio is None else ratio <= target,
        "backend": backend, "area": area, "shapes": c.shapes,
    }


def results_path(kind: str) -> str:
    """The full run's results file for a kind of CPU (benchmarks/results/ops_<kind>.json)."""
    return os.path.join(RESULTS_DIR, f"ops_{kind}.json")


def markdown_table(path: str) -> str:
    """The measured table of one results file, headed by its CPU."""
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


def benchmark_markdown() -> Optional[str]:
    """The ``benchmark`` section of docs/ops.md: a table per kind of CPU with a full run
    committed (benchmarks/results/ops_<kind>.json), fastest kind first; None if there is none."""
    tables = [f"### `{kind}`\n\n{markdown_table(results_path(kind))}" for kind in CPU_KINDS
              if os.path.exists(results_path(kind))]
    return "\n\n".join(tables) if tables else None


def update_doc_table(doc: str = DOC) -> str:
    """Rewrite the benchmark tables of docs/ops.md from the committed full runs (the one just
    written included)."""
    with open(doc) as f:
        text = f.read()
    with open(doc, "w") as f:
        f.write(replace_doc_section(text, "benchmark", benchmark_markdown()))
    return f"updated the benchmark tables of {doc}"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller batches, fewer rounds (< 60 s)")
    ap.add_argument("--only", default="", help="comma-separated substrings of op names")
    ap.add_argument("--areas", default=",".join(AREAS), help=f"subset of {','.join(AREAS)}")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: the clock is the calling thread's CPU time)")
    args = ap.parse_args(argv)
    if args.threads < 1:
        raise SystemExit(f"--threads: must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    areas = [a.strip() for a in args.areas.split(",") if a.strip()]
    for a in areas:
        if a not in AREAS:
            raise SystemExit(f"--areas: {a!r} is not one of {', '.join(AREAS)}")
    t0 = time.perf_counter()
    rows: List[Dict[str, object]] = []
    for area in areas:
        print(f"== {area}", flush=True)
        rows += run_area(area, args.quick, only)
    table = [{k: ("-" if r[k] is None else r[k]) for k in
              ("op", "ours_ms", "baseline", "baseline_ms", "ratio", "target", "backend", "shapes")}
             for r in rows]
    print()
    print_table(table)
    missed = [f"{r['op']} ({r['shapes']})" for r in rows if r["meets_target"] is not True]
    print(f"\n{len(rows)} cases in {time.perf_counter() - t0:.1f} s; "
          f"missing their ratio target: {', '.join(missed) if missed else 'none'}")
    partial = bool(only) or set(areas) != set(AREAS)
    # a subset is not the published table: it goes to ops_partial.json (git-ignored), so a quick
    # look at one op cannot replace the full run that docs/ops.md shows
    # the quick shapes have a file of their own: only the full runs are the tables of docs/ops.md
    name = "ops_partial" if partial else (f"ops_quick_{cpu_kind()}" if args.quick else f"ops_{cpu_kind()}")
    path = write_json(name, {
        "quick": args.quick,
        "torch_threads": torch.get_num_threads(),
        "clock": "calling thread's CPU time (time.thread_time), median of interleaved rounds",
        "shape_note": "B=256 sequences, heavy-tailed lengths <= 512 (mean ~128), D=256 fp32 "
                      "(quick: embedding cases at B=32, jagged at B=64)",
        "rows": rows,
    })
    print(f"wrote {path}")
    if not partial and not args.quick:
        print(update_doc_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
