"""The backend table: for each op and each device, which implementation runs, and why.

Every op of the suite is described once by an :class:`OpSpec` (its schema, its implementations
side by side, its fake kernel and its autograd formula) and handed to :func:`register`, which

* defines ``torchrec_ascend::<op>`` with kernels for CPU, CUDA and PrivateUse1 (the NPU) that
  pick a backend through :func:`choose`, a fake (meta) kernel, and the autograd formula;
* for ops that fbgemm also has (``OpSpec.fbgemm``): registers ``fbgemm::<op>`` on PrivateUse1
  where no kernel exists there (fbgemm-ascend provides some on real NPUs), so TorchRec's own
  ``torch.ops.fbgemm.<op>`` calls resolve on ``npu``; where fbgemm is not installed at all (a
  torch-only machine), defines the ``fbgemm::<op>`` schema too, with fake kernel and autograd.

Backend preference, first available wins (the rule of DESIGN.md)::

    fbgemm (native, cpu/cuda) > fbgemm_ascend (npu) > triton (cuda, npu) > cpu_kernel (csrc) > reference

Forcing: ``TORCHREC_ASCEND_BACKEND=<backend>`` (all ops) or ``<op>=<backend>,...`` in the
environment, or the :func:`use_backend` context manager.  ``use_backend(..., replace_fbgemm=True)``
also puts the chosen implementation in place of fbgemm's own CPU kernels, so TorchRec's code
(which calls ``torch.ops.fbgemm.*`` directly) runs on our kernels.

Direct kernels: where the compiled extension has one for an op (``csrc/direct.h``), the CPU
kernel of ``torchrec_ascend::<op>`` is the csrc function itself, registered with the dispatcher,
and for ops with a gradient an AutogradCPU kernel in C++ skips the Python autograd layer when no
gradient is recorded.  The registry still decides: after every change of the forcing state it
tells each such op whether its CPU choice is ``cpu_kernel`` (then the csrc function runs, one
dispatcher hop) or not (then the C++ kernel calls the Python kernel, which runs :func:`choose`'s
backend).  A set ``$TORCHREC_ASCEND_BACKEND`` always takes the Python path (it is read at call
time), so :func:`choose` / :func:`describe` stay the truth.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import os
import threading
import warnings
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

__all__ = [
    "BACKENDS",
    "DEVICES",
    "ENV_BACKEND",
    "OpSpec",
    "register",
    "spec",
    "all_specs",
    "choose",
    "run",
    "available_backends",
    "use_backend",
    "describe",
    "describe_rows",
    "fbgemm_loaded",
    "triton_usable",
]

BACKENDS = ("fbgemm", "fbgemm_ascend", "triton", "cpu_kernel", "reference")
DEVICES = ("cpu", "cuda", "npu")
ENV_BACKEND = "TORCHREC_ASCEND_BACKEND"
_NS = "torchrec_ascend"
_DEVICE_KEYS = {"cpu": "CPU", "cuda": "CUDA", "npu": "PrivateUse1"}

Impl = Callable[..., object]


@dataclasses.dataclass
class OpSpec:
    """One op: schema, implementations side by side, fake kernel, autograd formula.

    Attributes:
        name: op name, the same in ``torchrec_ascend::`` and (when ``fbgemm``) ``fbgemm::``.
        schema: argument/return part of the schema, e.g. ``"(Tensor t_in) -> Tensor"``;
            mirrors fbgemm's schema for fbgemm ops.
        reference: torch-composite implementation (device-agnostic, the always-there backend).
        fake: fake/meta kernel (shapes only).
        fbgemm: True if fbgemm has an op of this name and schema.
        fbgemm_ascend: True if fbgemm-ascend 1.5.0 is documented to implement it (used only
            when it really has a PrivateUse1 kernel at run time).
        triton: Triton implementation (CUDA, Ascend; CPU under ``TRITON_INTERPRET=1``).
        cpu_kernel: name of the function in the compiled ``torchrec_ascend._C`` extension.
        backward / setup_context: autograd formula, as for ``torch.library.register_autograd``.
        decomposes_in_fbgemm: fbgemm registers the op as CompositeImplicitAutograd (it decomposes
            into other fbgemm ops), so no PrivateUse1 kernel is registered for it.
    """

    name: str
    schema: str
    reference: Impl
    fake: Impl
    fbgemm: bool = False
    fbgemm_ascend: bool = False
    triton: Optional[Impl] = None
    cpu_kernel: Optional[str] = None
    backward: Optional[Callable] = None
    setup_context: Optional[Callable] = None
    decomposes_in_fbgemm: bool = False


_SPECS: Dict[str, OpSpec] = {}
# fbgemm's own kernels, per op, recorded before we register anything: {"CPU", "CUDA", "PrivateUse1"}
_NATIVE_KEYS: Dict[str, frozenset] = {}
_LIBS: List[torch.library.Library] = []
_LOCK = threading.RLock()


@dataclasses.dataclass
class _Force:
    backend: str
    ops: Optional[frozenset]
    devices: Optional[frozenset]


_FORCE_STACK: List[_Force] = []
_REPLACED_CPU: set = set()  # fbgemm ops whose CPU kernel we currently replace
# ops whose CPU kernel is the csrc direct kernel: op -> the extension module that routes it
_DIRECT: Dict[str, object] = {}
_FORCE_GEN = 0  # bumped on every change of the forcing state (use_backend enter / exit)
_CHOICES: Dict[tuple, Tuple[str, str]] = {}  # choose() cache, keyed by everything it reads
_SYNCED_EXT: tuple = ()  # state of the extension loader at the last _sync_direct()


# --------------------------------------------------------------------------- environment


def fbgemm_loaded() -> bool:
    """Import fbgemm_gpu if installed (it must load before we define any fbgemm:: schema)."""
    return _fbgemm_state()[0]


_FBGEMM_STATE: Optional[Tuple[bool, bool]] = None


def _fbgemm_state() -> Tuple[bool, bool]:
    """(fbgemm_gpu imported, fbgemm_ascend imported)."""
    global _FBGEMM_STATE
    if _FBGEMM_STATE is None:
        loaded = ascend = False
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                importlib.import_module("fbgemm_gpu")
            loaded = True
        except Exception:
            loaded = False
        try:
            importlib.import_module("fbgemm_ascend")
            ascend = True
        except Exception:
            ascend = False
        _FBGEMM_STATE = (loaded, ascend)
    return _FBGEMM_STATE


def _has_schema(qualname: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(qualname, "")
        return True
    except RuntimeError:
        return False


def triton_usable(device: str) -> bool:
    """Triton can run here for ``device``: cuda with triton, npu with triton-ascend, cpu only
    under ``TRITON_INTERPRET=1`` (test-only: never chosen by default on cpu)."""
    if importlib.util.find_spec("triton") is None:
        return False
    if device == "cpu":
        return os.environ.get("TRITON_INTERPRET", "") == "1"
    if device == "cuda":
        from .. import device as _device

        return _device.is_available("cuda")
    if device == "npu":
        # triton-ascend ships the top-level ``triton`` package with an "npu" backend
        try:
            backends = importlib.import_module("triton.backends")
            return "npu" in getattr(backends, "backends", {})
        except Exception:
            return False
    return False


def _cpu_kernel(spec_: OpSpec) -> Optional[Impl]:
    if spec_.cpu_kernel is None:
        return None
    from . import cpu

    return cpu.kernel(spec_.cpu_kernel)


# --------------------------------------------------------------------------- choosing


def available_backends(name: str, device: str) -> List[Tuple[str, str]]:
    """Backends that can run ``name`` on ``device``, in preference order, each with a reason."""
    s = spec(name)
    key = _DEVICE_KEYS[device]
    out: List[Tuple[str, str]] = []
    native = _NATIVE_KEYS.get(name, frozenset())
    if s.fbgemm and device in ("cpu", "cuda") and key in native:
        if not (device == "cpu" and name in _REPLACED_CPU):
            out.append(("fbgemm", f"fbgemm_gpu has a {key} kernel"))
    if s.fbgemm and device == "npu" and key in native:
        out.append(("fbgemm_ascend", "fbgemm-ascend has a PrivateUse1 kernel"))
    if s.triton is not None and triton_usable(device):
        why = "triton kernel" + (" (TRITON_INTERPRET=1)" if device == "cpu" else "")
        out.append(("triton", why))
    if device == "cpu" and s.cpu_kernel is not None and _cpu_kernel(s) is not None:
        direct = " (direct dispatcher kernel)" if name in _DIRECT else ""
        out.append(("cpu_kernel", f"csrc kernel _C.{s.cpu_kernel}{direct}"))
    out.append(("reference", "torch-composite reference"))
    return out


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
    """(backend, why) for ``name`` on ``device`` under the current forcing."""
    from . import cpu

    s = spec(name)
    env = os.environ.get(ENV_BACKEND, "")
    ext_state = (cpu._TRIED, id(cpu._EXT))
    if ext_state != _SYNCED_EXT:  # the extension was loaded (or swapped, in tests) since
        _sync_direct()
    key = (name, device, env, os.environ.get("TRITON_INTERPRET", ""), _FORCE_GEN,
           ext_state, s.triton is None, s.cpu_kernel, triton_usable)  # (tests patch it)
    hit = _CHOICES.get(key)
    if hit is None:
        hit = _choose(name, device, env)
        if len(_CHOICES) > 4096:
            _CHOICES.clear()
        _CHOICES[key] = hit
    return hit


def _choose(name: str, device: str, env: str) -> Tuple[str, str]:
    """:func:`choose` without the cache, with ``env`` as the value of $TORCHREC_ASCEND_BACKEND."""
    avail = available_backends(name, device)
    names = [b for b, _ in avail]
    forced: Optional[str] = None
    origin = ""
    for f in reversed(_FORCE_STACK):
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
            return forced, f"forced by {origin}"
        if strict:
            raise RuntimeError(
                f"{origin} forces backend {forced!r} for op {name!r} on {device}, "
                f"but only {names} can run it there"
            )
        backend, why = avail[0]
        return backend, f"{why} ({forced!r} forced by {origin} is unavailable for this op)"
    return avail[0]


def _impl(name: str, backend: str) -> Impl:
    s = spec(name)
    if backend in ("fbgemm", "fbgemm_ascend"):
        return getattr(torch.ops.fbgemm, name)
    if backend == "triton":
        return s.triton  # type: ignore[return-value]
    if backend == "cpu_kernel":
        return _cpu_kernel(s)  # type: ignore[return-value]
    return s.reference


def run(name: str, device: str, *args):
    """Run op ``name`` on ``device`` with the chosen backend (what the dispatcher kernels do)."""
    backend, _ = choose(name, device)
    out = _impl(name, backend)(*args)
    if backend in ("fbgemm", "fbgemm_ascend"):
        out = _unalias(out, args)
    return out


def _unalias(out, args: tuple):
    """fbgemm hands some inputs back as outputs (the offsets of jagged outputs); the outputs of a
    ``torchrec_ascend::`` op may not alias its inputs (schema), so those come back as copies."""
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


def _sync_direct(names: Optional[Sequence[str]] = None) -> None:
    """Tell each direct kernel whether its op's CPU choice (forcing by use_backend, without the
    environment variable, which the kernel checks itself at call time) is the csrc kernel."""
    from . import cpu

    global _SYNCED_EXT
    _SYNCED_EXT = (cpu._TRIED, id(cpu._EXT))
    for name in (list(_DIRECT) if names is None else names):
        try:
            python = _choose(name, "cpu", "")[0] != "cpu_kernel"
        except (ValueError, RuntimeError):  # the Python path raises the same error at call time
            python = True
        _DIRECT[name]._direct_set_python(name, python)


def routes_direct(name: str) -> bool:
    """Whether a CPU call of ``torchrec_ascend::<name>`` now runs the csrc kernel straight from
    the dispatcher (no Python on the way)."""
    ext = _DIRECT.get(name)
    if ext is None:
        return False
    choose(name, "cpu")  # resyncs if the extension state changed
    return not ext._direct_routes_python(name)


# --------------------------------------------------------------------------- forcing


@contextlib.contextmanager
def use_backend(
    backend: str,
    ops: Optional[Sequence[str]] = None,
    device: Optional[str] = None,
    replace_fbgemm: bool = False,
) -> Iterator[None]:
    """Force ``backend`` inside the block.

    Args:
        backend: one of :data:`BACKENDS`.
        ops: restrict to these ops (then a backend that cannot run one of them is an error);
            ``None`` means every op, each falling back by the normal order where ``backend``
            cannot run it.
        device: restrict to one device type (``"cpu"``, ``"cuda"``, ``"npu"``).
        replace_fbgemm: also override fbgemm's own CPU kernels of these ops with ours, so code
            that calls ``torch.ops.fbgemm.<op>`` directly (TorchRec) runs our implementation.
            Only with a non-fbgemm backend.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: must be one of {', '.join(BACKENDS)}")
    if ops is not None:
        unknown = [o for o in ops if o not in _SPECS]
        if unknown:
            raise ValueError(f"ops: unknown op(s) {unknown}; registered: {sorted(_SPECS)}")
    if device is not None and device not in DEVICES:
        raise ValueError(f"device={device!r}: must be one of {', '.join(DEVICES)}")
    if replace_fbgemm and backend == "fbgemm":
        raise ValueError("replace_fbgemm=True needs a backend other than 'fbgemm'")
    force = _Force(backend, frozenset(ops) if ops is not None else None,
                   frozenset([device]) if device is not None else None)
    global _FORCE_GEN
    lib = None
    with _LOCK:
        _FORCE_STACK.append(force)
        _FORCE_GEN += 1
        replaced: List[str] = []
        if replace_fbgemm and (device in (None, "cpu")):
            targets = ops if ops is not None else list(_SPECS)
            lib = torch.library.Library("fbgemm", "IMPL")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
                for op in targets:
                    s = _SPECS[op]
                    if s.fbgemm and "CPU" in _NATIVE_KEYS.get(op, ()) and op not in _REPLACED_CPU:
                        lib.impl(op, _device_kernel(op, "cpu"), "CPU")
                        _REPLACED_CPU.add(op)
                        replaced.append(op)
        _sync_direct()
    try:
        yield
    finally:
        with _LOCK:
            if lib is not None:
                lib._destroy()  # the dispatcher falls back to fbgemm's kernel
            for op in replaced:
                _REPLACED_CPU.discard(op)
            _FORCE_STACK.remove(force)
            _FORCE_GEN += 1
            _sync_direct()


