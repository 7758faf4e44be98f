"""Fault handling of the train pipelines: a dead peer is an error, a hung step a timed exit.

* A collective that fails because a peer rank died (gloo: "Connection closed by peer", HCCL /
  NCCL: their DistBackendError) surfaces from ``progress()`` as :class:`PeerFailureError`, naming
  the rank, the step and the stage it was in.
* :class:`StepWatchdog` bounds a step's wall time: when a step runs longer than
  ``step_timeout_s`` (a peer hangs, or died without closing its sockets) it prints a clear
  error to stderr and ends the process with :data:`WATCHDOG_EXIT_CODE` — a rank blocked inside a
  collective cannot be interrupted from Python, so exiting is the only way not to hang.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Iterator, Optional

import torch.distributed as dist

__all__ = ["PeerFailureError", "StepWatchdog", "WATCHDOG_EXIT_CODE", "is_peer_failure"]

WATCHDOG_EXIT_CODE = 75

_PEER_SIGNS = ("connection closed by peer", "connection reset by peer", "broken pipe",
               "connection refused", "timed out", "timeout", "socket closed", "pair.cc")


class PeerFailureError(RuntimeError):
    """A collective of a pipeline step failed because another rank died or left."""


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
    """Ends the process when one step runs longer than ``timeout_s`` (None: never)."""

    def __init__(self, timeout_s: Optional[float]) -> None:
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"step_timeout_s={timeout_s!r}: must be > 0 seconds or None")
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._deadline: Optional[float] = None
        self._what = ""
        self._thread: Optional[threading.Thread] = None

    def _run(self) -> None:
        while True:
            time.sleep(min(0.05, self.timeout_s / 10))
            with self._lock:
                late = self._deadline is not None and time.monotonic() > self._deadline
                what = self._what
            if late:
                sys.stderr.write(
                    f"torchrec_ascend train pipeline: rank {_rank()}: {what} did not finish "
                    f"within step_timeout_s={self.timeout_s} s (a peer rank died or hangs); "
                    f"exiting with code {WATCHDOG_EXIT_CODE}\n")
                sys.stderr.flush()
                os._exit(WATCHDOG_EXIT_CODE)

    @contextlib.contextmanager
    def watch(self, what: str) -> Iterator[None]:
        """Arm the watchdog for the block (described as ``what`` in the error)."""
        if self.timeout_s is None:
            yield
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tra-step-watchdog",
                                            daemon=True)
            self._thread.start()
        with self._lock:
            self._deadline = time.monotonic() + self.timeout_s
            self._what = what
        try:
            yield
        finally:
            with self._lock:
                self._deadline = None
