"""Everything that touches the PyTorch dispatcher: the risky part of the registry, kept here.

For each :class:`~.spec.OpSpec`, :func:`install` registers

1. ``torchrec_ascend::<op>`` (schema from the spec) with a kernel per device key (CPU, CUDA,
   PrivateUse1) that calls ``registry.run`` -- looked up on the package at call time, so a
   wrapper installed there (``testing.forced_backend.kernel_log``) sees every call --, the fake
   kernel, and the autograd formula;
2. for fbgemm ops: ``fbgemm::<op>`` on PrivateUse1 where fbgemm has no kernel there (fbgemm-ascend
   provides some on a real npu) and fbgemm does not decompose the op; on a torch-only machine
   (no fbgemm_gpu) the ``fbgemm::<op>`` schema itself, with kernels, fake and autograd, so code
   written against ``torch.ops.fbgemm`` runs anyway.

Three pieces rely on PyTorch internals and are the first suspects when a torch upgrade breaks:

* :func:`_autograd_kernel` builds the keyset-taking autograd kernel with
  ``torch._library.autograd.make_autograd_impl`` (what ``torch.library.register_autograd`` does
  inside) so that the C++ AutogradCPU kernel of a direct op can call the very same function;
  where this torch lacks the builder, ``register_autograd`` is used and no direct kernel is
  installed for ops with a gradient.
* :func:`_grad_entry` recomputes the dispatch keyset a keyset-taking kernel expects (tensor keys
  + thread-local includes - the keys this op falls through).
* :func:`replace_fbgemm_cpu` overrides fbgemm's own CPU kernels inside a ``torch.library``
  IMPL library; destroying the library restores fbgemm's kernel (the dispatcher keeps it
  underneath).  The "Overriding a previously registered kernel" warning is expected there.

Direct kernels (csrc/direct.h): where the extension has one for an op, ``torchrec_ascend::<op>``'s
CPU kernel is the csrc function itself (one dispatcher hop, no Python), and for ops with a
gradient an AutogradCPU kernel in C++ skips the Python autograd layer when nothing needs a
gradient.  The registry still decides: :func:`sync_direct` tells each such op, after every change
of the forcing state, whether its CPU choice is ``cpu_kernel`` (csrc runs) or not (the C++
kernel calls the Python kernel, which runs the registry's choice).  A set
``$TORCHREC_ASCEND_BACKEND`` always takes the Python path (read at call time).  An op whose
``cpu_kernel`` has a :class:`~.spec.Limit` gets no direct kernel (the per-call check is Python's).
"""

from __future__ import annotations

import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import environment
from .spec import Impl, OpSpec

__all__ = ["install", "device_kernel", "replace_fbgemm_cpu", "sync_direct", "routes_direct",
           "DIRECT", "NAMESPACE"]

NAMESPACE = "torchrec_ascend"

DIRECT: Dict[str, object] = {}
"""Ops whose CPU kernel is the csrc direct kernel: op -> the extension module that routes it."""

_LIBS: List[torch.library.Library] = []  # kept alive for the life of the process
_SYNCED: List[tuple] = [()]  # extension load state at the last sync_direct()
_ARG_CACHE: Dict[str, List[Tuple[str, bool, object]]] = {}


def _lib(ns: str, kind: str) -> torch.library.Library:
    lib = torch.library.Library(ns, kind)
    _LIBS.append(lib)
    return lib


_OWN: List[torch.library.Library] = []
_FBGEMM_DEF: List[torch.library.Library] = []
_FBGEMM_IMPL: List[torch.library.Library] = []


def _one(holder: List[torch.library.Library], ns: str, kind: str) -> torch.library.Library:
    if not holder:
        holder.append(_lib(ns, kind))
    return holder[0]


# --------------------------------------------------------------------------- Python kernels


def _schema_args(name: str) -> List[Tuple[str, bool, object]]:
    """(name, has_default, default) of each argument of ``torchrec_ascend::<name>``."""
    if name not in _ARG_CACHE:
        schema = getattr(torch.ops.torchrec_ascend, name).default._schema
        _ARG_CACHE[name] = [(a.name, a.has_default_value(), a.default_value)
                            for a in schema.arguments]
    return _ARG_CACHE[name]


