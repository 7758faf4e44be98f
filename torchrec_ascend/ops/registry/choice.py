"""Which backend runs an op: the preference rule, forcing, the per-call capability check, and
:func:`run` (what every dispatcher kernel of the registry calls).

Preference (first available wins; DESIGN.md)::

    fbgemm (native, cpu/cuda) > fbgemm_ascend (npu) > triton (cuda, npu) > cpu_kernel (csrc) > reference

:func:`candidates` is that rule as a pure function of an :class:`Installed` snapshot, so tests can
state the exact choice for every combination of installed backends; :func:`available_backends`
feeds it the live probes of :mod:`.environment`.  Forcing (a stack of :class:`Force` entries
pushed by :func:`.forcing.use_backend`, then ``$TORCHREC_ASCEND_BACKEND``) picks among the
available ones.  A backend with a :class:`~.spec.Limit` serves only the calls its ``accepts``
predicate admits; :func:`run` hands any other call to the next available backend that covers it.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Dict, List, Optional, Sequence, Tuple

from . import environment
from .spec import BACKENDS, Impl, OpSpec, spec

__all__ = ["ENV_BACKEND", "Installed", "Force", "candidates", "installed", "available_backends",
           "choose", "backend_for_call", "implementation", "run"]

ENV_BACKEND = "TORCHREC_ASCEND_BACKEND"

LOCK = threading.RLock()


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
        direct: that csrc function is the dispatcher's CPU kernel itself (csrc/direct.h).
    """

    fbgemm_keys: frozenset = frozenset()
    fbgemm_cpu_replaced: bool = False
    triton: bool = False
    cpu_kernel: bool = False
    direct: bool = False


def _with_limit(s: OpSpec, backend: str, why: str) -> str:
    lim = s.limits.get(backend)
    return why if lim is None else f"{why}; covers {lim.covers}, other calls go to the next backend"


def candidates(s: OpSpec, device: str, inst: Installed) -> List[Tuple[str, str]]:
    """Backends that can run op ``s`` on ``device`` given ``inst``, in preference order, each
    with the reason (the last one is always ``reference``)."""
    key = environment.DEVICE_KEYS[device]
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


# --------------------------------------------------------------------------- live state

REPLACED_CPU: set = set()
"""fbgemm ops whose CPU kernel we currently replace (maintained by :mod:`.forcing`)."""


@dataclasses.dataclass(frozen=True)
class Force:
    """One forcing: ``backend`` for ``ops`` (None: all) on ``devices`` (None: all)."""

    backend: str
    ops: Optional[frozenset]
    devices: Optional[frozenset]


FORCE_STACK: List[Force] = []
_GENERATION = [0]  # bumped on every change of the forcing state (use_backend enter / exit)
_CHOICES: Dict[tuple, Tuple[str, str]] = {}  # choose() cache, keyed by everything it reads


def forcing_changed() -> None:
    """Invalidate :func:`choose`'s cache (the forcing stack or the replaced set changed)."""
    _GENERATION[0] += 1


def _extension():
    from .. import extension

    return extension


def installed(name: str, device: str) -> Installed:
    """The live :class:`Installed` snapshot for op ``name`` on ``device``."""
    from . import dispatch

    s = spec(name)
    ext = _extension()
    return Installed(
        fbgemm_keys=environment.NATIVE_KEYS.get(name, frozenset()),
        fbgemm_cpu_replaced=name in REPLACED_CPU,
        triton=environment.triton_usable(device),
        cpu_kernel=s.cpu_kernel is not None and ext.kernel(s.cpu_kernel) is not None,
        direct=name in dispatch.DIRECT,
    )


def available_backends(name: str, device: str) -> List[Tuple[str, str]]:
    """Backends that can run ``name`` on ``device`` here, in preference order, with reasons."""
    return candidates(spec(name), device, installed(name, device))


def _env_force(name: str, raw: str) -> Optional[str]:
    raw = raw.strip()
    if not raw:
        return None
    if "=" not in raw:
        return raw
    for item in raw.split(","):
        op, _, backend = item.partition("=")
        if op.strip() == name:
            return backend.strip()
    return None


