"""Assign items (sequences) with costs to bins (ranks, micro-batches) minimising the largest bin cost.

Two phases, both deterministic (same input, same output, on every rank):

1. **LPT** (longest processing time first): items in decreasing cost (ties: lower index first) go
   to the bin with the least cost so far (ties: fewer items, then lower bin index) among the bins
   that still have room (``max_per_bin`` items, ``max_size_per_bin`` size, e.g. tokens).
   Graham's bound: the largest bin is at most ``4/3 - 1/(3 * num_bins)`` of the optimum.
2. **Refinement**: repeatedly take the most expensive bin and, pairing it with the other bins in
   increasing cost, apply the move of one item or the swap of two items that most evens out the
   pair, if that lowers the pair's maximum (by more than 1e-12 relative).  Every step strictly lowers
   the sum of squared bin costs, so it ends; it is also capped at ``max_rounds`` steps and stops
   once the largest bin is within ``tol`` (relative, default 1e-4) of the lower bound
   ``max(largest item, total / num_bins)``.

Infeasible limits are ``ValueError``: ``num_bins * max_per_bin < N``, an item larger than
``max_size_per_bin``, or LPT finding no bin with room for an item (a heuristic: it does not search
for a packing by other orders).  :class:`RankPlanner` adds the balancers' rank-level rules on top.
"""

from __future__ import annotations

import heapq
from typing import Optional

import numpy as np
import torch

from ...ops.extension import kernel

__all__ = ["plan_assignment", "RankPlanner", "bin_loads", "imbalance"]

_REL_TOL = 1e-12


def _as_numpy(name: str, t: "torch.Tensor | np.ndarray", n: Optional[int] = None) -> np.ndarray:
    a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    if a.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D tensor, got shape {tuple(a.shape)}")
    if n is not None and a.shape[0] != n:
        raise ValueError(f"{name}: has {a.shape[0]} entries, expected {n} (one per item)")
    if a.dtype == np.bool_ or not (np.issubdtype(a.dtype, np.number)):
        raise ValueError(f"{name}: expected numbers, got dtype {a.dtype}")
    a = a.astype(np.float64)
    if a.size and (not np.isfinite(a).all() or (a < 0).any()):
        raise ValueError(f"{name}: every entry must be finite and >= 0")
    return a


def _lpt(c: np.ndarray, num_bins: int, cap: Optional[int], s: Optional[np.ndarray],
         size_cap: Optional[float]) -> np.ndarray:
    """LPT bins: the csrc kernel ``lb_lpt`` (the same rules and tie-breaks, one call) where the
    extension is built, else :func:`_lpt_reference`; an infeasible item reruns the reference, which
    raises the error."""
    fn = kernel("lb_lpt")
    if fn is not None:
        bins, failed = fn(torch.from_numpy(c), num_bins, 0 if cap is None else cap,
                          torch.from_numpy(s) if s is not None else _NO_SIZES,
                          0.0 if size_cap is None else float(size_cap))
        if failed < 0:
            return bins.numpy()
    return _lpt_reference(c, num_bins, cap, s, size_cap)


_NO_SIZES = torch.empty(0, dtype=torch.float64)


def _lpt_reference(c: np.ndarray, num_bins: int, cap: Optional[int], s: Optional[np.ndarray],
                   size_cap: Optional[float]) -> np.ndarray:
    """LPT in Python (heapq): the reference of ``lb_lpt`` and the fallback without the extension."""
    bins = [0] * c.shape[0]
    cost = c.tolist()
    size = s.tolist() if s is not None else None
    used = [0.0] * num_bins
    heap = [(0.0, 0, k) for k in range(num_bins)]  # (cost, items, bin): already a heap
    order = np.argsort(-c, kind="stable").tolist()
    if size is None:  # no size limit: the cheapest bin always takes the item (one heap op)
        for i in order:
            load, cnt, k = heap[0]
            bins[i] = k
            if cap is None or cnt + 1 < cap:
                heapq.heapreplace(heap, (load + cost[i], cnt + 1, k))
            else:
                heapq.heappop(heap)  # full; cap * num_bins >= N, so a bin remains for every item
        return np.array(bins, dtype=np.int64)
    for i in order:
        skipped = []
        while heap:
            entry = heapq.heappop(heap)
            if size is not None and used[entry[2]] + size[i] > size_cap:
                skipped.append(entry)
                continue
            break
        else:
            raise ValueError(
                f"max_size_per_bin: no bin has room for item {i} (size {size[i]:g}; bins hold "
                f"{sorted(used)[:4]}...; limit {size_cap:g}): raise the limit or use more bins")
        load, cnt, k = entry
        bins[i] = k
        if size is not None:
            used[k] += size[i]
        if cap is None or cnt + 1 < cap:
            heapq.heappush(heap, (load + cost[i], cnt + 1, k))
        for e in skipped:
            heapq.heappush(heap, e)
    return np.array(bins, dtype=np.int64)


