"""Per-stage wall time of a train pipeline: spans, per-step records, compute-busy fraction.

A pipeline wraps each piece of its work in ``with timer.stage(name):``; at the end of a step
``timer.end_step()`` returns one plain dict the trainer can log (log.jsonl, TensorBoard)::

    {"step": int,                 # 0-based index of the batch whose optimizer step just ran
     "step_ms": float,            # wall time from begin_step (progress() entry) to end_step
     "stages_ms": {name: ms},     # summed wall time of each stage inside the step
     "busy_fraction": float}      # compute-stage time of the main thread / step_ms

Stages are classified once: :data:`COMPUTE_STAGES` are work the compute thread does (embedding
lookup, dense forward/backward, sparse (embedding) backward, optimizer); the others are waits
(input-dist and gradient-comm waits, waiting for a batch) or run on other threads (the batch
copy lane of the prefetch thread), so they do not count as busy.  On cpu the lookup stage
includes the local TBE kernel and the launch of the output all-to-all; collectives run on the
process group's own threads.  Spans (``(lane, stage, step, start_s, end_s)``) are kept for the
timeline picture (:mod:`.timeline`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from typing import Dict, Iterator, List, NamedTuple, Optional

__all__ = ["COMPUTE_STAGES", "STAGES", "Span", "StageTimer"]

# every stage a pipeline of this package reports, in pipeline order (timeline lanes)
STAGES = (
    "batch_copy",        # next(iterator) + .to(device) (prefetch thread in semi_async)
    "wait_batch",        # compute thread waiting for a copied batch
    "input_dist",        # KJT input all-to-all: launch + wait of splits and tensors
    "lookup",            # local embedding lookup + launch of the output all-to-all
    "dense_fwd",         # model forward (waits the output all-to-all of its batch)
    "dense_bwd",         # loss.backward()
    "grad_comm_wait",    # waiting for the dense gradient all-reduce
    "sparse_bwd",        # embedding backward: output-dist backward + fused sparse update
    "optimizer",         # dense optimizer step + zero_grad
)
COMPUTE_STAGES = frozenset({"lookup", "dense_fwd", "dense_bwd", "sparse_bwd", "optimizer"})


class Span(NamedTuple):
    """One timed piece of work: its lane (stage name), step, and start/end (perf_counter s)."""

    stage: str
    step: int
    start: float
    end: float


class StageTimer:
    """Collects spans from any thread; closes a step record on :meth:`end_step`.

    ``keep_spans`` bounds how many spans are kept for the timeline (the oldest are dropped);
    the per-step records are returned, not kept.
    """

    def __init__(self, keep_spans: int = 10_000) -> None:
        if keep_spans < 0:
            raise ValueError(f"keep_spans={keep_spans}: must be >= 0")
        self._lock = threading.Lock()
        self._keep = keep_spans
        self.spans: List[Span] = []
        self._step_ms: Dict[str, float] = defaultdict(float)
        self._step_start: Optional[float] = None
        self._main = threading.get_ident()
        self._busy_s = 0.0

    @contextlib.contextmanager
    def stage(self, name: str, step: int = -1) -> Iterator[None]:
        """Time the block as stage ``name`` of batch ``step`` (any thread)."""
        if name not in STAGES:
            raise ValueError(f"stage={name!r}: must be one of {', '.join(STAGES)}")
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, step, start, time.perf_counter())

    def add(self, name: str, step: int, start: float, end: float) -> None:
        """Record a span measured elsewhere (same clock: ``time.perf_counter``)."""
        on_main = threading.get_ident() == self._main
        with self._lock:
            if self._step_start is None:
                self._step_start = start
            self._step_ms[name] += (end - start) * 1e3
            if on_main and name in COMPUTE_STAGES:
                self._busy_s += end - start
            if self._keep:
                self.spans.append(Span(name, step, start, end))
                if len(self.spans) > self._keep:
                    del self.spans[: len(self.spans) - self._keep]

    def begin_step(self) -> None:
        """Start the wall clock of a step now (spans other threads recorded since the last
        step stay in its stage sums; the main thread's busy time restarts)."""
        with self._lock:
            self._step_start = time.perf_counter()
            self._busy_s = 0.0

    def end_step(self, step: int) -> dict:
        """Close the current step and return its record (see the module docstring)."""
        now = time.perf_counter()
        with self._lock:
            start = self._step_start if self._step_start is not None else now
            wall = max(now - start, 1e-12)
            record = {"step": int(step), "step_ms": wall * 1e3,
                      "stages_ms": {k: round(v, 4) for k, v in self._step_ms.items()},
                      "busy_fraction": min(self._busy_s / wall, 1.0)}
            self._step_ms = defaultdict(float)
            self._busy_s = 0.0
            self._step_start = None
        return record