def choose(name: str, device: str) -> Tuple[str, str]:
    """(backend, why) for ``name`` on ``device`` under the current forcing (per op and device;
    a backend with a :class:`~.spec.Limit` may still pass a particular call on, see :func:`run`)."""
    from . import dispatch

    s = spec(name)
    env = os.environ.get(ENV_BACKEND, "")
    ext = _extension()
    ext_state = ext.load_state()
    if ext_state != dispatch.synced_extension_state():  # the extension loaded (or was swapped)
        dispatch.sync_direct()
    key = (name, device, env, os.environ.get("TRITON_INTERPRET", ""), _GENERATION[0], ext_state,
           s.triton is None, s.cpu_kernel, environment.triton_usable)  # (tests patch it)
    hit = _CHOICES.get(key)
    if hit is None:
        hit = choose_uncached(name, device, env)
        if len(_CHOICES) > 4096:
            _CHOICES.clear()
        _CHOICES[key] = hit
    return hit


def choose_uncached(name: str, device: str, env: str) -> Tuple[str, str]:
    """:func:`choose` without the cache, with ``env`` as the value of $TORCHREC_ASCEND_BACKEND."""
    avail = available_backends(name, device)
    names = [b for b, _ in avail]
    forced: Optional[str] = None
    origin = ""
    strict = False
    for f in reversed(FORCE_STACK):
        if (f.ops is None or name in f.ops) and (f.devices is None or device in f.devices):
            forced, origin = f.backend, "use_backend()"
            strict = f.ops is not None
            break
    else:
        forced = _env_force(name, env)
        origin = f"${ENV_BACKEND}"
        strict = forced is not None and "=" in env
    if forced is not None:
        if forced not in BACKENDS:
            raise ValueError(f"{origin}: backend {forced!r} is not one of {', '.join(BACKENDS)}")
        if forced in names:
            why = dict(avail)[forced]
            return forced, f"forced by {origin}" + (f"; {why.split('; ', 1)[1]}" if "; " in why else "")
        if strict:
            raise RuntimeError(
                f"{origin} forces backend {forced!r} for op {name!r} on {device}, "
                f"but only {names} can run it there"
            )
        backend, why = avail[0]
        return backend, f"{why} ({forced!r} forced by {origin} is unavailable for this op)"
    return avail[0]


def backend_for_call(name: str, device: str, args: Sequence[object]) -> str:
    """The backend that serves this call: :func:`choose`'s, unless its :class:`~.spec.Limit`
    does not accept ``args``; then the next available backend (in preference order) that does."""
    backend, _ = choose(name, device)
    s = spec(name)
    lim = s.limits.get(backend)
    if lim is None or lim.accepts(*args):
        return backend
    names = [b for b, _ in available_backends(name, device)]
    for b in names[names.index(backend) + 1:]:
        other = s.limits.get(b)
        if other is None or other.accepts(*args):
            return b
    return "reference"


def implementation(name: str, backend: str) -> Impl:
    """The callable of ``backend`` for op ``name``."""
    import torch

    s = spec(name)
    if backend in ("fbgemm", "fbgemm_ascend"):
        return getattr(torch.ops.fbgemm, name)
    if backend == "triton":
        return s.triton  # type: ignore[return-value]
    if backend == "cpu_kernel":
        return _extension().kernel(s.cpu_kernel)  # type: ignore[arg-type,return-value]
    return s.reference


def run(name: str, device: str, *args):
    """Run op ``name`` on ``device`` with the backend that serves these arguments (what the
    registry's dispatcher kernels do; ``args`` are the full positional arguments)."""
    backend = backend_for_call(name, device, args)
    if backend in ("fbgemm", "fbgemm_ascend"):
        return _unalias(implementation(name, backend)(*args), args)
    contract = spec(name).contract
    if contract is not None:
        contract(*args)
    return implementation(name, backend)(*args)


def _unalias(out, args: tuple):
    """fbgemm hands some inputs back as outputs (the offsets of jagged outputs); the outputs of a
    ``torchrec_ascend::`` op may not alias its inputs (schema), so those come back as copies."""
    import torch

    inputs = [t for a in args for t in (a if isinstance(a, (list, tuple)) else (a,))
              if isinstance(t, torch.Tensor)]
    ptrs = {t.untyped_storage().data_ptr() for t in inputs} - {0}

    def fix(o):
        if isinstance(o, torch.Tensor):
            aliased = any(o is t for t in inputs) or o.untyped_storage().data_ptr() in ptrs
            return o.clone() if aliased else o
        if isinstance(o, (list, tuple)):
            return type(o)(fix(x) for x in o)
        return o

    return fix(out)
