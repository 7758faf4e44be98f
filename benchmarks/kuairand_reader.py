"""KuaiRand reader + preprocessing: rows/s and peak RSS on a large generated log.

Builds a KuaiRand-format ``log_standard`` CSV of about ``--mb`` megabytes (every official
column) by writing shifted copies of a generated base table (user ids offset per copy, so users
stay distinct), then runs :func:`torchrec_ascend.datasets.preprocess` on it in a fresh child
process and reports that process's peak RSS (``VmHWM``: ``ru_maxrss`` would carry this
parent's peak over the ``exec``; the RSS and peak after its imports, before reading, are reported
next to it) and rows/s.  The file and the cache
live in a temporary folder that is removed afterwards.

    python benchmarks/kuairand_reader.py --quick      # ~60 MB
    python benchmarks/kuairand_reader.py --mb 400     # the number in docs/kuairand.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.common import print_table, write_json  # noqa: E402

_CHILD = r"""
import json, sys, time
from torchrec_ascend.datasets import preprocess, peak_rss_mb, EventLog
import os
rss0 = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
peak0 = peak_rss_mb()
t0 = time.perf_counter()
cache = preprocess([sys.argv[1]], sys.argv[2], num_buckets=int(sys.argv[3]))
secs = time.perf_counter() - t0
ev = EventLog.load(cache)
print(json.dumps({"rows": int(ev.meta["rows"]), "users": ev.num_users, "items": ev.num_items,
                  "seconds": secs, "rss_before_mb": rss0,
                  "peak_rss_mb": peak_rss_mb(), "peak_after_imports_mb": peak0}))
"""


def build_csv(path: str, target_mb: float) -> int:
    """Write the big CSV; returns its data rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pcsv

    from torchrec_ascend.datasets import SyntheticConfig, generate

    base_dir = os.path.join(os.path.dirname(path), "base")
    files = generate(base_dir, SyntheticConfig(num_users=4000, num_items=20000, mean_len=60,
                                               max_len=1000, seed=7))
    base = pcsv.read_csv(files["log_standard"])
    base_bytes = os.path.getsize(files["log_standard"])
    copies = max(1, int(round(target_mb * 2 ** 20 / base_bytes)))
    uid = base.column("user_id").to_numpy()
    span = int(uid.max()) + 1
    rows = 0
    with pcsv.CSVWriter(path, base.schema,
                        write_options=pcsv.WriteOptions(quoting_style="none",
                                                                  quoting_header="none")) as w:
        for c in range(copies):
            t = base.set_column(0, "user_id", pa.array(uid + c * span, pa.int64()))
            w.write_table(t)
            rows += t.num_rows
    shutil.rmtree(base_dir)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a ~60 MB file")
    ap.add_argument("--mb", type=float, default=400.0, help="CSV size in MB (without --quick)")
    ap.add_argument("--buckets", type=int, default=32)
    args = ap.parse_args()
    mb = 60.0 if args.quick else args.mb
    work = tempfile.mkdtemp(prefix="kuairand-reader-")
    try:
        path = os.path.join(work, "log_standard_big.csv")
        t0 = time.perf_counter()
        rows = build_csv(path, mb)
        size_mb = os.path.getsize(path) / 2 ** 20
        print(f"wrote {path}: {size_mb:.0f} MB, {rows:,} rows in {time.perf_counter() - t0:.0f}s")
        env = dict(os.environ, PYTHONPATH=REPO)
        out = subprocess.run([sys.executable, "-c", _CHILD, path, os.path.join(work, "cache"),
                              str(args.buckets)], capture_output=True, text=True, env=env,
                             check=True)
        res = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert res["rows"] == rows, (res["rows"], rows)
    row = {"csv_mb": size_mb, "rows": rows, "users": res["users"], "items": res["items"],
           "seconds": res["seconds"], "rows_per_s": rows / res["seconds"],
           "mb_per_s": size_mb / res["seconds"], "peak_rss_mb": res["peak_rss_mb"],
           "rss_after_imports_mb": res["rss_before_mb"],
           "peak_after_imports_mb": res["peak_after_imports_mb"],
           "buckets": args.buckets}
    print_table([row])
    print(f"wrote {write_json('kuairand_reader', {'quick': args.quick, 'rows': [row]})}")


if __name__ == "__main__":
    main()
