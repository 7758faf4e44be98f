"""Batch copy on a thread of its own: ``next(iterator)`` and ``.to(device)`` ahead of use.

:class:`BatchPrefetcher` keeps up to ``depth`` batches ready.  On a device with streams the
copy runs on a side stream (``torchrec_ascend.device.new_stream``) and the thread waits for it
before handing the batch over, so the consumer may use it on any stream.  On cpu the copy is a
no-op for cpu batches and the thread's work is the iterator itself (reading, collating).
Exceptions of the iterator are re-raised in the consumer.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Iterator, Optional

import torch

from ... import device as _device
from .stages import StageTimer

__all__ = ["BatchPrefetcher"]

_END = object()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class BatchPrefetcher:
    """Reads ``iterator`` on a daemon thread, moving each batch to ``device``."""

    def __init__(self, iterator: Iterator[Any], device: torch.device, timer: StageTimer,
                 depth: int = 2) -> None:
        if depth < 1:
            raise ValueError(f"depth={depth}: must be >= 1")
        self.iterator = iterator
        self._device = device
        self._timer = timer
        self._queue: "queue.Queue[Any]" = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._count = 0
        self._thread = threading.Thread(target=self._run, name="tra-batch-copy", daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        stream = _device.new_stream(self._device) if _device.has_streams(self._device) else None
        try:
            while not self._stop.is_set():
                start = time.perf_counter()
                batch = next(self.iterator, _END)
                if batch is _END:
                    self._put(_END)
                    return
                with _device.stream_context(stream):
                    batch = batch.to(self._device, non_blocking=True)
                if stream is not None:
                    stream.synchronize()
                self._timer.add("batch_copy", -1, start, time.perf_counter())  # other thread
                if not self._put(batch):
                    return
        except BaseException as exc:  # handed to the consumer
            self._put(_Failure(exc))

    def next(self, step: int = -1) -> Optional[Any]:
        """The next batch on ``device``, or None when the iterator is exhausted."""
        if self._done:
            return None
        start = time.perf_counter()
        item = self._queue.get()
        self._timer.add("wait_batch", step, start, time.perf_counter())
        if item is _END:
            self._done = True
            return None
        if isinstance(item, _Failure):
            self._done = True
            raise item.exc
        self._count += 1
        return item

    def close(self) -> None:
        """Stop the thread (batches already read are dropped)."""
        self._stop.set()
