"""Event streams -> per-user event sequences, cached on disk in a compact form.

One machinery for every reader (KuaiRand logs, generic tables), in bounded memory for any input
size (KuaiRand-27K is 46 GB of CSV):

1. stream the source's event chunks (int64 user and item keys, time in ms, action byte) and
   append each event as a 25-byte record to one of ``num_buckets`` spill files chosen by
   ``user key mod P``; collect the distinct keys;
2. per bucket: load it (about ``rows / P`` records), map keys to their final ids, drop exact
   duplicates (a row whose user, item and time all equal an earlier row's: the first row in
   file order is kept, its action bits too; the count is ``duplicates_dropped`` in meta.json;
   the same item at another time is a repeat, kept), sort by ``(user, time_ms)`` (stable, so
   events of one user with the same millisecond keep file order), map items to dense
   ``[0, n)`` indices, and write into preallocated ``.npy`` maps.

Integer ids are their own keys: dense item index = rank of the raw id.  Text ids (a table's
``id_type="str"``) arrive as first-appearance codes with the source's vocabulary; their final id
is the rank of the text in byte-wise sorted order, and the sorted texts are cached.

Users come out ordered by ``(key mod P, final id)``; within a user, events by time.  The cache
(one folder, written under a temporary name and renamed when complete) holds

``items`` int32 [E], ``times`` int64 [E] (ms), ``actions`` uint8 [E], ``user_offsets`` int64
[U+1], ``user_ids`` int64 [U], ``item_ids`` int64 [I] (index = dense id), ``meta.json``, for
text ids ``user_vocab.arrow`` / ``item_vocab.arrow`` (the id text of each user id / dense item),
and ``context_<name>.npy`` int64 [E] for each context column a source carries (what was known
when the event happened: KuaiRand's ``tab``, ``is_rand``, ``duration_ms``, ``play_time_ms`` for
ranking; ``meta["context_columns"]`` lists them).
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import resource
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Protocol, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .csv_stream import DEFAULT_BLOCK_SIZE, check_file
from .errors import DataError
from .ragged import offsets_of
from .reader import detect_format, iter_log_chunks
from .schema import ACTION_BITS, PositiveRule

CACHE_VERSION = 2  # 2: exact duplicate rows dropped
_BASE_FIELDS = [("u", "<i8"), ("v", "<i8"), ("t", "<i8"), ("a", "u1")]
EventChunk = Dict[str, np.ndarray]  # "user", "item" int64 keys, "time_ms" int64, "actions" uint8
#                                    (+ one int64 array per context column, by its name)


def _record(context: Sequence[str]) -> np.dtype:
    """The spill record: user, item, time, action byte, then the context columns (int64)."""
    return np.dtype(_BASE_FIELDS + [(f"c{i}", "<i8") for i in range(len(context))])


def expand_paths(patterns: Sequence[str]) -> List[str]:
    """Expand globs (sorted); a pattern matching nothing is a DataError naming it."""
    out: List[str] = []
    for p in patterns:
        hits = sorted(glob.glob(p)) if any(ch in p for ch in "*?[") else [p]
        if not hits:
            raise DataError(p, 0, None, "no file matches this pattern")
        out.extend(hits)
    return out


def cache_key(paths: Sequence[str], options: str = "") -> str:
    """Hash of the files' paths, sizes and mtimes (and of the reading ``options``)."""
    h = hashlib.sha256(f"v{CACHE_VERSION}|{options}".encode() if options else
                       f"v{CACHE_VERSION}".encode())
    for p in paths:
        st = os.stat(p)
        h.update(f"{os.path.abspath(p)}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _distinct(ids: np.ndarray) -> np.ndarray:
    """Sorted distinct values.  By sorting: numpy 2.4's ``np.unique`` hashes first and took
    20-30x longer on 750K int64 ids (0.3-0.4 s against 16 ms, this 2-core machine)."""
    s = np.sort(ids)
    if len(s) < 2:
        return s
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


class _UniqueIds:
    """Distinct int64 ids over a stream, memory ~ number of distinct ids."""

    def __init__(self) -> None:
        self._seen = np.zeros(0, dtype=np.int64)
        self._pending: List[np.ndarray] = []
        self._pending_n = 0

    def add(self, ids: np.ndarray) -> None:
        u = _distinct(ids)
        self._pending.append(u)
        self._pending_n += len(u)
        if self._pending_n > max(4 * len(self._seen), 1 << 20):
            self._merge()

    def _merge(self) -> None:
        if self._pending:
            self._seen = _distinct(np.concatenate([self._seen] + self._pending))
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


class EventSource(Protocol):
    """What :func:`build_cache` reads.

    ``chunks()`` streams ``(path, chunk)`` with int64 ``user`` / ``item`` keys, ``time_ms`` and
    ``actions``; afterwards ``vocab("user" | "item")`` is the text of each key (keys are codes
    ``0..n-1`` into it) for text ids, or None for integer ids.  ``meta`` goes into meta.json."""

    files: Sequence[str]
    meta: Dict[str, Any]
    context: Sequence[str]  # extra int64 columns each chunk carries (may be empty)

    def chunks(self) -> Iterator[Tuple[str, EventChunk]]: ...

    def vocab(self, which: str) -> Optional[pa.Array]: ...


def _text_ranks(vocab: pa.Array) -> Tuple[np.ndarray, pa.Array]:
    """For codes into ``vocab``: the rank of each code's text in sorted order, the sorted texts."""
    order = pc.sort_indices(vocab).to_numpy()
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    return rank, vocab.take(pa.array(order))


def _save_vocab(path: str, texts: pa.Array) -> None:
    with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, pa.schema([("id", texts.type)])) as w:
        w.write_table(pa.table({"id": texts}))


