"""Asynchronous negative prefetch: sampling + lookup (+ host-to-device copy) of batch i+1 while
batch i trains.

On cpu the work runs on one background worker thread (torch ops release the GIL).  On npu/cuda
the same thread additionally issues the host-to-device copy and the lookup on a **side stream**
(``torchrec_ascend.device.new_stream``) and records an event; :meth:`get` makes the training
stream wait on that event and ``record_stream``-s the tensors, so the copy overlaps compute.

Determinism: step ``i`` draws from its own generator seeded by ``(seed, i)``, so the negatives
of a step do not depend on thread timing; ``asynchronous=False`` runs the identical work inline
(the reference the tests compare against).

Lookups and trainable tables: ``lookup_fn`` runs in the worker while the previous step trains.
If the table it reads is updated in place by that step's optimizer, the values read are the
table's state at some point during the previous step (at most one step stale: the staleness of
semi-synchronous pipelines); gradients still flow to the table through the returned tensor.
For bit-exact freshness pass ``lookup_in_background=False`` (ids are still sampled and copied
in the background; the lookup happens in :meth:`get`, on the caller's thread and stream).

Errors: an exception raised by the sampler or ``lookup_fn`` is re-raised, unchanged, by the
:meth:`get` of that step; afterwards the prefetcher is closed.  :meth:`close` (or leaving the
``with`` block) cancels queued work and joins the worker.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
from dataclasses import dataclass
from typing import (Callable, Deque, Iterable, Iterator, Optional, Tuple, TypeVar, Union)

import torch

from .. import device as _device
from .samplers import NegativeSample, NegativeSampler, check_count

__all__ = ["PrefetchedNegatives", "AsyncNegativePrefetcher", "step_generator"]

B = TypeVar("B")
LookupFn = Callable[[torch.Tensor], torch.Tensor]

_GOLDEN = 0x9E3779B97F4A7C15
_MASK63 = (1 << 63) - 1


def step_generator(seed: int, step: int) -> torch.Generator:
    """The CPU generator of one step: a fixed function of ``(seed, step)``."""
    return torch.Generator().manual_seed(((seed * _GOLDEN) ^ (step + 1) * 0xBF58476D1CE4E5B9) & _MASK63)


@dataclass
class PrefetchedNegatives:
    """One step's negatives.

    Attributes:
        step: the step index (``start_step``, ``start_step + 1``, ... in submission order).
        negatives: the shared pool (ids ``[R]``) on the target device; None when the
            prefetcher samples per-token negatives only (``num_negatives=0``).
        neg_emb: ``lookup_fn(negatives.ids)`` (``[R, D]``), or None without ``lookup_fn``.
        extra_negatives: per-token negatives (ids ``[T, K]``) when ``per_token_negatives > 0``.
        extra_neg_emb: ``lookup_fn`` of those ids (``[T, K, D]``), or None.
    """

    step: int
    negatives: Optional[NegativeSample]
    neg_emb: Optional[torch.Tensor] = None
    extra_negatives: Optional[NegativeSample] = None
    extra_neg_emb: Optional[torch.Tensor] = None


class AsyncNegativePrefetcher:
    """Runs a sampler (and optionally the negative embedding lookup) one step ahead.

    Args:
        sampler: any :class:`~torchrec_ascend.sampling.samplers.NegativeSampler`.
        num_negatives: R, size of the shared pool per step (0: no shared pool, only
            per-token negatives; then ``per_token_negatives`` must be >= 1).
        lookup_fn: ``ids -> embeddings`` (e.g. ``lambda ids: item_emb(ids)``); None: ids only.
        per_token_negatives: K extra per-token negatives per token (0: none).
        seed: base seed; step i uses :func:`step_generator` ``(seed, i)``.
        device: where the ids (and lookups) go; default ``torchrec_ascend.device.default_device()``.
        asynchronous: False runs the work inline in :meth:`submit` (same results).
        lookup_in_background: run ``lookup_fn`` with the sampling (default: in the worker, one
            step ahead) or in :meth:`get` on the caller's thread (fresh table values).
        max_pending: how many steps may be submitted and not yet fetched (>= 1).
        start_step: index of the first submitted step (a resumed run continues the sequence).

    Use::

        with AsyncNegativePrefetcher(sampler, num_negatives=4096, lookup_fn=emb, seed=0) as pf:
            for batch, neg in pf.prefetch(loader, lambda b: b["target_ids"]):
                loss = loss_fn(q, pos_ids, pos_emb, neg.negatives, neg.neg_emb)
    """

    def __init__(self, sampler: NegativeSampler, num_negatives: int,
                 lookup_fn: Optional[LookupFn] = None, per_token_negatives: int = 0,
                 seed: int = 0, device: Union[str, torch.device, None] = None,
                 asynchronous: bool = True, lookup_in_background: bool = True,
                 max_pending: int = 2, start_step: int = 0) -> None:
        if not isinstance(sampler, NegativeSampler):
            raise ValueError(f"sampler: expected a NegativeSampler, got {type(sampler).__name__}")
        self.sampler = sampler
        if per_token_negatives < 0:
            raise ValueError(f"per_token_negatives: must be >= 0, got {per_token_negatives}")
        if type(num_negatives) is int and num_negatives == 0:
            if not per_token_negatives:
                raise ValueError("num_negatives: 0 (no shared pool) needs per_token_negatives "
                                 ">= 1, got 0")
            self.num_negatives = 0  # per-token negatives only
        else:
            self.num_negatives = check_count("num_negatives", num_negatives)
        self.per_token_negatives = per_token_negatives
        self.max_pending = check_count("max_pending", max_pending)
        self.lookup_fn = lookup_fn
        self.seed = int(seed)
        self.device = torch.device(device) if device is not None else _device.default_device()
        self.asynchronous = asynchronous
        self.lookup_in_background = lookup_in_background
        self._stream = _device.new_stream(self.device) if asynchronous else None
        self._pool: Optional[cf.ThreadPoolExecutor] = (
            cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="negative-prefetch")
            if asynchronous else None)
        self._pending: Deque[Tuple[int, "cf.Future[Tuple[PrefetchedNegatives, object]]"]] = collections.deque()
        if isinstance(start_step, bool) or int(start_step) != start_step or start_step < 0:
            raise ValueError(f"start_step: must be an integer >= 0, got {start_step!r}")
        self._next_step = int(start_step)
        self._closed = False

    # -- work --------------------------------------------------------------------------------
    def _work(self, step: int, pos_ids: torch.Tensor) -> Tuple[PrefetchedNegatives, object]:
        gen = step_generator(self.seed, step)
        host_ids = pos_ids.cpu()
        neg = (self.sampler.sample(host_ids, self.num_negatives, gen)
               if self.num_negatives else None)
        extra = (self.sampler.sample_per_token(host_ids, self.per_token_negatives, gen)
                 if self.per_token_negatives else None)
        on_host = self.device.type == "cpu"
        if not on_host and self._stream is not None:
            neg = neg.pin_memory() if neg is not None else None
            extra = extra.pin_memory() if extra is not None else None
        with _device.stream_context(self._stream):
            neg = neg.to(self.device, non_blocking=not on_host) if neg is not None else None
            extra = extra.to(self.device, non_blocking=not on_host) if extra is not None else None
            out = PrefetchedNegatives(step, neg, extra_negatives=extra)
            if self.lookup_fn is not None and self.lookup_in_background:
                self._lookup(out)
            event = _device.new_event(self.device)
            if event is not None:
                event.record(self._stream)
        return out, event

    def _lookup(self, out: PrefetchedNegatives) -> None:
        assert self.lookup_fn is not None
        if out.negatives is not None:
            out.neg_emb = self.lookup_fn(out.negatives.ids)
        if out.extra_negatives is not None:
            out.extra_neg_emb = self.lookup_fn(out.extra_negatives.ids)

    # -- API ---------------------------------------------------------------------------------
    def submit(self, pos_ids: torch.Tensor) -> int:
        """Queue the negatives of the next step (for these positive ids); returns its index."""
        if self._closed:
            raise RuntimeError("AsyncNegativePrefetcher: submit() after close()")
        if len(self._pending) >= self.max_pending:
            raise RuntimeError(f"AsyncNegativePrefetcher: {len(self._pending)} steps pending "
                               f"(max_pending={self.max_pending}); call get() first")
        step = self._next_step
        self._next_step += 1
        if self._pool is None:
            fut: cf.Future = cf.Future()
            try:
                fut.set_result(self._work(step, pos_ids))
            except BaseException as exc:  # surfaces in get(), like the async path
                fut.set_exception(exc)
        else:
            fut = self._pool.submit(self._work, step, pos_ids)
        self._pending.append((step, fut))
        return step

    def get(self) -> PrefetchedNegatives:
        """The oldest submitted step's negatives (waits for them); re-raises a worker error."""
        if not self._pending:
            raise RuntimeError("AsyncNegativePrefetcher: get() with nothing submitted")
        _, fut = self._pending.popleft()
        try:
            out, event = fut.result()
        except BaseException:
            self.close()
            raise
        if event is not None:
            cur = _device.current_stream(self.device)
            event.wait(cur)
            for t in (out.neg_emb, out.extra_neg_emb):
                if t is not None:
                    _device.record_stream(t, cur)
            for s in (out.negatives, out.extra_negatives):
                if s is not None:
                    for t in (s.ids, s.log_q, s.pos_log_q):
                        _device.record_stream(t, cur)
        if self.lookup_fn is not None and not self.lookup_in_background:
            self._lookup(out)
        return out

    def prefetch(self, batches: Iterable[B],
                 pos_ids_fn: Callable[[B], torch.Tensor]) -> Iterator[Tuple[B, PrefetchedNegatives]]:
        """Yield ``(batch, negatives)``; the next batch's negatives are prepared meanwhile."""
        it = iter(batches)
        try:
            cur = next(it)
        except StopIteration:
            return
        self.submit(pos_ids_fn(cur))
        while True:
            # fetch step i first (its work ran during step i-1), then queue step i+1: the worker
            # starts it while step i trains, and waking it does not delay this get()
            out = self.get()
            try:
                nxt = next(it)
                self.submit(pos_ids_fn(nxt))
                more = True
            except StopIteration:
                more = False
            yield cur, out
            if not more:
                return
            cur = nxt

    def close(self) -> None:
        """Cancel queued steps and join the worker (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "AsyncNegativePrefetcher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # best effort: never leave a worker thread behind
        try:
            self.close()
        except Exception:
            pass