# --------------------------------------------------------------------------- registration


_ARG_CACHE: Dict[str, List[Tuple[str, bool, object]]] = {}


def _schema_args(name: str) -> List[Tuple[str, bool, object]]:
    """(name, has_default, default) of each argument of ``torchrec_ascend::<name>``."""
    if name not in _ARG_CACHE:
        schema = getattr(torch.ops.torchrec_ascend, name).default._schema
        _ARG_CACHE[name] = [(a.name, a.has_default_value(), a.default_value) for a in schema.arguments]
    return _ARG_CACHE[name]


def _full_args(name: str, args: tuple, kwargs: dict) -> tuple:
    """Positional arguments with the schema's defaults filled in (the dispatcher passes a Python
    kernel only what the caller gave)."""
    params = _schema_args(name)
    if len(args) == len(params) and not kwargs:
        return args
    out = list(args)
    for pname, has_default, default in params[len(args):]:
        if pname in kwargs:
            out.append(kwargs[pname])
        elif has_default:
            out.append(default)
        else:
            raise TypeError(f"{name}: missing argument {pname!r}")
    return tuple(out)


def _device_kernel(name: str, device: str) -> Impl:
    def kernel(*args, **kwargs):
        return run(name, device, *_full_args(name, args, kwargs))

    kernel.__name__ = f"{name}_{device}"
    return kernel


