"""KuaiRand logs -> per-user event sequences, cached on disk in a compact form.

Bounded memory for any input size (KuaiRand-27K is 46 GB of CSV):

1. stream every log file block by block (:func:`~.reader.iter_log_chunks`) and append each
   event as a 25-byte record to one of ``num_buckets`` spill files chosen by ``user_id mod P``;
   collect the distinct video and user ids;
2. per bucket: load it (about ``rows / P`` records), sort by ``(user_id, time_ms)`` (stable, so
   ties keep file order), remap raw ids to dense ``[0, n)`` indices (sorted raw id order), and
   write into preallocated ``.npy`` memory maps.

Users come out ordered by ``(user_id mod P, user_id)``; within a user, events by time.  The cache
(one folder, written under a temporary name and renamed when complete) holds

``items`` int32 [E], ``times`` int64 [E], ``actions`` uint8 [E], ``user_offsets`` int64 [U+1],
``user_ids`` int64 [U] (raw), ``item_ids`` int64 [I] (raw, index = dense id), ``meta.json``.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import resource
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from .reader import DEFAULT_BLOCK_SIZE, KuaiRandDataError, iter_log_chunks
from .schema import PositiveRule

CACHE_VERSION = 1
_RECORD = np.dtype([("u", "<i8"), ("v", "<i8"), ("t", "<i8"), ("a", "u1")])


def expand_paths(patterns: Sequence[str]) -> List[str]:
    """Expand globs (sorted); a pattern matching nothing is kept so that reading it fails
    with the file named."""
    out: List[str] = []
    for p in patterns:
        hits = sorted(glob.glob(p)) if any(ch in p for ch in "*?[") else [p]
        if not hits:
            raise KuaiRandDataError(p, 0, None, "no file matches this pattern")
        out.extend(hits)
    return out


def _cache_key(paths: Sequence[str]) -> str:
    h = hashlib.sha256(f"v{CACHE_VERSION}".encode())
    for p in paths:
        st = os.stat(p)
        h.update(f"{os.path.abspath(p)}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


class _UniqueIds:
    """Distinct int64 ids over a stream, memory ~ number of distinct ids."""

    def __init__(self) -> None:
        self._seen = np.zeros(0, dtype=np.int64)
        self._pending: List[np.ndarray] = []
        self._pending_n = 0

    def add(self, ids: np.ndarray) -> None:
        u = np.unique(ids)
        self._pending.append(u)
        self._pending_n += len(u)
        if self._pending_n > max(4 * len(self._seen), 1 << 20):
            self._merge()

    def _merge(self) -> None:
        if self._pending:
            self._seen = np.unique(np.concatenate([self._seen] + self._pending))
            self._pending, self._pending_n = [], 0

    def result(self) -> np.ndarray:
        self._merge()
        return self._seen


@dataclass
class PreprocessStats:
    """What a preprocessing run did (for the README's reader numbers)."""

    rows: int
    users: int
    items: int
    seconds: float
    peak_rss_mb: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / max(self.seconds, 1e-9)


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (MiB).

    Linux: ``VmHWM`` of ``/proc/self/status`` (reset by ``exec``; ``ru_maxrss`` is not: a child
    started from a large parent reports the parent's peak).  Elsewhere ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def preprocess(paths: Sequence[str], cache_root: str, num_buckets: int = 32,
               block_size: int = DEFAULT_BLOCK_SIZE, force: bool = False,
               progress: bool = False) -> str:
    """Build (or reuse) the cache for ``paths``; returns the cache folder."""
    if num_buckets < 1:
        raise ValueError(f"num_buckets: must be >= 1, got {num_buckets}")
    files = expand_paths(paths)
    for p in files:
        if not os.path.isfile(p):
            raise KuaiRandDataError(p, 0, None, "file does not exist")
    out_dir = os.path.join(cache_root, f"kuairand-{_cache_key(files)}")
    if os.path.isfile(os.path.join(out_dir, "meta.json")) and not force:
        return out_dir
    os.makedirs(cache_root, exist_ok=True)
    t0 = time.perf_counter()
    work = tempfile.mkdtemp(prefix=".tmp-", dir=cache_root)
    try:
        bucket_paths = [os.path.join(work, f"bucket{b:04d}.bin") for b in range(num_buckets)]
        handles = [open(p, "wb") for p in bucket_paths]
        users, items = _UniqueIds(), _UniqueIds()
        rows = 0
        try:
            for path in files:
                for _, ch in iter_log_chunks(path, block_size):
                    n = len(ch["user_id"])
                    rec = np.empty(n, dtype=_RECORD)
                    rec["u"], rec["v"], rec["t"], rec["a"] = (
                        ch["user_id"], ch["video_id"], ch["time_ms"], ch["actions"])
                    b = ch["user_id"] % num_buckets
                    order = np.argsort(b, kind="stable")
                    bounds = np.searchsorted(b[order], np.arange(num_buckets + 1))
                    for k in range(num_buckets):
                        if bounds[k + 1] > bounds[k]:
                            rec[order[bounds[k]:bounds[k + 1]]].tofile(handles[k])
                    users.add(ch["user_id"])
                    items.add(ch["video_id"])
                    rows += n
                    if progress:
                        print(f"  read {rows:,} rows from {os.path.basename(path)}", flush=True)
        finally:
            for h in handles:
                h.close()
        if rows == 0:
            raise KuaiRandDataError(files[0], 0, None, "no data rows in any input file")
        user_ids, item_ids = users.result(), items.result()
        if len(item_ids) >= 2 ** 31:
            raise ValueError(f"{len(item_ids)} distinct videos: more than int32 item indices hold")
        tmp_out = os.path.join(work, "cache")
        os.makedirs(tmp_out)
        mm = np.lib.format.open_memmap
        items_mm = mm(os.path.join(tmp_out, "items.npy"), "w+", np.int32, (rows,))
        times_mm = mm(os.path.join(tmp_out, "times.npy"), "w+", np.int64, (rows,))
        acts_mm = mm(os.path.join(tmp_out, "actions.npy"), "w+", np.uint8, (rows,))
        user_order: List[np.ndarray] = []
        lengths: List[np.ndarray] = []
        pos = 0
        for bp in bucket_paths:
            rec = np.fromfile(bp, dtype=_RECORD)
            os.remove(bp)
            if len(rec) == 0:
                continue
            order = np.lexsort((rec["t"], rec["u"]))  # stable; primary key last
            rec = rec[order]
            n = len(rec)
            items_mm[pos:pos + n] = np.searchsorted(item_ids, rec["v"]).astype(np.int32)
            times_mm[pos:pos + n] = rec["t"]
            acts_mm[pos:pos + n] = rec["a"]
            u, cnt = np.unique(rec["u"], return_counts=True)
            user_order.append(u)
            lengths.append(cnt)
            pos += n
            del rec
        for a in (items_mm, times_mm, acts_mm):
            a.flush()
        del items_mm, times_mm, acts_mm
        uo = np.concatenate(user_order)
        offsets = np.zeros(len(uo) + 1, dtype=np.int64)
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
        np.save(os.path.join(tmp_out, "user_ids.npy"), uo)
        np.save(os.path.join(tmp_out, "user_offsets.npy"), offsets)
        np.save(os.path.join(tmp_out, "item_ids.npy"), item_ids)
        secs = time.perf_counter() - t0
        stats = PreprocessStats(rows, len(uo), len(item_ids), secs, peak_rss_mb())
        meta = {"version": CACHE_VERSION, "files": [os.path.abspath(p) for p in files],
                "rows": rows, "users": len(uo), "items": len(item_ids),
                "seconds": secs, "rows_per_s": stats.rows_per_s,
                "peak_rss_mb": stats.peak_rss_mb, "num_buckets": num_buckets}
        with open(os.path.join(tmp_out, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        if os.path.isdir(out_dir):  # force=True rebuild: replace the old cache
            shutil.rmtree(out_dir)
        os.replace(tmp_out, out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out_dir


@dataclass
class EventLog:
    """The cached per-user event sequences (memory-mapped)."""

    items: np.ndarray
    times: np.ndarray
    actions: np.ndarray
    user_offsets: np.ndarray
    user_ids: np.ndarray
    item_ids: np.ndarray
    meta: Dict[str, object]

    @classmethod
    def load(cls, cache_dir: str, mmap: bool = True) -> "EventLog":
        mode: Optional[str] = "r" if mmap else None
        with open(os.path.join(cache_dir, "meta.json")) as f:
            meta = json.load(f)
        ld = lambda n: np.load(os.path.join(cache_dir, f"{n}.npy"), mmap_mode=mode)  # noqa: E731
        return cls(ld("items"), ld("times"), ld("actions"), ld("user_offsets"),
                   ld("user_ids"), ld("item_ids"), meta)

    @property
    def num_items(self) -> int:
        return len(self.item_ids)

    @property
    def num_users(self) -> int:
        return len(self.user_ids)

    def positive_sequences(self, rule: PositiveRule, min_len: int = 3) -> "Sequences":
        """Keep positive events (``rule``) and users with at least ``min_len`` of them."""
        if min_len < 2:
            raise ValueError(f"min_len: must be >= 2 (one history item and one target), got {min_len}")
        acts = np.asarray(self.actions)
        keep = rule(acts)
        cs = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum(keep, out=cs[1:])
        per_user = cs[self.user_offsets[1:]] - cs[self.user_offsets[:-1]]
        user_keep = per_user >= min_len
        ev_user = np.repeat(user_keep, np.diff(self.user_offsets))
        sel = keep & ev_user
        lens = per_user[user_keep]
        offsets = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        return Sequences(np.asarray(self.items)[sel].astype(np.int64),
                         np.asarray(self.times)[sel], acts[sel], offsets,
                         np.asarray(self.user_ids)[user_keep], self.num_items)


@dataclass
class Sequences:
    """Jagged per-user sequences of positive events (dense item ids, time in ms, action byte)."""

    items: np.ndarray
    times: np.ndarray
    actions: np.ndarray
    offsets: np.ndarray
    user_ids: np.ndarray
    num_items: int

    @property
    def num_users(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def load_kuairand(paths: Sequence[str], cache_root: str, rule: PositiveRule,
                  min_len: int = 3, **kw: object) -> Sequences:
    """Preprocess (cached) and return the positive sequences."""
    cache = preprocess(paths, cache_root, **kw)  # type: ignore[arg-type]
    return EventLog.load(cache).positive_sequences(rule, min_len)
