"""Deterministic generator of KuaiRand-format CSV files (the embedded default data set).

Writes ``log_standard_<tag>.csv``, ``log_random_<tag>.csv``, ``user_features_<tag>.csv`` and
``video_features_basic_<tag>.csv`` with every official column.  The logs have what makes
KuaiRand hard and sequential models useful:

* heavy-tailed sequence lengths (log-normal, clipped to ``[min_len, max_len]``);
* Zipf item popularity (exponent ``zipf_a``);
* sequential structure: items belong to ``num_clusters`` interest clusters, each cluster is a
  chain; a user's next clicked video is usually 1-3 steps further along the chain of the current
  cluster (``p_follow``), sometimes a popular video of the same cluster, and with probability
  ``p_jump`` a popular video of a new cluster;
* non-clicked impressions (popularity-sampled) interleaved with the clicks, and the other
  actions (like, follow, comment, forward, long_view, profile_enter, hate) drawn per event.

The same ``seed`` and sizes always give byte-identical files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

_WRITE = pcsv.WriteOptions(quoting_style="none", quoting_header="none")  # like the official files: no quotes

from .schema import LOG_COLUMNS, USER_FEATURE_COLUMNS, VIDEO_FEATURE_COLUMNS

_T0_MS = 1649347200000  # 2022-04-08 00:00 +08:00 (KuaiRand's first day)


@dataclass(frozen=True)
class SyntheticConfig:
    """Sizes and shape of the synthetic KuaiRand data."""

    num_users: int = 2000
    num_items: int = 3000
    num_clusters: int = 40
    mean_len: float = 30.0  # mean clicked-sequence length before clipping
    min_len: int = 4
    max_len: int = 400
    zipf_a: float = 1.1
    p_follow: float = 0.7
    p_jump: float = 0.1
    p_impression: float = 0.4  # non-clicked impressions per click
    random_log_rows: int = 2000
    seed: int = 0
    tag: str = "synthetic"
    # write video_features_basic_<tag>.csv (one row per item: at KuaiRand-27K's 32M items it is
    # most of the generation time and ~2 GB; the logs do not need it)
    item_features: bool = True

    def __post_init__(self) -> None:
        for name in ("num_users", "num_items", "num_clusters", "min_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.num_clusters > self.num_items:
            raise ValueError("num_clusters: must not exceed num_items")
        if not self.min_len <= self.max_len:
            raise ValueError(f"min_len ({self.min_len}) must be <= max_len ({self.max_len})")


def _zipf_weights(n: int, a: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** a
    return w / w.sum()


class Categorical:
    """Draws of ``rng.choice(len(p), size, p=p)`` with the CDF built once.

    ``Generator.choice`` rebuilds the CDF of ``p`` (O(len(p))) on every call; with 32M items and
    a draw per event that is what made generation O(items x events).  This draws the same way
    (``cdf.searchsorted(rng.random(size), side="right")``, numpy's own method), so it consumes
    the same random numbers and returns the same indices as ``choice`` does.
    """

    def __init__(self, p: np.ndarray) -> None:
        cdf = np.cumsum(p, dtype=np.float64)
        cdf /= cdf[-1]
        self.cdf = cdf

    def __call__(self, rng: np.random.Generator, size=None):
        idx = self.cdf.searchsorted(rng.random(size), side="right")
        return int(idx) if size is None else idx


def chain_sequences(cfg: SyntheticConfig, rng: np.random.Generator
                    ) -> Tuple[np.ndarray, np.ndarray, List[np.ndarray]]:
    """The sequential structure shared by the generators (KuaiRand logs, generic tables).

    Returns the raw item ids (sorted, sparse), each item index's popularity, and per user the
    array of item indices of its positive sequence: cluster chains with Zipf popularity and
    log-normal lengths (module docstring)."""
    # raw ids: sparse, as in KuaiRand (not 0..n-1)
    video_ids = np.sort(rng.choice(10 * cfg.num_items, cfg.num_items, replace=False)) + 1
    pop = _zipf_weights(cfg.num_items, cfg.zipf_a)
    pop_rank = rng.permutation(cfg.num_items)  # popularity of each item index
    item_pop = pop[pop_rank]
    cluster = rng.integers(0, cfg.num_clusters, cfg.num_items)
    # items of each cluster in ascending order (one stable sort, not a scan per cluster)
    by_cluster = np.argsort(cluster, kind="stable")
    bounds = np.cumsum(np.bincount(cluster, minlength=cfg.num_clusters))[:-1]
    chains = [rng.permutation(c) for c in np.split(by_cluster, bounds) if len(c)]
    pos_in_chain = np.zeros(cfg.num_items, dtype=np.int64)
    chain_of = np.zeros(cfg.num_items, dtype=np.int64)
    for k, ch in enumerate(chains):
        pos_in_chain[ch] = np.arange(len(ch))
        chain_of[ch] = k
    draw_item = Categorical(item_pop)
    draw_in_chain = [np.cumsum(item_pop[ch] / item_pop[ch].sum()) for ch in chains]
    sigma = 1.0
    mu = np.log(cfg.mean_len) - 0.5 * sigma ** 2
    lens = np.clip(np.round(rng.lognormal(mu, sigma, cfg.num_users)), cfg.min_len, cfg.max_len)
    seqs = []
    for n in lens.astype(np.int64):
        u = rng.random((n, 3))
        out = np.empty(n, dtype=np.int64)
        cur = draw_item(rng)
        out[0] = cur
        for i in range(1, n):
            k = chain_of[cur]
            ch = chains[k]
            if u[i, 0] < cfg.p_jump:
                cur = draw_item(rng)
            elif u[i, 1] < cfg.p_follow:
                step = 1 + int(u[i, 2] * 3)
                cur = int(ch[(pos_in_chain[cur] + step) % len(ch)])
            else:
                cur = int(ch[np.searchsorted(draw_in_chain[k], u[i, 2] * 0.999999)])
            out[i] = cur
        seqs.append(out)
    return video_ids, item_pop, seqs


def _yyyymmdd(days: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 -> the integer date ``yyyymmdd``."""
    d = days.astype("datetime64[D]")
    year = d.astype("datetime64[Y]")
    month = d.astype("datetime64[M]")
    return ((year.astype(np.int64) + 1970) * 10000 + ((month - year).astype(np.int64) + 1) * 100
            + (d - month).astype(np.int64) + 1)


def _pick(values: List[str], idx: np.ndarray) -> pa.Array:
    """``values[idx]`` as an arrow string array (no numpy unicode array of n strings)."""
    return pa.array(values, pa.string()).take(pa.array(idx))


def generate(out_dir: str, cfg: SyntheticConfig = SyntheticConfig()) -> Dict[str, str]:
    """Write the four KuaiRand-format files into ``out_dir`` (three without
    ``cfg.item_features``); return their paths by kind.

    Cost: O(events) Python-level work (the chain walk and per-user draws), O(items) numpy work
    (ids, popularity, clusters) and, with ``item_features``, an O(items) CSV.  Every categorical
    draw uses a CDF built once (:class:`Categorical`), so the files are byte-identical to those
    of the earlier O(items)-per-draw generator for the same config."""
    rng = np.random.default_rng(cfg.seed)
    os.makedirs(out_dir, exist_ok=True)
    video_ids, item_pop, seqs = chain_sequences(cfg, rng)
    draw_item = Categorical(item_pop)
    user_ids = np.sort(rng.choice(50 * cfg.num_users, cfg.num_users, replace=False))
    # per user: the random draws, in the same order as always (same seed -> same bytes); the
    # derived columns are computed once over all events afterwards
    parts: Dict[str, list] = {k: [] for k in ("uid", "items", "click", "t", "r", "u_play", "prof",
                                               "comm", "tab")}
    for uid, seq in zip(user_ids, seqs):
        n_imp = rng.binomial(len(seq), cfg.p_impression)
        imp = draw_item(rng, n_imp)
        items = np.concatenate([seq, imp])
        click = np.concatenate([np.ones(len(seq), np.int64), np.zeros(n_imp, np.int64)])
        # impressions land between the clicks: random order of a merged time line
        slot = np.concatenate([np.arange(len(seq)) * 2.0, rng.uniform(-1, 2 * len(seq), n_imp)])
        order = np.argsort(slot, kind="stable")
        items, click = items[order], click[order]
        n = len(items)
        t = _T0_MS + int(rng.integers(0, 3 * 86400_000)) + np.cumsum(
            rng.exponential(600_000.0, n).astype(np.int64) + 1000)
        r = rng.random((n, 7))
        u_click, u_skip = rng.uniform(0.3, 1.2, n), rng.uniform(0, 0.2, n)
        parts["uid"].append(np.full(n, uid))
        parts["items"].append(items)
        parts["click"].append(click)
        parts["t"].append(t)
        parts["r"].append(r)
        parts["u_play"].append(np.where(click == 1, u_click, u_skip))
        parts["prof"].append(rng.integers(1, 60, n))
        parts["comm"].append(rng.integers(1, 60, n))
        parts["tab"].append(rng.integers(0, 5, n))
    cat = {k: np.concatenate(v) if v else np.zeros((0, 7) if k == "r" else 0) for k, v in parts.items()}
    items, click, t, r = cat["items"].astype(np.int64), cat["click"], cat["t"], cat["r"]
    c = click == 1
    acts = {
        "is_click": click,
        "is_like": (c & (r[:, 0] < 0.15)).astype(np.int64),
        "is_follow": (c & (r[:, 1] < 0.02)).astype(np.int64),
        "is_comment": (c & (r[:, 2] < 0.05)).astype(np.int64),
        "is_forward": (c & (r[:, 3] < 0.02)).astype(np.int64),
        "is_hate": (~c & (r[:, 4] < 0.01)).astype(np.int64),
        "long_view": (c & (r[:, 5] < 0.4)).astype(np.int64),
        "is_profile_enter": (c & (r[:, 6] < 0.05)).astype(np.int64),
    }
    duration = 5000 + (video_ids[items] % 97) * 1000
    local = (t + 8 * 3600_000) // 1000  # Beijing time, seconds
    cols: Dict[str, np.ndarray] = {c_: np.zeros(0, np.int64) for c_ in LOG_COLUMNS}
    cols.update(acts)
    cols.update(
        user_id=cat["uid"], video_id=video_ids[items], date=_yyyymmdd(local // 86400),
        hourmin=((local % 86400) // 3600) * 100, time_ms=t,
        play_time_ms=(duration * cat["u_play"]).astype(np.int64), duration_ms=duration,
        profile_stay_time=acts["is_profile_enter"] * cat["prof"],
        comment_stay_time=acts["is_comment"] * cat["comm"],
        is_rand=np.zeros(len(t), np.int64), tab=cat["tab"])
    table = pa.table({k: cols[k] for k in LOG_COLUMNS})
    paths = {}
    paths["log_standard"] = os.path.join(out_dir, f"log_standard_{cfg.tag}.csv")
    pcsv.write_csv(table, paths["log_standard"], _WRITE)
    # the random-exposure log: uniformly exposed videos, few clicks
    m = cfg.random_log_rows
    ru = rng.choice(user_ids, m)
    rv = rng.choice(video_ids, m)
    rt = _T0_MS + 14 * 86400_000 + rng.integers(0, 86400_000, m)
    rand = {c: np.zeros(m, np.int64) for c in LOG_COLUMNS}
    rand.update(user_id=ru, video_id=rv, time_ms=rt, date=np.full(m, 20220422),
                hourmin=(((rt + 8 * 3600_000) // 1000 % 86400) // 3600) * 100,
                is_click=(rng.random(m) < 0.2).astype(np.int64), is_rand=np.ones(m, np.int64),
                duration_ms=5000 + (rv % 97) * 1000)
    paths["log_random"] = os.path.join(out_dir, f"log_random_{cfg.tag}.csv")
    pcsv.write_csv(pa.table({c: rand[c] for c in LOG_COLUMNS}), paths["log_random"], _WRITE)
    # user features: numbers plus the string column user_active_degree, like the real file
    nu = len(user_ids)
    uf: Dict[str, object] = {"user_id": user_ids,
                             "user_active_degree": rng.choice(
                                 ["high_active", "full_active", "middle_active", "UNKNOWN"], nu)}
    for ccol in USER_FEATURE_COLUMNS[2:]:
        uf[ccol] = rng.integers(0, 10, nu)
    paths["user_features"] = os.path.join(out_dir, f"user_features_{cfg.tag}.csv")
    pcsv.write_csv(pa.table(uf), paths["user_features"], _WRITE)
    if not cfg.item_features:
        return paths
    ni = len(video_ids)
    vf: Dict[str, object] = {c_: rng.integers(0, 100, ni) for c_ in VIDEO_FEATURE_COLUMNS}
    vf.update(video_id=video_ids, video_type=_pick(["NORMAL", "AD"], rng.choice(2, ni)),
              upload_dt=_pick(["2022-03-01"], np.zeros(ni, np.int64)),
              upload_type=_pick(["ShortImport", "Web"], rng.choice(2, ni)),
              visible_status=_pick(["public"], np.zeros(ni, np.int64)),
              video_duration=5000 + (video_ids % 97) * 1000,
              tag=_pick([str(i) for i in range(60)], rng.integers(0, 60, ni)))
    paths["video_features"] = os.path.join(out_dir, f"video_features_basic_{cfg.tag}.csv")
    pcsv.write_csv(pa.table({c: vf[c] for c in VIDEO_FEATURE_COLUMNS}), paths["video_features"], _WRITE)
    return paths