def full_args(name: str, args: tuple, kwargs: dict) -> tuple:
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


def device_kernel(name: str, device: str) -> Impl:
    """The Python kernel of op ``name`` for one device type: ``registry.run`` on full arguments."""
    from .. import registry as package

    def kernel(*args, **kwargs):
        return package.run(name, device, *full_args(name, _as_lists(args), kwargs))

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
    this torch lacks the builder (PyTorch internals: ``torch._library.autograd``)."""
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


def _as_lists(args: tuple) -> tuple:
    """Array arguments as lists, as the Python dispatcher passes them (pybind hands the C++
    kernel's ``IntArrayRef`` / ``std::vector`` over as tuples; autograd checks the structure of
    the gradients against the inputs')."""
    return tuple(list(a) if isinstance(a, tuple) else a for a in args)


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
        args = _as_lists(args)
        keys = torch._C._dispatch_keys(_first_tensor(args)) | \
            torch._C._dispatch_tls_local_include_set()
        return autograd_kernel(keys - fallthrough, *args)

    return grad_entry


# --------------------------------------------------------------------------- direct kernels


def _ext():
    from .. import extension

    return extension


def synced_extension_state() -> tuple:
    """The extension's load state when :func:`sync_direct` last ran."""
    return _SYNCED[0]


def sync_direct(names: Optional[Sequence[str]] = None) -> None:
    """Tell each direct kernel whether its op's CPU choice (forcing by use_backend, without the
    environment variable, which the kernel checks itself at call time) is the csrc kernel."""
    from . import choice

    _SYNCED[0] = _ext().load_state()
    for name in (list(DIRECT) if names is None else names):
        try:
            python = choice.choose_uncached(name, "cpu", "")[0] != "cpu_kernel"
        except (ValueError, RuntimeError):  # the Python path raises the same error at call time
            python = True
        DIRECT[name]._direct_set_python(name, python)


def routes_direct(name: str) -> bool:
    """Whether a CPU call of ``torchrec_ascend::<name>`` now runs the csrc kernel straight from
    the dispatcher (no Python on the way)."""
    from . import choice

    ext = DIRECT.get(name)
    if ext is None:
        return False
    choice.choose(name, "cpu")  # resyncs if the extension state changed
    return not ext._direct_routes_python(name)


def _install_direct(s: OpSpec, autograd_kernel: Optional[Callable]) -> bool:
    """Register the csrc direct kernel as ``torchrec_ascend::<op>``'s CPU kernel (False where
    the extension has none for the op, or its cpu_kernel covers only some calls)."""
    ext_mod = _ext()
    if s.cpu_kernel is None or "cpu_kernel" in s.limits or s.name not in ext_mod.direct_ops():
        return False
    ext = ext_mod.extension()
    grad = None
    if s.backward is not None:
        if autograd_kernel is None:
            return False
        grad = _grad_entry(autograd_kernel)
    try:
        ext._direct_install(s.name, device_kernel(s.name, "cpu"), grad)  # type: ignore[union-attr]
    except Exception as exc:  # a schema the C++ signature does not match: keep the Python path
        warnings.warn(f"torchrec_ascend: direct CPU kernel of {s.name} not installed "
                      f"({type(exc).__name__}: {exc}); using the Python CPU kernel",
                      RuntimeWarning, stacklevel=3)
        return False
    DIRECT[s.name] = ext
    sync_direct([s.name])
    return True


# --------------------------------------------------------------------------- registration


def install(s: OpSpec) -> None:
    """Register ``s`` with the dispatcher (see the module docstring).  Called once per op."""
    fb_loaded, _ = environment.fbgemm_state()
    fb_q = f"fbgemm::{s.name}"
    environment.NATIVE_KEYS[s.name] = environment.native_keys_of(fb_q) if s.fbgemm else frozenset()
    environment.NATIVE_AUTOGRAD[s.name] = s.fbgemm and environment.has_autograd_kernel(fb_q)

    own = _one(_OWN, NAMESPACE, "DEF")
    qual = f"{NAMESPACE}::{s.name}"
    own.define(s.name + s.schema)
    for dev, key in environment.DEVICE_KEYS.items():
        if dev != "cpu":
            own.impl(s.name, device_kernel(s.name, dev), key)
    torch.library.register_fake(qual, s.fake, lib=own)
    autograd_kernel = None
    if s.backward is not None:
        autograd_kernel = _autograd_kernel(s, qual)
        if autograd_kernel is not None:
            own.impl(s.name, autograd_kernel, "Autograd", with_keyset=True)
        else:
            torch.library.register_autograd(qual, _fit_backward(s.backward),
                                            setup_context=s.setup_context, lib=own)
    if not _install_direct(s, autograd_kernel):
        own.impl(s.name, device_kernel(s.name, "cpu"), "CPU")

    if not s.fbgemm:
        return
    if not environment.has_schema(fb_q):
        if fb_loaded:
            warnings.warn(f"fbgemm_gpu is loaded but has no op {fb_q}; check OpSpec.fbgemm")
        # torch-only machine: define fbgemm::<op> ourselves so fbgemm-style calls work
        lib = _one(_FBGEMM_DEF, "fbgemm", "FRAGMENT")
        lib.define(s.name + s.schema)
        for dev, key in environment.DEVICE_KEYS.items():
            lib.impl(s.name, device_kernel(s.name, dev), key)
        torch.library.register_fake(fb_q, s.fake, lib=lib)
        if s.backward is not None:
            torch.library.register_autograd(fb_q, _fit_backward(s.backward),
                                            setup_context=s.setup_context, lib=lib)
    elif "PrivateUse1" not in environment.NATIVE_KEYS[s.name] and not s.decomposes_in_fbgemm:
        _one(_FBGEMM_IMPL, "fbgemm", "IMPL").impl(s.name, device_kernel(s.name, "npu"),
                                                  "PrivateUse1")


def _differentiating_kernel(s: OpSpec) -> Impl:
    """A CPU kernel for ``fbgemm::<op>`` that records our autograd formula when a gradient is
    needed.  For the fbgemm ops with no autograd kernel: fbgemm's CPU kernel differentiates by
    recording the graph of the ops it is made of (the dispatcher's not-implemented fallback runs
    it with autograd on), so ours must record one too.  The forward still goes through
    ``registry.run`` (the backend choice, and whatever wraps ``run``)."""
    from .. import registry as package

    class Formula(torch.autograd.Function):
        @staticmethod
        def forward(*args):
            return package.run(s.name, "cpu", *args)

        @staticmethod
        def setup_context(ctx, inputs, output):
            s.setup_context(ctx, inputs, output)

        @staticmethod
        def backward(ctx, *grads):
            out = s.backward(ctx, *grads)
            out = out if isinstance(out, tuple) else (out,)
            return tuple(None if isinstance(g, list) else g for g in out)

    def kernel(*args, **kwargs):
        full = full_args(s.name, _as_lists(args), kwargs)
        if torch.is_grad_enabled() and any(
                isinstance(t, torch.Tensor) and t.requires_grad
                for a in full for t in (a if isinstance(a, list) else (a,))):
            return Formula.apply(*full)
        return package.run(s.name, "cpu", *full)

    kernel.__name__ = f"{s.name}_cpu_differentiating"
    return kernel


def replace_fbgemm_cpu(names: Sequence[str]) -> torch.library.Library:
    """A library that registers our CPU kernel for each ``fbgemm::<name>``; ``lib._destroy()``
    gives fbgemm's kernels back."""
    from .spec import SPECS

    lib = torch.library.Library("fbgemm", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
        for name in names:
            spec_ = SPECS[name]
            if spec_.backward is not None and not environment.NATIVE_AUTOGRAD.get(name, True):
                lib.impl(name, _differentiating_kernel(spec_), "CPU")
            else:
                lib.impl(name, device_kernel(name, "cpu"), "CPU")
    return lib