def _load_vocab(path: str) -> Optional[pa.Array]:
    if not os.path.isfile(path):
        return None
    with pa.memory_map(path) as f:
        return pa.ipc.open_file(f).read_all().column("id").combine_chunks()


def build_cache(source: EventSource, out_dir: str, num_buckets: int = 32,
                progress: bool = False) -> str:
    """Spill, sort and write ``source``'s events into the cache folder ``out_dir``."""
    if num_buckets < 1:
        raise ValueError(f"num_buckets: must be >= 1, got {num_buckets}")
    cache_root = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(cache_root, exist_ok=True)
    t0 = time.perf_counter()
    work = tempfile.mkdtemp(prefix=".tmp-", dir=cache_root)
    try:
        bucket_paths = [os.path.join(work, f"bucket{b:04d}.bin") for b in range(num_buckets)]
        context = tuple(getattr(source, "context", ()))
        rows, users, items = _spill(source, bucket_paths, context, progress)
        if rows == 0:
            raise DataError(source.files[0], 0, None, "no data rows in any input file")
        user_keys, item_keys = users.result(), items.result()
        user_vocab, item_vocab = source.vocab("user"), source.vocab("item")
        user_rank = item_rank = None
        if user_vocab is not None:
            user_rank, user_vocab = _text_ranks(user_vocab)
        if item_vocab is not None:
            item_rank, item_vocab = _text_ranks(item_vocab)
            item_ids = np.arange(len(item_vocab), dtype=np.int64)
        else:
            item_ids = item_keys
        if len(item_ids) >= 2 ** 31:
            raise ValueError(f"{len(item_ids)} distinct items: more than int32 item indices hold")
        tmp_out = os.path.join(work, "cache")
        os.makedirs(tmp_out)
        uo, offsets, dropped = _sort_buckets(bucket_paths, tmp_out, rows, item_keys, user_rank,
                                             item_rank, context)
        np.save(os.path.join(tmp_out, "user_ids.npy"), uo)
        np.save(os.path.join(tmp_out, "user_offsets.npy"), offsets)
        np.save(os.path.join(tmp_out, "item_ids.npy"), item_ids)
        for name, vocab in (("user", user_vocab), ("item", item_vocab)):
            if vocab is not None:
                _save_vocab(os.path.join(tmp_out, f"{name}_vocab.arrow"), vocab)
        secs = time.perf_counter() - t0
        stats = PreprocessStats(rows, len(uo), len(item_ids), secs, peak_rss_mb())
        meta = {"version": CACHE_VERSION, "files": [os.path.abspath(p) for p in source.files],
                "rows": rows, "duplicates_dropped": dropped, "users": len(uo),
                "items": len(item_ids),
                "seconds": secs, "rows_per_s": stats.rows_per_s,
                "peak_rss_mb": stats.peak_rss_mb, "num_buckets": num_buckets,
                "context_columns": list(context), **source.meta}
        with open(os.path.join(tmp_out, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        if os.path.isdir(out_dir):  # force=True rebuild: replace the old cache
            shutil.rmtree(out_dir)
        os.replace(tmp_out, out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out_dir


def _spill(source: EventSource, bucket_paths: Sequence[str], context: Sequence[str],
           progress: bool) -> Tuple[int, _UniqueIds, _UniqueIds]:
    """Pass 1: every event to the spill file of its user's bucket; distinct keys."""
    p = len(bucket_paths)
    dtype = _record(context)
    handles = [open(bp, "wb") for bp in bucket_paths]
    users, items = _UniqueIds(), _UniqueIds()
    rows = 0
    try:
        for path, ch in source.chunks():
            n = len(ch["user"])
            rec = np.empty(n, dtype=dtype)
            rec["u"], rec["v"], rec["t"], rec["a"] = (
                ch["user"], ch["item"], ch["time_ms"], ch["actions"])
            for i, name in enumerate(context):
                rec[f"c{i}"] = ch[name]
            b = ch["user"] % p
            order = np.argsort(b, kind="stable")
            bounds = np.searchsorted(b[order], np.arange(p + 1))
            for k in range(p):
                if bounds[k + 1] > bounds[k]:
                    rec[order[bounds[k]:bounds[k + 1]]].tofile(handles[k])
            users.add(ch["user"])
            items.add(ch["item"])
            rows += n
            if progress:
                print(f"  read {rows:,} rows from {os.path.basename(path)}", flush=True)
    finally:
        for h in handles:
            h.close()
    return rows, users, items


def _first_of_duplicates(u: np.ndarray, rec: np.ndarray) -> np.ndarray:
    """Indices (ascending: file order) of the records to keep: all but the later rows of each
    group of equal (user, item, time)."""
    n = len(rec)
    order = np.lexsort((np.arange(n), rec["v"], rec["t"], u))  # file order inside a group
    same = np.zeros(n, dtype=bool)
    same[1:] = ((u[order[1:]] == u[order[:-1]]) & (rec["t"][order[1:]] == rec["t"][order[:-1]])
                & (rec["v"][order[1:]] == rec["v"][order[:-1]]))
    return np.sort(order[~same])


def _truncate_npy(path: str, n: int, chunk: int = 1 << 24) -> None:
    """Keep the first ``n`` entries of a 1-D ``.npy`` file (copied in chunks: bounded memory)."""
    src = np.load(path, mmap_mode="r")
    tmp = path + ".tmp.npy"
    dst = np.lib.format.open_memmap(tmp, "w+", src.dtype, (n,))
    for i in range(0, n, chunk):
        dst[i:i + chunk] = src[i:min(i + chunk, n)]
    dst.flush()
    del src, dst
    os.replace(tmp, path)


def _sort_buckets(bucket_paths: Sequence[str], out: str, rows: int, item_keys: np.ndarray,
                  user_rank: Optional[np.ndarray], item_rank: Optional[np.ndarray],
                  context: Sequence[str] = ()) -> Tuple[np.ndarray, np.ndarray, int]:
    """Pass 2: per bucket, final ids, duplicates dropped, sort by (user, time), write; user ids,
    offsets and the number of dropped rows (the files are truncated to the kept rows)."""
    mm = np.lib.format.open_memmap
    items_mm = mm(os.path.join(out, "items.npy"), "w+", np.int32, (rows,))
    times_mm = mm(os.path.join(out, "times.npy"), "w+", np.int64, (rows,))
    acts_mm = mm(os.path.join(out, "actions.npy"), "w+", np.uint8, (rows,))
    ctx_mm = [mm(os.path.join(out, f"context_{name}.npy"), "w+", np.int64, (rows,))
              for name in context]
    dtype = _record(context)
    user_order: List[np.ndarray] = []
    lengths: List[np.ndarray] = []
    pos = 0
    for bp in bucket_paths:
        rec = np.fromfile(bp, dtype=dtype)
        os.remove(bp)
        if len(rec) == 0:
            continue
        u = rec["u"] if user_rank is None else user_rank[rec["u"]]
        keep = _first_of_duplicates(u, rec)
        rec, u = rec[keep], u[keep]
        order = np.lexsort((rec["t"], u))  # stable; primary key last
        rec, u = rec[order], u[order]
        n = len(rec)
        dense = item_rank[rec["v"]] if item_rank is not None else \
            np.searchsorted(item_keys, rec["v"])
        items_mm[pos:pos + n] = dense.astype(np.int32)
        times_mm[pos:pos + n] = rec["t"]
        acts_mm[pos:pos + n] = rec["a"]
        for i, c in enumerate(ctx_mm):
            c[pos:pos + n] = rec[f"c{i}"]
        uu, cnt = np.unique(u, return_counts=True)
        user_order.append(uu)
        lengths.append(cnt)
        pos += n
        del rec
    for a in [items_mm, times_mm, acts_mm] + ctx_mm:
        a.flush()
    del items_mm, times_mm, acts_mm, ctx_mm
    if pos < rows:  # duplicates dropped: keep the first ``pos`` entries of each array
        for name in ["items", "times", "actions"] + [f"context_{c}" for c in context]:
            _truncate_npy(os.path.join(out, f"{name}.npy"), pos)
    uo = np.concatenate(user_order)
    return uo, offsets_of(np.concatenate(lengths)), rows - pos


@dataclass
class Sequences:
    """Jagged per-user sequences of positive events.

    ``items`` dense item ids int64 [E], ``times`` ms int64 [E], ``actions`` uint8 [E] (bit ``i``
    = ``action_names[i]``), ``offsets`` int64 [U+1], ``user_ids`` int64 [U] (the raw id, or for
    text user ids the index into ``user_vocab``), ``num_items`` (the corpus: every item of the
    input, not only positives).  ``item_vocab`` (text item ids only): the id text of each dense
    item id, a pyarrow string array."""

    items: np.ndarray
    times: np.ndarray
    actions: np.ndarray
    offsets: np.ndarray
    user_ids: np.ndarray
    num_items: int
    action_names: Tuple[str, ...] = tuple(ACTION_BITS)
    item_vocab: Optional[pa.Array] = None
    user_vocab: Optional[pa.Array] = None
    source: str = ""
    duplicates_dropped: int = 0

    @property
    def num_users(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


@dataclass
class EventLog:
    """The cached per-user event sequences (memory-mapped)."""

    items: np.ndarray
    times: np.ndarray
    actions: np.ndarray
    user_offsets: np.ndarray
    user_ids: np.ndarray
    item_ids: np.ndarray
    meta: Dict[str, Any]
    user_vocab: Optional[pa.Array] = None
    item_vocab: Optional[pa.Array] = None
    context: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    @classmethod
    def load(cls, cache_dir: str, mmap: bool = True) -> "EventLog":
        mode: Optional[str] = "r" if mmap else None
        with open(os.path.join(cache_dir, "meta.json")) as f:
            meta = json.load(f)
        ld = lambda n: np.load(os.path.join(cache_dir, f"{n}.npy"), mmap_mode=mode)  # noqa: E731
        return cls(ld("items"), ld("times"), ld("actions"), ld("user_offsets"),
                   ld("user_ids"), ld("item_ids"), meta,
                   _load_vocab(os.path.join(cache_dir, "user_vocab.arrow")),
                   _load_vocab(os.path.join(cache_dir, "item_vocab.arrow")),
                   {c: ld(f"context_{c}") for c in meta.get("context_columns", [])})

    @property
    def num_items(self) -> int:
        return len(self.item_ids)

    @property
    def num_users(self) -> int:
        return len(self.user_ids)

    @property
    def action_names(self) -> Tuple[str, ...]:
        """The actions in bit order (KuaiRand's for logs cached before this was recorded)."""
        return tuple(self.meta.get("action_names", tuple(ACTION_BITS)))

    def positive_sequences(self, rule: Optional[PositiveRule], min_len: int = 3) -> Sequences:
        """Keep positive events (``rule``; None: every event) and users with at least
        ``min_len`` of them."""
        if min_len < 2:
            raise ValueError(f"min_len: must be >= 2 (one history item and one target), got {min_len}")
        acts = np.asarray(self.actions)
        names = self.action_names
        if rule is None:
            keep = np.ones(len(acts), dtype=bool)
        else:
            if not rule.action_names and names != tuple(ACTION_BITS):
                rule = dataclasses.replace(rule, action_names=names)
            elif rule.action_names and rule.action_names != names:
                raise ValueError(f"rule.action_names {list(rule.action_names)} differ from this "
                                 f"data's actions {list(names)}")
            keep = rule(acts)
        cs = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum(keep, out=cs[1:])
        per_user = cs[self.user_offsets[1:]] - cs[self.user_offsets[:-1]]
        user_keep = per_user >= min_len
        ev_user = np.repeat(user_keep, np.diff(self.user_offsets))
        sel = keep & ev_user
        offsets = offsets_of(per_user[user_keep])
        return Sequences(np.asarray(self.items)[sel].astype(np.int64),
                         np.asarray(self.times)[sel], acts[sel], offsets,
                         np.asarray(self.user_ids)[user_keep], self.num_items, names,
                         self.item_vocab, self.user_vocab, self.source,
                         int(self.meta.get("duplicates_dropped", 0)))

    @property
    def source(self) -> str:
        """The input files, for messages."""
        return ", ".join(self.meta.get("files", [])) or "data"


# -- KuaiRand -------------------------------------------------------------------------------------
class _KuaiRandSource:
    """KuaiRand logs as an :class:`EventSource` (integer ids), with the ``context`` columns."""

    def __init__(self, files: Sequence[str], block_size: int,
                 context: Sequence[str] = ()) -> None:
        self.files, self.block_size, self.context = list(files), block_size, tuple(context)
        self.meta: Dict[str, Any] = {"source": "kuairand", "action_names": list(ACTION_BITS),
                                     "log_kinds": [detect_format(p).kind for p in self.files]}

    def chunks(self) -> Iterator[Tuple[str, EventChunk]]:
        for path in self.files:
            for _, ch in iter_log_chunks(path, self.block_size, self.context):
                yield path, {"user": ch["user_id"], "item": ch["video_id"],
                             "time_ms": ch["time_ms"], "actions": ch["actions"],
                             **{c: ch[c] for c in self.context}}

    def vocab(self, which: str) -> Optional[pa.Array]:
        return None


def preprocess(paths: Sequence[str], cache_root: str, num_buckets: int = 32,
               block_size: int = DEFAULT_BLOCK_SIZE, force: bool = False,
               progress: bool = False, context: Sequence[str] = ()) -> str:
    """Build (or reuse) the cache for the KuaiRand logs ``paths`` (with the integer
    ``context`` columns of every row, e.g. ``tab``); returns the cache folder."""
    if num_buckets < 1:
        raise ValueError(f"num_buckets: must be >= 1, got {num_buckets}")
    files = expand_paths(paths)
    for p in files:
        check_file(p)
    options = json.dumps({"context": list(context)}) if context else ""
    out_dir = os.path.join(cache_root, f"kuairand-{cache_key(files, options)}")
    if os.path.isfile(os.path.join(out_dir, "meta.json")) and not force:
        return out_dir
    return build_cache(_KuaiRandSource(files, block_size, context), out_dir, num_buckets,
                       progress)


def load_kuairand(paths: Sequence[str], cache_root: str, rule: PositiveRule,
                  min_len: int = 3, **kw: Any) -> Sequences:
    """Preprocess (cached) and return the positive sequences."""
    cache = preprocess(paths, cache_root, **kw)
    return EventLog.load(cache).positive_sequences(rule, min_len)
