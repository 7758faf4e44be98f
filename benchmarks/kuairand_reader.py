"""KuaiRand reader + preprocessing: rows/s and peak RSS on a large generated log.

Builds a KuaiRand-format ``log_standard`` CSV of about ``--mb`` megabytes (every official
column) by writing shifted copies of a generated base table (user ids offset per copy, so users
stay distinct), then runs :func:`torchrec_ascend.datasets.preprocess` on it in a fresh child
process and reports that process's peak RSS (``VmHWM``: ``ru_maxrss`` would carry this
parent's peak over the ``exec``; the RSS and peak after its imports, before reading, are reported
next to it) and rows/s.  The file and the cache
live in a temporary folder that is removed afterwards.

``--readers kuairand,table,parquet`` also reads the same log through the generic table reader
(:func:`torchrec_ascend.datasets.preprocess_table`, ids/time/8 action columns), from the CSV and
from a Parquet copy of it (row groups of 64K rows), each in its own fresh child; those runs
write ``benchmarks/results/dataset_readers.json`` (the default run writes
``kuairand_reader.json``).

    python benchmarks/kuairand_reader.py --quick      # ~60 MB
    python benchmarks/kuairand_reader.py --mb 400     # the number in docs/kuairand.md
    python benchmarks/kuairand_reader.py --mb 400 --readers kuairand,table,parquet  # docs/datasets.md
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
from torchrec_ascend.datasets import preprocess, peak_rss_mb, EventLog, TableSpec, preprocess_table
from torchrec_ascend.datasets.schema import ACTION_COLUMNS
import os
rss0 = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
peak0 = peak_rss_mb()
t0 = time.perf_counter()
if sys.argv[4] == "kuairand":
    cache = preprocess([sys.argv[1]], sys.argv[2], num_buckets=int(sys.argv[3]))
else:
    spec = TableSpec([sys.argv[1]], item_col="video_id", time_col="time_ms", time_unit="ms",
                     action_cols=list(ACTION_COLUMNS.values()))
    cache = preprocess_table(spec, sys.argv[2], num_buckets=int(sys.argv[3]))
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
    ap.add_argument("--readers", default="kuairand",
                    help="comma list of kuairand (KuaiRand reader), table (generic reader on "
                         "the CSV), parquet (generic reader on a Parquet copy)")
    args = ap.parse_args()
    readers = [r for r in args.readers.split(",") if r]
    unknown = sorted(set(readers) - {"kuairand", "table", "parquet"})
    if unknown or not readers:
        ap.error(f"--readers: unknown {unknown}; choose from kuairand, table, parquet")
    mb = 60.0 if args.quick else args.mb
    work = tempfile.mkdtemp(prefix="kuairand-reader-")
    out_rows = []
    try:
        path = os.path.join(work, "log_standard_big.csv")
        t0 = time.perf_counter()
        rows = build_csv(path, mb)
        size_mb = os.path.getsize(path) / 2 ** 20
        print(f"wrote {path}: {size_mb:.0f} MB, {rows:,} rows in {time.perf_counter() - t0:.0f}s")
        inputs = {"kuairand": path, "table": path}
        if "parquet" in readers:
            inputs["parquet"] = write_parquet(path, os.path.join(work, "log_standard_big.parquet"))
        env = dict(os.environ, PYTHONPATH=REPO)
        for reader in readers:
            src = inputs[reader]
            out = subprocess.run([sys.executable, "-c", _CHILD, src,
                                  os.path.join(work, f"cache-{reader}"), str(args.buckets),
                                  reader], capture_output=True, text=True, env=env, check=True)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            assert res["rows"] == rows, (res["rows"], rows)
            file_mb = os.path.getsize(src) / 2 ** 20
            row = {"reader": reader, "file_mb": file_mb, "csv_mb": size_mb, "rows": rows,
                   "users": res["users"], "items": res["items"],
                   "seconds": res["seconds"], "rows_per_s": rows / res["seconds"],
                   "mb_per_s": file_mb / res["seconds"], "peak_rss_mb": res["peak_rss_mb"],
                   "rss_after_imports_mb": res["rss_before_mb"],
                   "peak_after_imports_mb": res["peak_after_imports_mb"],
                   "buckets": args.buckets}
            if readers == ["kuairand"]:  # the historical JSON layout
                del row["reader"], row["file_mb"]
            out_rows.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(out_rows)
    name = "kuairand_reader" if readers == ["kuairand"] else "dataset_readers"
    print(f"wrote {write_json(name, {'quick': args.quick, 'rows': out_rows})}")


def write_parquet(csv_path: str, out: str) -> str:
    """A Parquet copy of the CSV, streamed (row groups of 64K rows)."""
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    reader = pcsv.open_csv(csv_path)
    with pq.ParquetWriter(out, reader.schema) as w:
        for batch in reader:
            w.write_batch(batch, row_group_size=1 << 16)
    return out


if __name__ == "__main__":
    main()
