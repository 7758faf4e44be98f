#!/usr/bin/env python
"""Convert a public sequential-recommendation file (the SASRec / S3Rec / TiCoSeRec layouts) into
the two files a side-by-side run needs: a ``user_id,item_id,timestamp`` CSV for our trainer and
an ML-1M ``ratings.dat`` (``user::item::1::seconds``) for Meta's reference HSTU
(``tools/reference_hstu_cpu.py``).  Both hold the same events in the same order.

    # SASRec (kang205/SASRec data/Video.txt): one "user item" pair per line, in time order
    python tools/seqrec_to_ratings.py pairs Video.txt --csv video.csv --ratings video.dat
    # S3Rec (RUCAIBox/CIKM2020-S3Rec data/Beauty.txt): "user item item ..." per line, in order
    python tools/seqrec_to_ratings.py lines Beauty.txt --csv beauty.csv --ratings beauty.dat
    # TiCoSeRec (KingGugu/TiCoSeRec data/Sports/): the item file and its timestamp file
    python tools/seqrec_to_ratings.py lines Sports_item_org_rank.txt \\
        --times Sports_time_org_rank.txt --csv sports.csv --ratings sports.dat
    # MovieLens-100K (GroupLens ml-100k/u.data): "user item rating seconds" per line, any order
    python tools/seqrec_to_ratings.py udata u.data --csv ml100k.csv --ratings ml100k.dat

Timestamps.  ``udata`` files carry them (each user's events are put in time order, equal
times in file order).  With ``--times`` (same users, same line lengths as the item file; unix seconds)
each event keeps its time, except that a user's times are made strictly increasing by the
smallest change, ``t'_k = max(t_k, t'_{k-1} + 1)``: these files have many events of one user
at the same time (Amazon reviews carry a day), and a tie would let each side order them its
own way (the reference sorts with pandas' unstable sort), so the last item -- the test target --
could differ between the two.  Without ``--times`` the files give the order only, and the
``k``-th event of a user (k = 0, 1, ...) gets time ``k`` seconds: both sides see the order, and
the time bias sees one second per step (docs/datasets_public.md, "Order-only timestamps").

Ids.  Users and items are renumbered ``1..U`` / ``1..I`` in increasing order of their ids in the
file (the identity when they already are; the reference's item table has ``largest id + 1``
rows).  A user of fewer than ``--min-len`` events (default 3, the trainer's ``data.min_len``)
is dropped, so both sides train and test on the same users.  A malformed line is one error line
naming the file and line, exit status 2, and no output is left behind.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

FORMATS = ("pairs", "lines", "udata")

Sequences = Dict[int, List[Tuple[int, int]]]  # user -> [(item, time)] in the file's order


class FormatError(ValueError):
    """A line that does not fit the layout: ``path:line: what``."""


def _int_rows(path: str, what: str) -> Iterator[Tuple[int, List[int]]]:
    """``(line number, its integers)`` of every non-blank line of ``path``; a line that is not
    all integers is a FormatError naming the file, the line and ``what`` it should hold."""
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield n, [int(x) for x in line.split()]
            except ValueError:
                raise FormatError(f"{path}:{n}: {what} must be integers, "
                                  f"got {line[:80]!r}") from None


def read_pairs(path: str) -> Sequences:
    """``user item`` per line, each user's lines in time order (SASRec's layout); the time of
    an event is its position in the user's sequence."""
    seqs: Sequences = {}
    for n, v in _int_rows(path, "user and item"):
        if len(v) != 2:
            raise FormatError(f"{path}:{n}: expected 'user item', got {len(v)} fields")
        s = seqs.setdefault(v[0], [])
        s.append((v[1], len(s)))
    return seqs


def read_udata(path: str) -> Sequences:
    """``user item rating seconds`` per line, whitespace-separated, in any order (MovieLens-100K's
    ``u.data``); each user's events sorted by time, equal times in file order."""
    seqs: Sequences = {}
    for n, v in _int_rows(path, "user, item, rating and time"):
        if len(v) != 4:
            raise FormatError(f"{path}:{n}: expected 'user item rating time', got {len(v)} "
                              "fields")
        seqs.setdefault(v[0], []).append((v[1], v[3]))
    for s in seqs.values():
        s.sort(key=lambda e: e[1])  # stable: equal times keep the file's order
    return seqs