def _best_exchange(c: np.ndarray, s: Optional[np.ndarray], size_cap: Optional[float],
                   ih: np.ndarray, ip: np.ndarray, lh: float, lp: float, room: bool,
                   uh: float, up: float):
    """The move (item of ih to p) or swap (ih <-> ip) giving the smallest max of the two bins:
    ``(new max, moved-from-h index, moved-from-p index or -1)`` or ``None``."""
    ch = c[ih]
    best = None
    if room:  # moves h -> p
        new = np.maximum(lh - ch, lp + ch)
        if s is not None:
            new = np.where(up + s[ih] <= size_cap, new, np.inf)
        j = int(np.argmin(new)) if new.size else -1
        if j >= 0 and np.isfinite(new[j]):
            best = (float(new[j]), int(ih[j]), -1)
    if ip.size:
        d = ch[:, None] - c[ip][None, :]
        new = np.where(d > 0, np.maximum(lh - d, lp + d), np.inf)
        if s is not None:
            ds = s[ih][:, None] - s[ip][None, :]
            new = np.where((up + ds <= size_cap) & (uh - ds <= size_cap), new, np.inf)
        flat = int(np.argmin(new))
        a, b = divmod(flat, ip.size)
        if np.isfinite(new[a, b]) and (best is None or new[a, b] < best[0]):
            best = (float(new[a, b]), int(ih[a]), int(ip[b]))
    return best


def _refine(c: np.ndarray, bins: np.ndarray, num_bins: int, cap: Optional[int],
            s: Optional[np.ndarray], size_cap: Optional[float], max_rounds: int, tol: float) -> None:
    """Refinement in place on ``bins``: the csrc kernel ``lb_refine`` (the same steps and
    tie-breaks, one call) where the extension is built, else :func:`_refine_reference`."""
    fn = kernel("lb_refine")
    if fn is None:
        _refine_reference(c, bins, num_bins, cap, s, size_cap, max_rounds, tol)
        return
    fn(torch.from_numpy(c), torch.from_numpy(bins), num_bins, 0 if cap is None else cap,
       torch.from_numpy(s) if s is not None else _NO_SIZES, 0.0 if size_cap is None else float(size_cap),
       max_rounds, tol, _bound(c, num_bins), _REL_TOL)


def _bound(c: np.ndarray, num_bins: int) -> float:
    """Lower bound of the largest bin: ``max(largest item, total / num_bins)``."""
    return max(float(c.max()), float(c.sum()) / num_bins)