def _fit_backward(backward: Callable) -> Callable:
    """Trim the backward's per-input gradients to the inputs the op was really called with: the
    dispatcher drops trailing arguments equal to their defaults before autograd sees them."""

    def fitted(ctx, *grads):
        out = backward(ctx, *grads)
        out = out if isinstance(out, tuple) else (out,)
        n = len(ctx.needs_input_grad)
        if any(g is not None and not isinstance(g, list) for g in out[n:]):
            raise RuntimeError("backward returned a gradient for a defaulted argument")
        return out[:n]

    fitted.__name__ = getattr(backward, "__name__", "backward")
    return fitted


def _autograd_kernel(s: OpSpec, qualname: str) -> Optional[Callable]:
    """The keyset-taking autograd kernel ``torch.library.register_autograd`` would register for
    ``s`` (built here so that the C++ AutogradCPU kernel can call the same one), or None where
    this torch lacks the builder (then register_autograd is used and CPU keeps it too)."""
    try:
        from torch._library import autograd as _ta
        from torch._library import utils as _tu

        op = _tu.lookup_op(qualname)
        return _ta.make_autograd_impl(op, _ta.Info(_fit_backward(s.backward), s.setup_context))
    except (ImportError, AttributeError, TypeError):
        return None


def _first_tensor(args: tuple) -> torch.Tensor:
    for a in args:
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, torch.Tensor):
                return t
    raise RuntimeError("no tensor argument")


