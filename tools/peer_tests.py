"""Run FBGEMM's and TorchRec's own tests with torchrec_ascend's kernels forced in place of fbgemm's.

Usage::

    python tools/peer_tests.py --peer /work/peer --backends fbgemm,cpu_kernel,reference \
        [--suites fbgemm,torchrec,torchrec_dist] [--max-examples 5] [--only SUBSTRING]

``--peer DIR`` holds checkouts obtained by the user (this repository never contains their code):

* ``DIR/fbgemm``: FBGEMM at tag ``v1.8.0`` (``fbgemm_gpu/test/{jagged,sparse,permute}`` are run);
* ``DIR/torchrec``: TorchRec (``torchrec/{sparse,modules}/tests`` and four multi-process files of
  ``torchrec/distributed/tests`` are run).  Only their tests are used: the library code is the
  installed torchrec / fbgemm_gpu (the checkout's ``torchrec`` package never shadows it).

Each test file runs in its own pytest process, once per backend.  ``fbgemm`` is the baseline
(fbgemm-gpu-cpu's own kernels); any other backend is forced for the whole session and in every
worker process of the multi-process tests: ``tools/peer_site/sitecustomize.py`` enters
``torchrec_ascend.ops.registry.use_backend(<backend>, replace_fbgemm=True)`` at interpreter
start-up.  Hypothesis is capped at ``--max-examples`` examples per test, without deadlines.

Prints passed / failed / skipped per file and backend, then every test that passes on fbgemm but
not on a forced backend (the goal is none), and writes the per-test outcomes to ``--out``
(default ``DIR/results.json``).  ``--baseline-json FILE`` takes the fbgemm column from an earlier
run's output instead of running it again.  Exit status 1 when there is such a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SITE = os.path.join(HERE, "peer_site")
BACKENDS = ("fbgemm", "cpu_kernel", "reference", "triton")

# suite -> (checkout subfolder, test-file globs relative to it, per-file timeout in seconds)
SUITES: Dict[str, Tuple[str, Tuple[str, ...], int]] = {
    "fbgemm": ("fbgemm", ("fbgemm_gpu/test/jagged/*_test.py", "fbgemm_gpu/test/sparse/*_test.py",
                          "fbgemm_gpu/test/permute/*_test.py"), 1800),
    "torchrec": ("torchrec", ("torchrec/sparse/tests/test_*.py",
                              "torchrec/modules/tests/test_*.py"), 1800),
    "torchrec_dist": ("torchrec", ("torchrec/distributed/tests/test_model_parallel_gloo.py",
                                   "torchrec/distributed/tests/test_sequence_model_parallel.py",
                                   "torchrec/distributed/tests/test_embedding_sharding.py",
                                   "torchrec/distributed/tests/test_dist_data.py"), 5400),
}


@dataclasses.dataclass
class FileResult:
    """Outcome of one test file under one backend."""

    suite: str
    path: str
    backend: str
    outcomes: Dict[str, str]  # test id -> passed / failed / skipped
    seconds: float
    note: str = ""

    def count(self, outcome: str) -> int:
        return sum(1 for v in self.outcomes.values() if v == outcome)


def test_files(peer: str, suite: str) -> List[str]:
    """The test files of ``suite`` in the checkout under ``peer`` (relative to its root)."""
    sub, globs, _ = SUITES[suite]
    root = os.path.join(peer, sub)
    out: List[str] = []
    for g in globs:
        out += sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, g)))
    return out


def _environment(backend: str, max_examples: int, torchrec_root: Optional[str]) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [SITE, REPO] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["TORCHREC_ASCEND_PEER_BACKEND"] = backend
    env["TORCHREC_ASCEND_PEER_MAX_EXAMPLES"] = str(max_examples)
    if torchrec_root:
        env["TORCHREC_ASCEND_PEER_TORCHREC"] = torchrec_root
    env.pop("TORCHREC_ASCEND_BACKEND", None)  # the forcing is use_backend's, not the variable's
    if backend == "triton":
        env["TRITON_INTERPRET"] = "1"
    return env


def _parse_junit(path: str) -> Dict[str, str]:
    outcomes: Dict[str, str] = {}
    if not os.path.exists(path):
        return outcomes
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        tags = {child.tag for child in case}
        if "failure" in tags or "error" in tags:
            outcome = "failed"
        elif "skipped" in tags:
            outcome = "skipped"
        else:
            outcome = "passed"
        # an error in teardown after a pass is reported as a second entry: keep the worst
        if outcomes.get(name) != "failed":
            outcomes[name] = outcome
    return outcomes


def run_file(peer: str, suite: str, rel: str, backend: str, max_examples: int,
             extra: Sequence[str]) -> FileResult:
    """One pytest process for one test file under one backend."""
    sub, _, timeout = SUITES[suite]
    root = os.path.join(peer, sub)
    torchrec_root = root if sub == "torchrec" else None
    with tempfile.TemporaryDirectory() as tmp:
        xml = os.path.join(tmp, "junit.xml")
        cmd = [sys.executable, "-m", "pytest", rel, "-q", "-p", "no:cacheprovider",
               "-c", os.path.join(SITE, "pytest.ini"), "--rootdir", root,
               f"--junitxml={xml}", *extra]
        t0 = time.perf_counter()
        note = ""
        try:
            proc = subprocess.run(cmd, cwd=root, env=_environment(backend, max_examples, torchrec_root),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  timeout=timeout)
            tail = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
            if proc.returncode not in (0, 1, 5):  # 5: nothing collected
                note = f"pytest exit {proc.returncode}: {' '.join(tail)}"
        except subprocess.TimeoutExpired:
            note = f"timed out after {timeout} s"
        outcomes = _parse_junit(xml)
        if note and not outcomes:
            outcomes = {f"{rel}::<file>": "failed"}
    return FileResult(suite, rel, backend, outcomes, time.perf_counter() - t0, note)


def forced_summary(backend: str) -> str:
    """How many fbgemm CPU kernels the forcing replaces (a run on 0 would prove nothing)."""
    if backend == "fbgemm":
        return "fbgemm: fbgemm-gpu-cpu's own kernels"
    code = ("import sitecustomize as s; from torchrec_ascend.ops import registry as r; "
            "print(len(r.replaced_fbgemm_ops()), len(r.all_specs()))")
    out = subprocess.run([sys.executable, "-c", code], env=_environment(backend, 5, None),
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    parts = out.stdout.split()
    if len(parts) != 2:
        return f"{backend}: could not start a forced interpreter"
    return f"{backend}: forced; {parts[0]} fbgemm CPU kernels replaced (registry: {parts[1]} ops)"


def print_table(results: List[FileResult], backends: Sequence[str]) -> None:
    """Passed / failed / skipped per file (rows) and backend (columns)."""
    files = sorted({(r.suite, r.path) for r in results})
    by = {(r.suite, r.path, r.backend): r for r in results}
    head = ["suite", "file"] + [f"{b} p/f/s" for b in backends]
    rows = []
    totals = {b: [0, 0, 0] for b in backends}
    for suite, path in files:
        row = [suite, path]
        for b in backends:
            r = by.get((suite, path, b))
            if r is None:
                row.append("-")
                continue
            c = [r.count("passed"), r.count("failed"), r.count("skipped")]
            totals[b] = [t + x for t, x in zip(totals[b], c)]
            row.append("/".join(map(str, c)) + (" !" if r.note else ""))
        rows.append(row)
    rows.append(["total", ""] + ["/".join(map(str, totals[b])) for b in backends])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)))


def regressions(results: List[FileResult]) -> List[Tuple[str, str, str]]:
    """(backend, file, test) of every test that passed on fbgemm and did not pass forced."""
    base = {(r.suite, r.path): r.outcomes for r in results if r.backend == "fbgemm"}
    out = []
    for r in results:
        if r.backend == "fbgemm" or (r.suite, r.path) not in base:
            continue
        for test, outcome in base[(r.suite, r.path)].items():
            if outcome == "passed" and r.outcomes.get(test) != "passed":
                out.append((r.backend, r.path, test))
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", required=True, help="folder with fbgemm/ and torchrec/ checkouts")
    ap.add_argument("--backends", default="fbgemm,cpu_kernel,reference",
                    help=f"comma-separated, of {','.join(BACKENDS)} (fbgemm: the baseline)")
    ap.add_argument("--suites", default="fbgemm,torchrec,torchrec_dist",
                    help=f"comma-separated, of {','.join(SUITES)}")
    ap.add_argument("--max-examples", type=int, default=5, help="hypothesis examples per test")
    ap.add_argument("--only", default="", help="run only files whose path contains this")
    ap.add_argument("--out", default="", help="per-test outcomes JSON (default PEER/results.json)")
    ap.add_argument("--baseline-json", default="",
                    help="an earlier --out file whose fbgemm results serve as the baseline "
                         "(instead of running the fbgemm backend again)")
    ap.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = ap.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    for b in backends:
        if b not in BACKENDS:
            raise SystemExit(f"--backends: {b!r} is not one of {', '.join(BACKENDS)}")
    for s in suites:
        if s not in SUITES:
            raise SystemExit(f"--suites: {s!r} is not one of {', '.join(SUITES)}")
    peer = os.path.abspath(args.peer)
    for s in suites:
        if not test_files(peer, s):
            raise SystemExit(f"--peer: no test files of suite {s!r} under {peer} "
                             f"(expected {SUITES[s][0]}/{SUITES[s][1][0]})")
    for b in backends:
        print(forced_summary(b), flush=True)
    results: List[FileResult] = []
    for s in suites:
        for rel in test_files(peer, s):
            if args.only and args.only not in rel:
                continue
            for b in backends:
                r = run_file(peer, s, rel, b, args.max_examples, args.pytest_args)
                results.append(r)
                print(f"  [{b:<10}] {rel:<70} {r.count('passed'):4d} passed {r.count('failed'):3d} "
                      f"failed {r.count('skipped'):3d} skipped  {r.seconds:6.0f} s {r.note}",
                      flush=True)
    if args.baseline_json:
        with open(args.baseline_json, encoding="utf-8") as fh:
            saved = [FileResult(**r) for r in json.load(fh)["results"] if r["backend"] == "fbgemm"]
        ran = {(r.suite, r.path) for r in results}
        results = [r for r in saved if (r.suite, r.path) in ran] + results
        if "fbgemm" not in backends:
            backends = ["fbgemm"] + backends
    print()
    print_table(results, backends)
    bad = regressions(results)
    print(f"\npassing on fbgemm but not on a forced backend: {len(bad)}")
    for b, path, test in bad:
        print(f"  [{b}] {path} {test}")
    out = args.out or os.path.join(peer, "results.json")
    with open(out, "w", encoding="utf-8") as fh:
        json.dump({"max_examples": args.max_examples, "backends": backends,
                   "results": [dataclasses.asdict(r) for r in results]}, fh, indent=1)
    print(f"wrote {out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
