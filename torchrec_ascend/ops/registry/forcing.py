"""Forcing a backend: the :func:`use_backend` context manager."""

from __future__ import annotations

import contextlib
from typing import Iterator, List, Optional, Sequence

from . import choice, dispatch, environment
from .spec import BACKENDS, DEVICES, SPECS

__all__ = ["use_backend", "replaced_fbgemm_ops"]


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
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: must be one of {', '.join(BACKENDS)}")
    if ops is not None:
        unknown = [o for o in ops if o not in SPECS]
        if unknown:
            raise ValueError(f"ops: unknown op(s) {unknown}; registered: {sorted(SPECS)}")
    if device is not None and device not in DEVICES:
        raise ValueError(f"device={device!r}: must be one of {', '.join(DEVICES)}")
    if replace_fbgemm and backend == "fbgemm":
        raise ValueError("replace_fbgemm=True needs a backend other than 'fbgemm'")
    force = choice.Force(backend, frozenset(ops) if ops is not None else None,
                         frozenset([device]) if device is not None else None)
    lib = None
    replaced: List[str] = []
    with choice.LOCK:
        choice.FORCE_STACK.append(force)
        if replace_fbgemm and device in (None, "cpu"):
            targets = ops if ops is not None else list(SPECS)
            replaced = [op for op in targets
                        if SPECS[op].fbgemm and "CPU" in environment.NATIVE_KEYS.get(op, ())
                        and op not in choice.REPLACED_CPU]
            lib = dispatch.replace_fbgemm_cpu(replaced)
            choice.REPLACED_CPU.update(replaced)
        choice.forcing_changed()
        dispatch.sync_direct()
    try:
        yield
    finally:
        with choice.LOCK:
            if lib is not None:
                lib._destroy()  # the dispatcher falls back to fbgemm's kernel
            choice.REPLACED_CPU.difference_update(replaced)
            choice.FORCE_STACK.remove(force)
            choice.forcing_changed()
            dispatch.sync_direct()


def replaced_fbgemm_ops() -> List[str]:
    """fbgemm ops whose CPU kernel is ours right now (inside ``use_backend(replace_fbgemm=True)``)."""
    return sorted(choice.REPLACED_CPU)
