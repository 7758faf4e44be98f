#!/usr/bin/env python
"""Convert a MovieLens ``ratings.dat`` (ML-1M / ML-10M: ``UserID::MovieID::Rating::Timestamp``)
into the CSV the trainer's table source reads (``user_id,item_id,rating,timestamp``).

    python examples/movielens/prepare.py ~/data/ml-1m/ratings.dat ~/data/ml-1m/ratings.csv
    python -m torchrec_ascend.training --data ~/data/ml-1m/ratings.csv \\
        --config examples/movielens/configs/ml-1m.json --out runs/ml-1m

Get the data from GroupLens (https://grouplens.org/datasets/movielens/1m/, ``ml-1m.zip``); its
licence forbids redistribution, so the repository ships none.  A bad line: one line
``error: bad data: <file>: row <l> (file line <l>), column '<c>': ...`` and exit status 2.
docs/movielens.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from torchrec_ascend.datasets import DataError, convert_ratings  # noqa: E402


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ratings", help="MovieLens ratings.dat (UserID::MovieID::Rating::Timestamp)")
    ap.add_argument("out", help="CSV to write (user_id,item_id,rating,timestamp)")
    args = ap.parse_args(argv)
    try:
        rows = convert_ratings(args.ratings, args.out)
    except DataError as e:
        print(f"error: bad data: {e}", file=sys.stderr)
        return 2
    print(f"{rows:,} ratings -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
