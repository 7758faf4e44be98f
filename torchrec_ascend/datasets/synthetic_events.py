"""Deterministic generator of a generic events table (``user_id, item_id, timestamp``).

The sequences are :func:`~.synthetic.chain_sequences`'s (the KuaiRand generator's structure):
items in interest-cluster chains, the next item usually 1-3 steps along the current chain, Zipf
popularity, log-normal lengths.  So a sequential model beats most-popular on it (the tests check
that a first-order transition count already does).  Rows are in global time order (users
interleaved, as in a real log); timestamps are integer seconds, strictly increasing per user.

    generate_events_table("events.csv", num_users=500, num_items=800, seed=0)
    generate_events_table("events.parquet", 500, 800, 0, format="parquet")   # the same rows

The same arguments always give the same rows (and byte-identical CSV).
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from .synthetic import Categorical, SyntheticConfig, chain_sequences

_T0_S = 1_600_000_000  # 2020-09-13


def generate_events_table(path: str, num_users: int, num_items: int, seed: int,
                          format: str = "csv", *, mean_len: float = 20.0,
                          num_clusters: int = 0, string_ids: bool = False,
                          clicks: bool = False) -> str:
    """Write the table to ``path`` (``format``: ``"csv"`` | ``"parquet"``); returns ``path``.

    ``num_clusters`` 0: ``max(2, num_items // 50)``.  ``string_ids``: ids as text (``U0000042``,
    ``I00000017``) instead of integers.  ``clicks``: add a ``click`` column (1 for the sequence's
    events) and interleave ~40% non-clicked (0) impressions of popular items."""
    if format not in ("csv", "parquet"):
        raise ValueError(f"format: {format!r} is not one of ['csv', 'parquet']")
    for name, v in (("num_users", num_users), ("num_items", num_items)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name}: must be a positive integer, got {v!r}")
    clusters = num_clusters or max(2, num_items // 50)
    cfg = SyntheticConfig(num_users=num_users, num_items=num_items,
                          num_clusters=min(clusters, num_items), mean_len=mean_len, min_len=4,
                          max_len=max(4, int(10 * mean_len)), seed=seed)
    rng = np.random.default_rng(seed)
    item_raw, item_pop, seqs = chain_sequences(cfg, rng)
    draw_item = Categorical(item_pop)
    user_raw = rng.choice(10 * num_users, num_users, replace=False) + 1
    users, items, times, click = [], [], [], []
    for k, seq in enumerate(seqs):
        idx, clk = seq, np.ones(len(seq), np.int64)
        if clicks:
            n_imp = rng.binomial(len(seq), 0.4)
            slot = np.concatenate([np.arange(len(seq)) * 2.0, rng.uniform(-1, 2 * len(seq), n_imp)])
            order = np.argsort(slot, kind="stable")
            idx = np.concatenate([seq, draw_item(rng, n_imp)])[order]
            clk = np.concatenate([clk, np.zeros(n_imp, np.int64)])[order]
        start = _T0_S + int(rng.integers(0, 30 * 86400))
        t = start + np.cumsum(1 + rng.exponential(3600.0, len(idx)).astype(np.int64))
        users.append(np.full(len(idx), k))
        items.append(idx)
        times.append(t)
        click.append(clk)
    u, i, t, c = (np.concatenate(x) for x in (users, items, times, click))
    order = np.lexsort((u, t))  # global time order, ties by user
    u, i, t, c = u[order], i[order], t[order], c[order]
    cols = {"user_id": user_raw[u], "item_id": item_raw[i], "timestamp": t}
    if string_ids:
        cols["user_id"] = np.char.mod("U%07d", cols["user_id"])
        cols["item_id"] = np.char.mod("I%08d", cols["item_id"])
    if clicks:
        cols["click"] = c
    table = pa.table({k: pa.array(v) for k, v in cols.items()})
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if format == "csv":
        pcsv.write_csv(table, path, pcsv.WriteOptions(quoting_style="none", quoting_header="none"))
    else:
        pq.write_table(table, path, row_group_size=1 << 16)
    return path
