"""What a training run prints: messages a user can act on, one progress bar, nothing else.

:class:`Console` prints on rank 0 only; while its ``tqdm`` bar is open every message goes
through ``tqdm.write`` (so a message and the bar never share a line).  :func:`quiet_notices`
drops the notices of dependencies that no user can act on during a run (torch's
``is_fx_tracing`` notice, logged when TorchRec builds a ``KeyedJaggedTensor``).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Callable, Iterator, Optional

__all__ = ["Console", "quiet_notices"]

_NOTICES = (("torch.fx._symbolic_trace", "is_fx_tracing will return true"),)


class _DropNotice(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


@contextlib.contextmanager
def quiet_notices() -> Iterator[None]:
    """Inside: the notices of :data:`_NOTICES` are dropped (their loggers get a filter, removed
    on exit)."""
    added = []
    for name, text in _NOTICES:
        f = _DropNotice(text)
        logging.getLogger(name).addFilter(f)
        added.append((name, f))
    try:
        yield
    finally:
        for name, f in added:
            logging.getLogger(name).removeFilter(f)


class Console:
    """Rank 0's messages and progress bar.  ``write``: where a message goes when no bar is
    open (default ``print``)."""

    def __init__(self, enabled: bool = True, write: Callable[[str], None] = print) -> None:
        self.enabled, self._write = enabled, write
        self._bar = None

    def say(self, msg: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(msg)
        else:
            self._write(msg)

    def open_bar(self, desc: str, total: int, initial: int, show: bool) -> None:
        """A tqdm bar on stderr (``show`` False or another rank: none)."""
        if self.enabled and show:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, mininterval=1.0,
                             dynamic_ncols=True, file=sys.stderr)

    def advance(self, loss: Optional[float] = None) -> None:
        if self._bar is not None:
            self._bar.update(1)
            if loss is not None:
                self._bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

    def close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