def read_lines(path: str, times: Optional[str] = None) -> Sequences:
    """``user item item ...`` per line in time order (S3Rec's layout); with ``times`` a file of
    ``user t t ...`` lines of the same users and lengths (TiCoSeRec's), else positions."""
    seqs: Sequences = {}
    for n, v in _int_rows(path, "user and items"):
        if len(v) < 2:
            raise FormatError(f"{path}:{n}: a user with no item")
        if v[0] in seqs:
            raise FormatError(f"{path}:{n}: user {v[0]} on a second line")
        seqs[v[0]] = [(item, k) for k, item in enumerate(v[1:])]
    if times is None:
        return seqs
    seen = set()
    for n, v in _int_rows(times, "user and times"):
        u, ts = v[0], v[1:]
        if u not in seqs:
            raise FormatError(f"{times}:{n}: user {u} is not in {path}")
        if len(ts) != len(seqs[u]):
            raise FormatError(f"{times}:{n}: user {u} has {len(ts)} times and "
                              f"{len(seqs[u])} items in {path}")
        seqs[u] = [(item, t) for (item, _), t in zip(seqs[u], ts)]
        seen.add(u)
    missing = set(seqs) - seen
    if missing:
        raise FormatError(f"{times}: no times for {len(missing)} users of {path} "
                          f"(e.g. user {min(missing)})")
    return seqs


def strictly_increasing(times: Sequence[int]) -> List[int]:
    """``t'_k = max(t_k, t'_{k-1} + 1)``: the order kept, ties and inversions moved by the least
    number of seconds."""
    out: List[int] = []
    for t in times:
        out.append(t if not out or t > out[-1] else out[-1] + 1)
    return out


def normalise(seqs: Sequences, min_len: int = 3) -> List[Tuple[int, int, int]]:
    """``(user, item, time)`` rows: users with ``>= min_len`` events, ids renumbered ``1..`` in
    increasing order, times strictly increasing per user; users in id order, each user's
    events in the file's order."""
    kept = {u: s for u, s in seqs.items() if len(s) >= min_len}
    if not kept:
        raise FormatError(f"no user has {min_len} or more events")
    user_id = {u: k + 1 for k, u in enumerate(sorted(kept))}
    item_id = {i: k + 1 for k, i in enumerate(sorted({i for s in kept.values() for i, _ in s}))}
    rows = []
    for u in sorted(kept):
        s = kept[u]
        for (item, _), t in zip(s, strictly_increasing([t for _, t in s])):
            rows.append((user_id[u], item_id[item], t))
    return rows


def summary(rows: Sequence[Tuple[int, int, int]]) -> Dict[str, float]:
    """Users, items, events, events per user (mean, median) of ``rows``."""
    per_user: Dict[int, int] = {}
    for u, _, _ in rows:
        per_user[u] = per_user.get(u, 0) + 1
    lengths = sorted(per_user.values())
    return {"users": len(per_user), "items": len({i for _, i, _ in rows}), "events": len(rows),
            "events_per_user": len(rows) / len(per_user),
            "median_events_per_user": float(lengths[len(lengths) // 2])}


def _write(path: str, lines: Sequence[str]) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.writelines(lines)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_outputs(rows: Sequence[Tuple[int, int, int]], csv: Optional[str],
                  ratings: Optional[str]) -> None:
    """The CSV (``user_id,item_id,timestamp``) and / or the ``ratings.dat``."""
    if csv:
        _write(csv, ["user_id,item_id,timestamp\n"] + [f"{u},{i},{t}\n" for u, i, t in rows])
    if ratings:
        _write(ratings, [f"{u}::{i}::1::{t}\n" for u, i, t in rows])


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("format", choices=FORMATS, help="pairs: 'user item' per line; lines: "
                                                    "'user item item ...' per line; udata: "
                                                    "'user item rating seconds' per line")
    ap.add_argument("path", help="the file")
    ap.add_argument("--times", default=None, help="lines format: the matching timestamp file")
    ap.add_argument("--csv", default=None, help="user_id,item_id,timestamp CSV to write")
    ap.add_argument("--ratings", default=None, help="ML-1M ratings.dat to write")
    ap.add_argument("--min-len", type=int, default=3, help="least events per user kept")
    args = ap.parse_args(argv)
    if args.times and args.format != "lines":
        ap.error("--times: only with the lines format")
    if args.min_len < 2:
        ap.error(f"--min-len must be >= 2, got {args.min_len}")
    try:
        seqs = {"pairs": read_pairs, "udata": read_udata}[args.format](args.path) \
            if args.format != "lines" else read_lines(args.path, args.times)
        rows = normalise(seqs, args.min_len)
    except (FormatError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_outputs(rows, args.csv, args.ratings)
    s = summary(rows)
    print(f"{s['users']:,} users, {s['items']:,} items, {s['events']:,} events "
          f"({s['events_per_user']:.2f} per user, median {s['median_events_per_user']:g})"
          + "".join(f" -> {p}" for p in (args.csv, args.ratings) if p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
