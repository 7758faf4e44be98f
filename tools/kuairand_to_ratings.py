#!/usr/bin/env python
"""Write a KuaiRand log's positive sequences as an ML-1M-format ``ratings.dat``, so that Meta's
reference HSTU (``tools/reference_hstu_cpu.py``, which reads only MovieLens files) and our trainer
(through ``examples/movielens/prepare.py``) train on the same events.

    python tools/kuairand_to_ratings.py ../shared/data/kuairand-27k-sample/processed_standard_kcore_15.tsv \\
        runs/kuairand-ratings.dat [--positive like] [--min-len 3]

The positives are the ones our KuaiRand source keeps (``datasets.load_kuairand``: the events with
any action of ``--positive``, users with at least ``--min-len`` of them, each user's events in
time order).  One line per positive, ``user::item::1::seconds``:

- ``item`` is our dense item id + 1 (MovieLens ids start at 1, and the reference's item table has
  ``largest id + 1`` rows, so KuaiRand's raw video ids, up to ~32M, would make a 32M-row table);
- ``seconds`` is the event's time in ms floored to seconds (the reference's time bias and our
  table source both read seconds).  Events of one user in the same second keep their order in
  the file (our table source sorts stably; the reference's pandas sort is its own);
- the rating is 1 on every line (neither model reads ratings).

The corpus either side ranks against is then the items that occur in the file: the reference's
``movies.dat`` (written by its runner) lists the rated items, and our table source's corpus is
the items of its input.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import List, Optional, Sequence

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from torchrec_ascend.datasets import DataError, PositiveRule, load_kuairand  # noqa: E402


def write_ratings(paths: Sequence[str], out: str, positive: Sequence[str] = ("like",),
                  min_len: int = 3, cache_root: Optional[str] = None) -> int:
    """Write ``out`` (``user::item::1::seconds`` lines, users in our order, events in time order)
    and return the number of lines."""
    rule = PositiveRule(any_of=tuple(positive))
    with tempfile.TemporaryDirectory() as tmp:
        seqs = load_kuairand(list(paths), cache_root or tmp, rule, min_len, progress=False)
    lengths = np.diff(seqs.offsets)
    users = np.repeat(seqs.user_ids.astype(np.int64), lengths)
    items = seqs.items.astype(np.int64) + 1
    seconds = np.floor_divide(seqs.times.astype(np.int64), 1000)
    if len(seconds) and seconds.min() < 0:
        raise DataError(f"{paths[0]}: a negative timestamp ({seconds.min()} s)")
    with open(out, "w") as f:
        for u, i, s in zip(users.tolist(), items.tolist(), seconds.tolist()):
            f.write(f"{u}::{i}::1::{s}\n")
    return len(items)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", help="KuaiRand log files (CSV / the shared sample's TSV)")
    ap.add_argument("out", help="ratings.dat to write")
    ap.add_argument("--positive", nargs="+", default=["like"],
                    help="actions that make an event a positive (default: like)")
    ap.add_argument("--min-len", type=int, default=3, help="least positives per user (>= 2)")
    args = ap.parse_args(argv)
    try:
        n = write_ratings(args.logs, args.out, args.positive, args.min_len)
    except (DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{n:,} positives -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