def _refine_reference(c: np.ndarray, bins: np.ndarray, num_bins: int, cap: Optional[int],
                      s: Optional[np.ndarray], size_cap: Optional[float], max_rounds: int, tol: float) -> None:
    """Refinement in numpy: the reference of ``lb_refine`` and the fallback without the extension."""
    loads = np.bincount(bins, weights=c, minlength=num_bins)
    counts = np.bincount(bins, minlength=num_bins)
    used = np.bincount(bins, weights=s, minlength=num_bins) if s is not None else None
    bound = _bound(c, num_bins)
    for _ in range(max_rounds):
        h = int(np.argmax(loads))
        lh = float(loads[h])
        if lh <= bound * (1 + tol):
            return
        ih = np.flatnonzero(bins == h)
        done = False
        for p in np.argsort(loads, kind="stable").tolist():
            if p == h or loads[p] >= lh:
                continue
            ip = np.flatnonzero(bins == p)
            room = cap is None or counts[p] < cap
            got = _best_exchange(c, s, size_cap, ih, ip, lh, float(loads[p]), room,
                                 float(used[h]) if used is not None else 0.0,
                                 float(used[p]) if used is not None else 0.0)
            if got is None or got[0] >= lh * (1 - _REL_TOL):
                continue
            _, i, j = got
            for item, src, dst in ((i, h, p), (j, p, h)):
                if item < 0:
                    continue
                bins[item] = dst
                loads[src] -= c[item]
                loads[dst] += c[item]
                counts[src] -= 1
                counts[dst] += 1
                if used is not None:
                    used[src] -= s[item]
                    used[dst] += s[item]
            done = True
            break
        if not done:
            return


def plan_assignment(costs: torch.Tensor, num_bins: int, max_per_bin: Optional[int] = None, *,
                    sizes: Optional[torch.Tensor] = None, max_size_per_bin: Optional[float] = None,
                    refine: bool = True, max_rounds: Optional[int] = None, tol: float = 1e-4) -> torch.Tensor:
    """Bin of each item (``int64 [N]``, CPU) minimising the largest bin's total cost.

    ``costs [N]`` finite, >= 0.  ``max_per_bin`` bounds items per bin; ``sizes [N]`` with
    ``max_size_per_bin`` bounds each bin's total size (e.g. tokens: memory).  ``max_rounds``
    caps refinement steps (default ``4 * N + 16``); refinement stops within ``tol`` of the lower
    bound (0: only when no step improves).  Algorithm and errors: module docstring."""
    c = _as_numpy("costs", costs)
    if (sizes is None) != (max_size_per_bin is None):
        raise ValueError("sizes, max_size_per_bin: give both or neither")
    s = _as_numpy("sizes", sizes, c.shape[0]) if sizes is not None else None
    return torch.from_numpy(_plan_checked(c, num_bins, max_per_bin, s, max_size_per_bin, refine, max_rounds, tol))


def _plan_checked(c: np.ndarray, num_bins: int, max_per_bin: Optional[int], s: Optional[np.ndarray],
                  max_size_per_bin: Optional[float], refine: bool, max_rounds: Optional[int],
                  tol: float) -> np.ndarray:
    """:func:`plan_assignment` of checked data (``c``, ``s``: float64 host arrays, finite, >= 0;
    ``s`` and ``max_size_per_bin`` both given or both None): checks the limits, returns the bins."""
    n = c.shape[0]
    if int(num_bins) < 1:
        raise ValueError(f"num_bins: must be >= 1, got {num_bins}")
    if not tol >= 0:
        raise ValueError(f"tol: must be >= 0, got {tol}")
    num_bins = int(num_bins)
    cap = None if max_per_bin is None else int(max_per_bin)
    if cap is not None and cap < 1:
        raise ValueError(f"max_per_bin: must be >= 1, got {max_per_bin}")
    if cap is not None and cap * num_bins < n:
        raise ValueError(f"max_per_bin: {num_bins} bins x {cap} items < {n} items")
    size_cap = None
    if s is not None:
        size_cap = float(max_size_per_bin)
        if not size_cap > 0:
            raise ValueError(f"max_size_per_bin: must be > 0, got {max_size_per_bin}")
        if n and float(s.max()) > size_cap:
            i = int(np.argmax(s))
            raise ValueError(f"max_size_per_bin: item {i} alone has size {s[i]:g} > the limit {size_cap:g}")
    if n == 0:
        return np.empty(0, dtype=np.int64)
    bins = _lpt(c, num_bins, cap, s, size_cap)
    if refine and num_bins > 1:
        _refine(c, bins, num_bins, cap, s, size_cap, 4 * n + 16 if max_rounds is None else int(max_rounds),
                max(float(tol), _REL_TOL))
    return bins


