"""Side-by-side timing on ``torch.utils.benchmark``: every contender warmed up and timed the same
way, interleaved round by round (the machine's speed drifts within a run; alternating keeps the
ratio honest).

:func:`interleaved` runs ``rounds`` rounds; in each round every contender (in alternating order:
forward in even rounds, reversed in odd ones) is measured by
``torch.utils.benchmark.Timer.blocked_autorange`` (its own warm-up block, the current thread
count, the median of its blocks).  A contender's time is the median over rounds of those
medians, and :func:`ratio` is the median of the per-round ratios (two contenders measured next to
each other in the same round).
"""

from __future__ import annotations

import statistics
from typing import Callable, Dict, List, Mapping, Optional

import torch
from torch.utils import benchmark

__all__ = ["interleaved", "ratio"]


def interleaved(
    fns: Mapping[str, Callable[[], object]], rounds: int = 3, min_run_time: float = 0.2,
    warmup: int = 1, sync: Optional[Callable[[], None]] = None,
) -> Dict[str, Dict[str, object]]:
    """Time every ``fns[name]()`` side by side.

    Returns, per name: ``ms`` (median over rounds of each round's median, milliseconds),
    ``rounds_ms`` (each round's median), ``iqr_ms`` (the last round's interquartile range).
    """
    if rounds < 1:
        raise ValueError(f"rounds: must be >= 1, got {rounds}")
    names = list(fns)
    for name in names:  # first calls (allocator, oneDNN primitive creation, lazy init)
        for _ in range(warmup):
            fns[name]()
        if sync:
            sync()
    per_round: Dict[str, List[float]] = {n: [] for n in names}
    iqr: Dict[str, float] = {}
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            fn = fns[name]
            stmt = "fn(); sync()" if sync else "fn()"
            timer = benchmark.Timer(stmt=stmt, globals={"fn": fn, "sync": sync},
                                    num_threads=torch.get_num_threads(), label=name)
            m = timer.blocked_autorange(min_run_time=min_run_time)
            per_round[name].append(m.median * 1e3)
            iqr[name] = m.iqr * 1e3
    return {n: {"ms": statistics.median(per_round[n]), "rounds_ms": per_round[n], "iqr_ms": iqr[n]}
            for n in names}


def ratio(times: Mapping[str, Mapping[str, object]], num: str, den: str) -> float:
    """Median over rounds of ``time[num] / time[den]`` (each ratio from one round)."""
    a, b = times[num]["rounds_ms"], times[den]["rounds_ms"]
    return statistics.median(x / y for x, y in zip(a, b))