def _grad_entry(autograd_kernel: Callable) -> Callable:
    """``autograd_kernel`` as a plain function of the op's arguments (the C++ AutogradCPU kernel
    calls it when a gradient has to be recorded)."""

    # what the dispatcher hands a keyset-taking kernel: the keys of the arguments plus the
    # thread's included keys, minus the keys this op falls through (redispatching to one of
    # those is an error)
    fallthrough = torch._C.DispatchKeySet(torch._C.DispatchKey.ADInplaceOrView)
    for k in ("BackendSelect", "Conjugate", "Negative", "ZeroTensor"):
        fallthrough = fallthrough | torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, k))

    def grad_entry(*args):
        keys = torch._C._dispatch_keys(_first_tensor(args)) | \
            torch._C._dispatch_tls_local_include_set()
        return autograd_kernel(keys - fallthrough, *args)

    return grad_entry


def _install_direct(s: OpSpec, autograd_kernel: Optional[Callable]) -> bool:
    """Register the csrc direct kernel as ``torchrec_ascend::<op>``'s CPU kernel (False where
    the extension has none for the op; then the Python CPU kernel serves it)."""
    from . import cpu

    if s.cpu_kernel is None or s.name not in cpu.direct_ops():
        return False
    ext = cpu.extension()
    grad = None
    if s.backward is not None:
        if autograd_kernel is None:
            return False
        grad = _grad_entry(autograd_kernel)
    try:
        ext._direct_install(s.name, _device_kernel(s.name, "cpu"), grad)  # type: ignore[union-attr]
    except Exception as exc:  # a schema the C++ signature does not match: keep the Python path
        warnings.warn(f"torchrec_ascend: direct CPU kernel of {s.name} not installed "
                      f"({type(exc).__name__}: {exc}); using the Python CPU kernel",
                      RuntimeWarning, stacklevel=3)
        return False
    _DIRECT[s.name] = ext
    _sync_direct([s.name])
    return True


