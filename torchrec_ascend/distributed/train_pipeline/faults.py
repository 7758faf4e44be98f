"""Fault handling of the train pipelines: a dead peer is an error, a hung step a timed exit.

* A collective that fails because a peer rank died (gloo: "Connection closed by peer", HCCL /
  NCCL: their DistBackendError) surfaces from ``progress()`` as :class:`PeerFailureError`, naming
  the rank, the step and the stage it was in.
* :class:`StepWatchdog` bounds a step's wall time: when a step runs longer than
  ``step_timeout_s`` (a peer hangs, or died without closing its sockets) it prints a one-line
  error to stderr and ends the process with :data:`WATCHDOG_EXIT_CODE` — a rank blocked inside a
  collective cannot be interrupted from Python, so exiting is the only way not to hang.
  ``"auto"`` adapts the limit to the steps seen: :data:`AUTO_FIRST_S` until
  :data:`AUTO_WARMUP` steps were timed, then the larger of :data:`AUTO_MIN_S` and
  :data:`AUTO_FACTOR` times the slowest of the last :data:`AUTO_WINDOW` steps.  The other
  collective phases of a run (an evaluation, a checkpoint) are watched too, with the larger of
  :data:`AUTO_FIRST_S` and the step limit, and do not feed ``"auto"``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
import time
from typing import Iterator, Optional, Union

import torch.distributed as dist

__all__ = ["PeerFailureError", "StepWatchdog", "WATCHDOG_EXIT_CODE", "is_peer_failure",
           "AUTO_FIRST_S", "AUTO_MIN_S", "AUTO_FACTOR", "AUTO_WINDOW", "AUTO_WARMUP"]

WATCHDOG_EXIT_CODE = 75
AUTO_FIRST_S = 600.0  # "auto": the limit of the first steps (start-up, lazy initialisation)
AUTO_WARMUP = 3  # "auto": steps timed before the adaptive limit applies
AUTO_MIN_S = 30.0  # "auto": the adaptive limit is never below this
AUTO_FACTOR = 20.0  # "auto": ... and at least this many times the slowest recent step
AUTO_WINDOW = 50  # "auto": the recent steps

_PEER_SIGNS = ("connection closed by peer", "connection reset by peer", "broken pipe",
               "connection refused", "timed out", "timeout", "socket closed", "pair.cc")


class PeerFailureError(RuntimeError):
    """A collective failed because another rank died or left."""

    @classmethod
    def of(cls, exc: BaseException, where: str) -> "PeerFailureError":
        """The error for ``exc`` (a lost peer, :func:`is_peer_failure`) at ``where`` (e.g.
        ``"rank 0: step 5"``), in the one wording every caller uses."""
        return cls(f"{where}: a collective failed, a peer rank died or left "
                   f"({type(exc).__name__}: {exc})")


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective failing on a lost peer (DistError or gloo's transport
    errors)."""
    if isinstance(exc, PeerFailureError):
        return False
    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(s in text for s in _PEER_SIGNS)


class StepWatchdog:
    """Ends the process when one step runs longer than its limit: ``timeout_s`` seconds, None
    (never), or ``"auto"`` (module docstring).  :meth:`watch` nests: an inner block (the
    pipeline's step) inside an outer one (the trainer's step with its loss all-reduce) keeps the
    outer deadline when it ends."""

    def __init__(self, timeout_s: Union[float, str, None]) -> None:
        if timeout_s != "auto" and timeout_s is not None and not (
                isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"step_timeout_s={timeout_s!r}: must be > 0 seconds, 'auto' or None")
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._deadline: Optional[float] = None
        self._limit = 0.0
        self._what = ""
        self._depth = 0
        self._recent: collections.deque = collections.deque(maxlen=AUTO_WINDOW)
        self._timed = 0
        self._thread: Optional[threading.Thread] = None

    def limit(self, step: bool = True) -> Optional[float]:
        """The limit (seconds) of the next step (``step=False``: of an evaluation or a
        checkpoint, at least :data:`AUTO_FIRST_S`)."""
        if self.timeout_s is None:
            return None
        if self.timeout_s != "auto":
            limit = float(self.timeout_s)
        elif self._timed < AUTO_WARMUP:
            limit = AUTO_FIRST_S
        else:
            limit = max(AUTO_MIN_S, AUTO_FACTOR * max(self._recent))
        return limit if step else max(limit, AUTO_FIRST_S)

    def _run(self) -> None:
        while True:
            time.sleep(0.05)
            with self._lock:
                late = self._deadline is not None and time.monotonic() > self._deadline
                what, limit = self._what, self._limit
            if late:
                within = (f"step_timeout_s=auto ({limit:.0f} s)" if self.timeout_s == "auto"
                          else f"step_timeout_s={self.timeout_s} s")
                sys.stderr.write(
                    f"error: rank {_rank()}: {what} did not finish within {within}: a peer "
                    f"rank died or hangs; exiting with code {WATCHDOG_EXIT_CODE}\n")
                sys.stderr.flush()
                os._exit(WATCHDOG_EXIT_CODE)

    @contextlib.contextmanager
    def watch(self, what: str, step: bool = True) -> Iterator[None]:
        """Arm the watchdog for the block (described as ``what`` in the error); the outermost
        block's time feeds ``"auto"`` when it is a step (``step=False``: an evaluation or a
        checkpoint, :meth:`limit`)."""
        if self.timeout_s is None:
            yield
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tra-step-watchdog",
                                            daemon=True)
            self._thread.start()
        tic = time.monotonic()
        with self._lock:
            outer = self._depth > 0
            self._depth += 1
            if not outer:
                self._limit = self.limit(step)  # type: ignore[assignment]
                self._deadline = tic + self._limit
                self._what = what
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._deadline = None
                    if step:
                        self._recent.append(time.monotonic() - tic)
                        self._timed += 1
