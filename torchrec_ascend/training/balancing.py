"""This rank's share of a step's global batch (``train.balance``), for any jagged batch.

Every rank computes the same global batch of a step (a pure function of the seed and the step),
then :class:`RankShare` says which of its rows this rank builds and, for ``all_to_all``, moves
the built rows between ranks:

* ``none``: the ``rank``-th contiguous ``per_rank`` rows;
* ``collator``: the rows the :class:`~torchrec_ascend.distributed.load_balance.CollatorBalancer`
  assigns to the rank by cost (no communication);
* ``all_to_all``: the contiguous rows, then one all_to_all of the
  :class:`~torchrec_ascend.distributed.load_balance.AllToAllBalancer` (a collective, on
  ``group``: give the balancer a process group of its own when batches are built on another
  thread than the pipeline's collectives), timed.

:func:`stream_ahead` runs a batch factory one step ahead on a worker thread; :class:`BuildAhead`
is a batch source's switch between that and building in line (``balance_ahead``).
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Optional, TypeVar

import numpy as np
import torch

from ..distributed.load_balance import BalanceMode, build_balancer, check_balance_options
from ..options import OptionError

__all__ = ["RankShare", "Exchanged", "stream_ahead", "BuildAhead"]

T = TypeVar("T")


@dataclass
class Exchanged:
    """A rank's rows after :meth:`RankShare.exchange`: lengths, per-token and per-row fields,
    and, for ``all_to_all``, the balancer's record (``balanced``) and the call's wall / thread
    CPU seconds."""

    lengths: torch.Tensor
    token_fields: Dict[str, torch.Tensor]
    sample_fields: Dict[str, torch.Tensor]
    num_targets: Optional[torch.Tensor] = None
    balanced: Optional[object] = None
    seconds: Optional[float] = None
    cpu_seconds: Optional[float] = None


class RankShare:
    """Which rows of a global batch this rank builds, and the all_to_all that evens the cost.

    Args:
        mode: ``train.balance``.  cost_model: the balancer's (required unless ``none``).
        rank / world / per_rank: this process, the ranks, rows per rank in the global batch.
        group: the process group of the ``all_to_all`` exchange (None: the default group).
    """

    def __init__(self, mode: BalanceMode, cost_model: Optional[object], rank: int, world: int,
                 per_rank: int, group: Optional[object] = None) -> None:
        check_balance_options(mode, False)
        self.mode, self.rank, self.world, self.per_rank = mode, int(rank), int(world), int(per_rank)
        self.balancer = build_balancer(mode, cost_model)  # type: ignore[arg-type]
        self.group = group

    def rows(self, lengths: np.ndarray, num_targets: Optional[np.ndarray] = None) -> np.ndarray:
        """Rows of the global batch (its per-row cost ``lengths``) this rank builds."""
        if self.mode == "collator":
            nt = torch.from_numpy(num_targets) if num_targets is not None else None
            return self.balancer.select(torch.from_numpy(lengths), self.rank,  # type: ignore
                                        self.world, num_targets=nt).numpy()
        return np.arange(self.rank * self.per_rank, (self.rank + 1) * self.per_rank)

    def exchange(self, lengths: torch.Tensor, token_fields: Dict[str, torch.Tensor],
                 sample_fields: Dict[str, torch.Tensor],
                 num_targets: Optional[torch.Tensor] = None) -> Exchanged:
        """The rows this rank trains on: the built ones (``none`` / ``collator``), or after the
        ``all_to_all`` balancer moved them (collective).  ``num_targets`` (per row) counts in
        the balancer's cost and travels with the rows."""
        if self.mode != "all_to_all":
            return Exchanged(lengths, token_fields, sample_fields, num_targets)
        tic, tic_cpu = time.perf_counter(), time.thread_time()
        bb = self.balancer.balance(lengths, token_fields, sample_fields,  # type: ignore[union-attr]
                                   group=self.group, num_targets=num_targets)
        return Exchanged(bb.lengths, bb.token_fields, bb.sample_fields, bb.num_targets, bb,
                         time.perf_counter() - tic, time.thread_time() - tic_cpu)


def stream_ahead(build_next: Callable[[], T], count: int, worker: cf.ThreadPoolExecutor,
                 on_wait: Callable[[float], None]) -> Iterator[T]:
    """``count`` results of ``build_next()``, each built on ``worker`` while the caller uses the
    previous one (``on_wait(seconds)`` reports how long the caller waited for each); a build in
    flight when the caller stops finishes first (its collectives pair with the peers')."""
    fut = worker.submit(build_next) if count > 0 else None
    try:
        for i in range(count):
            tic = time.perf_counter()
            item = fut.result()  # type: ignore[union-attr]
            on_wait(time.perf_counter() - tic)
            fut = worker.submit(build_next) if i + 1 < count else None
            yield item
    finally:
        if fut is not None and not fut.cancel():
            fut.result()


class BuildAhead:
    """A batch source's choice of building in line or one step ahead (``balance_ahead``).

    ``enabled`` (an attribute, read when :meth:`run` starts; ``all_to_all`` balancing only)
    runs the builds on one worker thread through :func:`stream_ahead`; ``last_wait_s`` is how
    long the caller waited for the batch delivered last (None when building in line).
    """

    def __init__(self, share: RankShare, enabled: bool) -> None:
        if enabled and share.mode != "all_to_all":
            raise OptionError("balance_ahead", f"needs balance='all_to_all', got {share.mode!r}")
        self.enabled = bool(enabled)
        self.last_wait_s: Optional[float] = None
        self._worker: Optional[cf.ThreadPoolExecutor] = None

    def run(self, build_next: Callable[[], T], count: int) -> Iterator[T]:
        """``count`` results of ``build_next()``, in line or one ahead on the worker."""
        if not self.enabled:
            for _ in range(count):
                yield build_next()
            return
        if self._worker is None:
            self._worker = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-ahead")

        def waited(seconds: float) -> None:
            self.last_wait_s = seconds

        yield from stream_ahead(build_next, count, self._worker, waited)

    def close(self) -> None:
        """Stop the worker thread (a later :meth:`run` starts another)."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
