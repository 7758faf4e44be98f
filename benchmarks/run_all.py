"""Run every benchmark script in this folder (``--quick`` by default) and summarise.

Usage: ``python benchmarks/run_all.py [--full] [--only ops,negatives]``.
Each script prints its own table and writes ``benchmarks/results/<name>.json``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = {"common.py", "run_all.py", "__init__.py"}


def scripts() -> list:
    """Benchmark scripts (top-level ``*.py`` of benchmarks/, GPU-only scripts excluded)."""
    return sorted(f for f in os.listdir(HERE) if f.endswith(".py") and f not in SKIP)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--full", action="store_true", help="full sizes instead of --quick")
    ap.add_argument("--only", default="", help="comma-separated script names (without .py)")
    args = ap.parse_args()
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    failed = []
    summary = []
    for script in scripts():
        name = script[:-3]
        if only and name not in only:
            continue
        cmd = [sys.executable, os.path.join(HERE, script)] + ([] if args.full else ["--quick"])
        print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call(cmd, cwd=os.path.dirname(HERE))
        dt = time.perf_counter() - t0
        summary.append((name, rc, dt))
        if rc != 0:
            failed.append(name)
    print("\nbenchmark        rc   seconds")
    for name, rc, dt in summary:
        print(f"{name:<16} {rc:<4} {dt:.1f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
