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
    chains = [np.flatnonzero(cluster == c) for c in range(cfg.num_clusters)]
    chains = [rng.permutation(c) for c in chains if len(c)]
    pos_in_chain = np.zeros(cfg.num_items, dtype=np.int64)
    chain_of = np.zeros(cfg.num_items, dtype=np.int64)
    for k, ch in enumerate(chains):
        pos_in_chain[ch] = np.arange(len(ch))
        chain_of[ch] = k
    chain_p = [item_pop[ch] / item_pop[ch].sum() for ch in chains]
    sigma = 1.0
    mu = np.log(cfg.mean_len) - 0.5 * sigma ** 2
    lens = np.clip(np.round(rng.lognormal(mu, sigma, cfg.num_users)), cfg.min_len, cfg.max_len)
    seqs = []
    for n in lens.astype(np.int64):
        u = rng.random((n, 3))
        out = np.empty(n, dtype=np.int64)
        cur = int(rng.choice(cfg.num_items, p=item_pop))
        out[0] = cur
        for i in range(1, n):
            k = chain_of[cur]
            ch = chains[k]
            if u[i, 0] < cfg.p_jump:
                cur = int(rng.choice(cfg.num_items, p=item_pop))
            elif u[i, 1] < cfg.p_follow:
                step = 1 + int(u[i, 2] * 3)
                cur = int(ch[(pos_in_chain[cur] + step) % len(ch)])
            else:
                cur = int(ch[np.searchsorted(np.cumsum(chain_p[k]), u[i, 2] * 0.999999)])
            out[i] = cur
        seqs.append(out)
    return video_ids, item_pop, seqs


def generate(out_dir: str, cfg: SyntheticConfig = SyntheticConfig()) -> Dict[str, str]:
    """Write the four KuaiRand-format files into ``out_dir``; return their paths by kind."""
    rng = np.random.default_rng(cfg.seed)
    os.makedirs(out_dir, exist_ok=True)
    video_ids, item_pop, seqs = chain_sequences(cfg, rng)
    user_ids = np.sort(rng.choice(50 * cfg.num_users, cfg.num_users, replace=False))
    cols: Dict[str, list] = {c: [] for c in LOG_COLUMNS}
    for uid, seq in zip(user_ids, seqs):
        n_imp = rng.binomial(len(seq), cfg.p_impression)
        imp = rng.choice(cfg.num_items, n_imp, p=item_pop)
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
        play = np.where(c, duration * rng.uniform(0.3, 1.2, n), duration * rng.uniform(0, 0.2, n))
        local = (t + 8 * 3600_000) // 1000  # Beijing time, seconds
        days = local // 86400
        ymd = (np.datetime64("1970-01-01") + days.astype("timedelta64[D]")).astype(str)
        cols["user_id"].append(np.full(n, uid))
        cols["video_id"].append(video_ids[items])
        cols["date"].append(np.char.replace(ymd, "-", "").astype(np.int64))
        cols["hourmin"].append(((local % 86400) // 3600) * 100)
        cols["time_ms"].append(t)
        for k, v in acts.items():
            cols[k].append(v)
        cols["play_time_ms"].append(play.astype(np.int64))
        cols["duration_ms"].append(duration)
        cols["profile_stay_time"].append(acts["is_profile_enter"] * rng.integers(1, 60, n))
        cols["comment_stay_time"].append(acts["is_comment"] * rng.integers(1, 60, n))
        cols["is_rand"].append(np.zeros(n, np.int64))
        cols["tab"].append(rng.integers(0, 5, n))
    table = pa.table({k: np.concatenate(v) for k, v in cols.items()})
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
    ni = len(video_ids)
    vf: Dict[str, object] = {c: rng.integers(0, 100, ni) for c in VIDEO_FEATURE_COLUMNS}
    vf.update(video_id=video_ids, video_type=rng.choice(["NORMAL", "AD"], ni),
              upload_dt=np.full(ni, "2022-03-01"), upload_type=rng.choice(["ShortImport", "Web"], ni),
              visible_status=np.full(ni, "public"), video_duration=5000 + (video_ids % 97) * 1000,
              tag=rng.integers(0, 60, ni).astype(str))
    paths["video_features"] = os.path.join(out_dir, f"video_features_basic_{cfg.tag}.csv")
    pcsv.write_csv(pa.table({c: vf[c] for c in VIDEO_FEATURE_COLUMNS}), paths["video_features"], _WRITE)
    return paths
