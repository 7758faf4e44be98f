"""Which backend runs an op: the preference rule and forcing, as pure functions of what is
installed (:class:`Installed`) and what is forced (the :class:`Force` stack of ``use_backend()``,
then ``$TORCHREC_ASCEND_BACKEND``).

Preference (first available wins)::

    fbgemm (native, cpu/cuda) > fbgemm_ascend (npu) > triton (cuda, npu) > cpu_kernel (csrc) > reference

A backend with a :class:`~.spec.Limit` serves only the calls its ``accepts`` predicate admits;
:func:`serving_backend` hands any other call to the next available backend that covers it.
Nothing here holds state: the registry's state object feeds these functions and caches their
answers.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

from .environment import DEVICE_KEYS, ENV_BACKEND
from .spec import BACKENDS, OpSpec

__all__ = ["Installed", "Force", "candidates", "decide", "serving_backend"]


@dataclasses.dataclass(frozen=True)
class Installed:
    """What can serve one op on one device here.

    Attributes:
        fbgemm_keys: dispatch keys fbgemm itself has a kernel for (``"CPU"``, ``"CUDA"``,
            ``"PrivateUse1"``: fbgemm-ascend's), recorded before we registered anything.
        fbgemm_cpu_replaced: fbgemm's CPU kernel is currently replaced by ours
            (``use_backend(..., replace_fbgemm=True)``), so it cannot be chosen.
        triton: Triton runs for this device.
        cpu_kernel: the csrc extension loaded and has this op's function.
        direct: that csrc function becomes the dispatcher's CPU kernel itself while it is the
            choice (csrc/direct.h).
    """

    fbgemm_keys: frozenset = frozenset()
    fbgemm_cpu_replaced: bool = False
    triton: bool = False
    cpu_kernel: bool = False
    direct: bool = False


@dataclasses.dataclass(frozen=True)
class Force:
    """One forcing: ``backend`` for ``ops`` (None: all) on ``devices`` (None: all)."""

    backend: str
    ops: Optional[frozenset]
    devices: Optional[frozenset]


def _with_limit(s: OpSpec, backend: str, why: str) -> str:
    lim = s.limits.get(backend)
    return why if lim is None else f"{why}; covers {lim.covers}, other calls go to the next backend"


def candidates(s: OpSpec, device: str, inst: Installed) -> List[Tuple[str, str]]:
    """Backends that can run op ``s`` on ``device`` given ``inst``, in preference order, each
    with the reason (the last one is always ``reference``)."""
    key = DEVICE_KEYS[device]
    out: List[Tuple[str, str]] = []
    if s.fbgemm and device in ("cpu", "cuda") and key in inst.fbgemm_keys:
        if not (device == "cpu" and inst.fbgemm_cpu_replaced):
            out.append(("fbgemm", f"fbgemm_gpu has a {key} kernel"))
    if s.fbgemm and device == "npu" and key in inst.fbgemm_keys:
        out.append(("fbgemm_ascend", "fbgemm-ascend has a PrivateUse1 kernel"))
    if s.triton is not None and inst.triton:
        why = "triton kernel" + (" (TRITON_INTERPRET=1)" if device == "cpu" else "")
        out.append(("triton", _with_limit(s, "triton", why)))
    if device == "cpu" and s.cpu_kernel is not None and inst.cpu_kernel:
        direct = " (direct dispatcher kernel)" if inst.direct else ""
        out.append(("cpu_kernel", _with_limit(s, "cpu_kernel",
                                              f"csrc kernel _C.{s.cpu_kernel}{direct}")))
    out.append(("reference", "torch-composite reference"))
    return out


def _env_force(name: str, raw: str) -> Optional[str]:
    if "=" not in raw:
        return raw
    for item in raw.split(","):
        op, _, backend = item.partition("=")
        if op.strip() == name:
            return backend.strip()
    return None


def decide(name: str, device: str, avail: Sequence[Tuple[str, str]], forces: Sequence[Force],
           env: str) -> Tuple[str, str]:
    """(backend, why) for op ``name`` on ``device`` among ``avail`` (its :func:`candidates`): the
    innermost force that covers it, else ``env`` (the value of $TORCHREC_ASCEND_BACKEND), else
    the first available.  A force that names ops is strict (RuntimeError where its backend cannot
    run the op); a force of every op falls back by the preference and says so."""
    names = [b for b, _ in avail]
    for f in reversed(forces):
        if (f.ops is None or name in f.ops) and (f.devices is None or device in f.devices):
            forced, origin, strict = f.backend, "use_backend()", f.ops is not None
            break
    else:
        env = env.strip()
        forced = _env_force(name, env) if env else None
        origin, strict = f"${ENV_BACKEND}", "=" in env
    if forced is None:
        return avail[0]
    if forced not in BACKENDS:
        raise ValueError(f"{origin}: backend {forced!r} is not one of {', '.join(BACKENDS)}")
    if forced in names:
        why = dict(avail)[forced]
        return forced, f"forced by {origin}" + (f"; {why.split('; ', 1)[1]}" if "; " in why else "")
    if strict:
        raise RuntimeError(f"{origin} forces backend {forced!r} for op {name!r} on {device}, "
                           f"but only {names} can run it there")
    backend, why = avail[0]
    return backend, f"{why} ({forced!r} forced by {origin} is unavailable for this op)"


def serving_backend(s: OpSpec, names: Sequence[str], backend: str, args: Sequence[object]) -> str:
    """The backend that serves a call with ``args``: ``backend`` (the choice), unless its
    :class:`~.spec.Limit` does not accept ``args``; then the next of ``names`` (the available
    backends in preference order) that does."""
    lim = s.limits.get(backend)
    if lim is None or lim.accepts(*args):
        return backend
    for b in names[names.index(backend) + 1:]:
        other = s.limits.get(b)
        if other is None or other.accepts(*args):
            return b
    return "reference"
