"""Forcing a backend: the :func:`use_backend` context manager."""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Sequence

from .choice import Force
from .spec import BACKENDS, DEVICES
from .state import STATE

__all__ = ["use_backend"]


@contextlib.contextmanager
def use_backend(
    backend: str,
    ops: Optional[Sequence[str]] = None,
    device: Optional[str] = None,
    replace_fbgemm: bool = False,
) -> Iterator[None]:
    """Force ``backend`` inside the block (innermost block first; then $TORCHREC_ASCEND_BACKEND).

    Args:
        backend: one of :data:`BACKENDS`.
        ops: restrict to these ops (then a backend that cannot run one of them at all is an
            error); ``None`` means every op, each falling back by the normal order where
            ``backend`` cannot run it.  Either way a call outside the forced backend's
            :class:`~.spec.Limit` goes to the next backend that covers it.
        device: restrict to one device type (``"cpu"``, ``"cuda"``, ``"npu"``).
        replace_fbgemm: also override fbgemm's own CPU kernels of these ops with ours, so code
            that calls ``torch.ops.fbgemm.<op>`` directly (TorchRec) runs our implementation.
            Only with a non-fbgemm backend.

    Entering and leaving the block rewrites the dispatcher's tables where the choice changes
    (csrc direct kernels registered or dropped, fbgemm's CPU kernels replaced or given back):
    put it around a workload, not around each call, and not while another thread runs the ops.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: must be one of {', '.join(BACKENDS)}")
    if ops is not None:
        registered = {s.name for s in STATE.all_specs()}
        unknown = [o for o in ops if o not in registered]
        if unknown:
            raise ValueError(f"ops: unknown op(s) {unknown}; registered: {sorted(registered)}")
    if device is not None and device not in DEVICES:
        raise ValueError(f"device={device!r}: must be one of {', '.join(DEVICES)}")
    if replace_fbgemm and backend == "fbgemm":
        raise ValueError("replace_fbgemm=True needs a backend other than 'fbgemm'")
    with STATE.forcing(Force(backend, frozenset(ops) if ops is not None else None,
                             frozenset([device]) if device is not None else None), replace_fbgemm):
        yield