def bin_loads(costs: torch.Tensor, bins: torch.Tensor, num_bins: int) -> torch.Tensor:
    """Total cost per bin (float64 ``[num_bins]``)."""
    c = _as_numpy("costs", costs)
    b = np.asarray(bins.cpu().numpy() if isinstance(bins, torch.Tensor) else bins, dtype=np.int64)
    if b.shape != c.shape:
        raise ValueError(f"bins: shape {b.shape} != costs shape {c.shape}")
    if b.size and (b.min() < 0 or b.max() >= num_bins):
        raise ValueError(f"bins: entries must be in [0, {num_bins})")
    return torch.from_numpy(np.bincount(b, weights=c, minlength=num_bins).astype(np.float64))


def imbalance(costs: torch.Tensor, bins: torch.Tensor, num_bins: int) -> float:
    """``max bin cost / mean bin cost - 1`` (0 for an all-zero total)."""
    loads = bin_loads(costs, bins, num_bins)
    mean = float(loads.mean())
    return float(loads.max()) / mean - 1.0 if mean > 0 else 0.0


class RankPlanner:
    """A cost model plus per-rank limits: plans a global batch over ranks (the shared base of
    :class:`~.collator.CollatorBalancer` and :class:`~.exchange.AllToAllBalancer`).

    ``max_per_rank`` bounds the sequences of a rank, ``max_tokens_per_rank`` its tokens (a
    sequence longer than that is a ``ValueError``); ``allow_empty=False`` makes a plan that leaves
    a rank without sequences (only possible with fewer sequences than ranks) a ``ValueError``,
    ``True`` gives that rank an empty batch.  Without a token limit, a sequence costing more than
    a fair share gets a rank to itself and the rest are balanced over the other ranks."""

    def __init__(self, cost_model, max_per_rank: Optional[int] = None,
                 max_tokens_per_rank: Optional[int] = None, allow_empty: bool = True) -> None:
        if not callable(getattr(cost_model, "cost", None)):
            raise ValueError(f"cost_model: needs a cost(lengths, num_targets) method, "
                             f"got {type(cost_model).__name__}")
        for name, v in (("max_per_rank", max_per_rank), ("max_tokens_per_rank", max_tokens_per_rank)):
            if v is not None and (isinstance(v, bool) or int(v) != v or int(v) < 1):
                raise ValueError(f"{name}: must be an integer >= 1 or None, got {v!r}")
        self.cost_model = cost_model
        self.max_per_rank = None if max_per_rank is None else int(max_per_rank)
        self.max_tokens_per_rank = None if max_tokens_per_rank is None else int(max_tokens_per_rank)
        self.allow_empty = bool(allow_empty)

    def plan_costs(self, costs: torch.Tensor, lengths: torch.Tensor, world: int) -> torch.Tensor:
        """Rank of each sequence (``int64 [N]``) given its cost and token count."""
        c = _as_numpy("costs", costs)
        sizes = _as_numpy("lengths", lengths, c.shape[0]) if self.max_tokens_per_rank is not None else None
        return torch.from_numpy(self._plan_host(c, sizes, world))

    def _plan_host(self, costs: np.ndarray, sizes: Optional[np.ndarray], world: int) -> np.ndarray:
        """:meth:`plan_costs` of checked host data: ``costs`` float64 ``[N]`` finite and >= 0,
        ``sizes`` float64 token counts (>= 0) when ``max_tokens_per_rank`` is set, else None."""
        if isinstance(world, bool) or int(world) != world or int(world) < 1:
            raise ValueError(f"world: must be an integer >= 1, got {world!r}")
        world = int(world)
        tokens = self.max_tokens_per_rank
        bins = _plan_checked(costs, world, self.max_per_rank, sizes if tokens is not None else None, tokens,
                             True, None, 1e-4)
        if not self.allow_empty:
            empty = sorted(set(range(world)) - set(bins.tolist()))
            if empty:
                raise ValueError(
                    f"allow_empty: the global batch has {costs.shape[0]} sequences for {world} ranks, so "
                    f"ranks {empty[:8]} would get none (allow_empty=True gives them an empty batch)")
        return bins