def _lib(ns: str, kind: str) -> torch.library.Library:
    lib = torch.library.Library(ns, kind)
    _LIBS.append(lib)
    return lib


_OWN_LIB: Optional[torch.library.Library] = None
_FBGEMM_DEF_LIB: Optional[torch.library.Library] = None
_FBGEMM_IMPL_LIB: Optional[torch.library.Library] = None


def register(s: OpSpec) -> OpSpec:
    """Register an op with the dispatcher and the backend table (once per name)."""
    global _OWN_LIB, _FBGEMM_DEF_LIB, _FBGEMM_IMPL_LIB
    with _LOCK:
        if s.name in _SPECS:
            raise ValueError(f"op {s.name!r} is already registered")
        if (s.backward is None) != (s.setup_context is None):
            raise ValueError(f"op {s.name!r}: give both backward and setup_context, or neither")
        fb_loaded, _ = _fbgemm_state()
        if _OWN_LIB is None:
            _OWN_LIB = _lib(_NS, "DEF")
        _SPECS[s.name] = s

        fb_q = f"fbgemm::{s.name}"
        native = frozenset()
        if s.fbgemm and _has_schema(fb_q):
            native = frozenset(
                k for k in ("CPU", "CUDA", "PrivateUse1")
                if torch._C._dispatch_has_kernel_for_dispatch_key(fb_q, k)
            )
        _NATIVE_KEYS[s.name] = native

        # torchrec_ascend::<op>: kernels per device (CPU: the csrc direct kernel where there is
        # one), fake, autograd
        qual = f"{_NS}::{s.name}"
        _OWN_LIB.define(s.name + s.schema)
        for dev, key in _DEVICE_KEYS.items():
            if dev != "cpu":
                _OWN_LIB.impl(s.name, _device_kernel(s.name, dev), key)
        torch.library.register_fake(qual, s.fake, lib=_OWN_LIB)
        autograd_kernel = None
        if s.backward is not None:
            autograd_kernel = _autograd_kernel(s, qual)
            if autograd_kernel is not None:
                _OWN_LIB.impl(s.name, autograd_kernel, "Autograd", with_keyset=True)
            else:
                torch.library.register_autograd(
                    qual, _fit_backward(s.backward), setup_context=s.setup_context, lib=_OWN_LIB)
        if not _install_direct(s, autograd_kernel):
            _OWN_LIB.impl(s.name, _device_kernel(s.name, "cpu"), "CPU")

        if not s.fbgemm:
            return s
        if not _has_schema(fb_q):
            if fb_loaded:
                warnings.warn(f"fbgemm_gpu is loaded but has no op {fb_q}; check OpSpec.fbgemm")
            # torch-only machine: define fbgemm::<op> ourselves so fbgemm-style calls work
            if _FBGEMM_DEF_LIB is None:
                _FBGEMM_DEF_LIB = _lib("fbgemm", "FRAGMENT")
            _FBGEMM_DEF_LIB.define(s.name + s.schema)
            for dev, key in _DEVICE_KEYS.items():
                _FBGEMM_DEF_LIB.impl(s.name, _device_kernel(s.name, dev), key)
            torch.library.register_fake(fb_q, s.fake, lib=_FBGEMM_DEF_LIB)
            if s.backward is not None:
                torch.library.register_autograd(
                    fb_q, _fit_backward(s.backward), setup_context=s.setup_context,
                    lib=_FBGEMM_DEF_LIB,
                )
        elif "PrivateUse1" not in native and not s.decomposes_in_fbgemm:
            if _FBGEMM_IMPL_LIB is None:
                _FBGEMM_IMPL_LIB = _lib("fbgemm", "IMPL")
            _FBGEMM_IMPL_LIB.impl(s.name, _device_kernel(s.name, "npu"), "PrivateUse1")
        return s


def spec(name: str) -> OpSpec:
    """The :class:`OpSpec` of a registered op."""
    try:
        return _SPECS[name]
    except KeyError:
        raise KeyError(f"op {name!r} is not registered; registered: {sorted(_SPECS)}") from None


def all_specs() -> List[OpSpec]:
    """Every registered op, in registration order."""
    return list(_SPECS.values())


def describe_rows(devices: Sequence[str] = DEVICES) -> List[Tuple[str, str, str, str]]:
    """(op, device, backend, why) for every registered op and device."""
    rows = []
    for s in all_specs():
        for dev in devices:
            backend, why = choose(s.name, dev)
            rows.append((s.name, dev, backend, why))
    return rows


def describe(devices: Sequence[str] = DEVICES, file=None) -> List[Tuple[str, str, str, str]]:
    """Print the backend table (op, device, backend, why) and return its rows."""
    import sys

    rows = describe_rows(devices)
    header = ("op", "device", "backend", "why")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(3)]
    out = file or sys.stdout
    line = "  ".join(h.ljust(w) for h, w in zip(header[:3], widths)) + "  " + header[3]
    print(line, file=out)
    print("-" * len(line), file=out)
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3], file=out)
    return rows
