"""Everything that touches the PyTorch dispatcher: the risky part of the registry, kept here.

For each :class:`~.spec.OpSpec`, :func:`define` registers

1. ``torchrec_ascend::<op>`` (schema from the spec) with a Python kernel per device key (CPU,
   CUDA, PrivateUse1) that closes over its spec and hands the call to the registry's ``run``,
   the fake kernel, and the autograd formula;
2. for fbgemm ops: ``fbgemm::<op>`` on PrivateUse1 where fbgemm has no kernel there (fbgemm-ascend
   provides some on a real npu) and fbgemm does not decompose the op; on a torch-only machine
   (no fbgemm_gpu) the ``fbgemm::<op>`` schema itself, with kernels, fake and autograd, so code
   written against ``torch.ops.fbgemm`` runs anyway.

Direct kernels (csrc/direct.h): while an op's CPU choice is ``cpu_kernel`` and the extension has
a direct kernel for it, the registry holds the handle ``_C.register_direct`` returns: the csrc
function is then ``torchrec_ascend::<op>``'s CPU kernel (one dispatcher hop, no Python), on top of
the Python one, and for ops with a gradient an AutogradCPU kernel in C++ skips the Python
autograd layer when nothing needs a gradient.  Dropping the handle deregisters both;
:func:`define` says which ops qualify and builds their autograd entry.

Three pieces rely on PyTorch internals and are the first suspects when a torch upgrade breaks:

* :func:`_autograd_kernel` builds the keyset-taking autograd kernel with
  ``torch._library.autograd.make_autograd_impl`` (what ``torch.library.register_autograd`` does
  inside) so that the C++ AutogradCPU kernel of a direct op can call the very same function;
  where this torch lacks the builder, ``register_autograd`` is used and ops with a gradient get
  no direct kernel.
* :func:`_grad_entry` recomputes the dispatch keyset a keyset-taking kernel expects (tensor keys
  + thread-local includes - the keys this op falls through).
* :func:`replace_fbgemm_cpu` overrides fbgemm's own CPU kernels inside a ``torch.library``
  IMPL library; destroying the library restores fbgemm's kernel (the dispatcher keeps it
  underneath).  The "Overriding a previously registered kernel" warning is expected there.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from .environment import DEVICE_KEYS, has_autograd_kernel, has_schema, native_keys_of
from .spec import Impl, OpSpec

__all__ = ["NAMESPACE", "Defined", "define", "fill_defaults", "replace_fbgemm_cpu"]

NAMESPACE = "torchrec_ascend"

Run = Callable[[OpSpec, str, tuple], object]  # the registry's run(spec, device, full args)
Params = List[Tuple[str, bool, object]]  # (name, has_default, default) of each argument
Library = Callable[[str, str], torch.library.Library]  # the registry's library(namespace, kind)


def fill_defaults(name: str, params: Params, args: tuple, kwargs: dict) -> tuple:
    """Positional arguments with the schema's defaults filled in (the dispatcher passes a Python
    kernel only what the caller gave)."""
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


def _python_kernel(s: OpSpec, device: str, params: Params, run: Run) -> Impl:
    """The Python kernel of ``s`` for one device type: ``run`` on the full arguments."""

    def kernel(*args, **kwargs):
        return run(s, device, fill_defaults(s.name, params, args, kwargs))

    kernel.__name__ = f"{s.name}_{device}"
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
        # pybind hands the C++ kernel's IntArrayRef / std::vector over as tuples; autograd
        # checks the structure of the gradients against the inputs', which the dispatcher
        # passes as lists
        args = tuple(list(a) if isinstance(a, tuple) else a for a in args)
        keys = torch._C._dispatch_keys(_first_tensor(args)) | \
            torch._C._dispatch_tls_local_include_set()
        return autograd_kernel(keys - fallthrough, *args)

    return grad_entry


@dataclasses.dataclass(frozen=True)
class Defined:
    """What :func:`define` registered for one op.

    Attributes:
        params: the schema's arguments (for :func:`fill_defaults`).
        fbgemm_keys: the device keys fbgemm itself had a kernel for, before ours.
        fbgemm_autograd: fbgemm registers an autograd kernel for the op (else its CPU kernel
            differentiates by recording the autograd graph of the ops it is made of).
        direct: the op's csrc kernel covers every call and its autograd entry could be built:
            it gets the extension's direct kernel (where there is one) while it is the choice.
        direct_grad: that direct kernel's Python autograd entry (None: no gradient).
    """

    params: Params
    fbgemm_keys: frozenset
    fbgemm_autograd: bool
    direct: bool
    direct_grad: Optional[Callable]


def define(s: OpSpec, library: Library, run: Run, fbgemm_loaded: bool) -> Defined:
    """Register ``s`` with the dispatcher (see the module docstring).  Called once per op."""
    fb_q, qual = f"fbgemm::{s.name}", f"{NAMESPACE}::{s.name}"
    fbgemm_keys = native_keys_of(fb_q) if s.fbgemm else frozenset()
    fbgemm_autograd = s.fbgemm and has_autograd_kernel(fb_q)

    own = library(NAMESPACE, "DEF")
    own.define(s.name + s.schema)
    params = [(a.name, a.has_default_value(), a.default_value)
              for a in getattr(torch.ops.torchrec_ascend, s.name).default._schema.arguments]
    for dev, key in DEVICE_KEYS.items():
        own.impl(s.name, _python_kernel(s, dev, params, run), key)
    torch.library.register_fake(qual, s.fake, lib=own)
    autograd_kernel = None
    if s.backward is not None:
        autograd_kernel = _autograd_kernel(s, qual)
        if autograd_kernel is not None:
            own.impl(s.name, autograd_kernel, "Autograd", with_keyset=True)
        else:
            torch.library.register_autograd(qual, _fit_backward(s.backward),
                                            setup_context=s.setup_context, lib=own)
    direct = (s.cpu_kernel is not None and "cpu_kernel" not in s.limits
              and (s.backward is None or autograd_kernel is not None))
    defined = Defined(params, fbgemm_keys, fbgemm_autograd, direct,
                      _grad_entry(autograd_kernel) if direct and autograd_kernel else None)
    if not s.fbgemm:
        return defined
    if not has_schema(fb_q):
        if fbgemm_loaded:
            warnings.warn(f"fbgemm_gpu is loaded but has no op {fb_q}; check OpSpec.fbgemm")
        # torch-only machine: define fbgemm::<op> ourselves so fbgemm-style calls work
        lib = library("fbgemm", "FRAGMENT")
        lib.define(s.name + s.schema)
        for dev, key in DEVICE_KEYS.items():
            lib.impl(s.name, _python_kernel(s, dev, params, run), key)
        torch.library.register_fake(fb_q, s.fake, lib=lib)
        if s.backward is not None:
            torch.library.register_autograd(fb_q, _fit_backward(s.backward),
                                            setup_context=s.setup_context, lib=lib)
    elif "PrivateUse1" not in fbgemm_keys and not s.decomposes_in_fbgemm:
        library("fbgemm", "IMPL").impl(s.name, _python_kernel(s, "npu", params, run),
                                       "PrivateUse1")
    return defined


def _differentiating_kernel(s: OpSpec, params: Params, run: Run) -> Impl:
    """A CPU kernel for ``fbgemm::<op>`` that records our autograd formula when a gradient is
    needed.  For the fbgemm ops with no autograd kernel: fbgemm's CPU kernel differentiates by
    recording the graph of the ops it is made of (the dispatcher's not-implemented fallback runs
    it with autograd on), so ours must record one too.  The forward still goes through ``run``
    (the backend choice, and the registry's observers)."""

    class Formula(torch.autograd.Function):
        @staticmethod
        def forward(*args):
            return run(s, "cpu", args)

        @staticmethod
        def setup_context(ctx, inputs, output):
            s.setup_context(ctx, inputs, output)

        @staticmethod
        def backward(ctx, *grads):
            out = s.backward(ctx, *grads)
            out = out if isinstance(out, tuple) else (out,)
            return tuple(None if isinstance(g, list) else g for g in out)

    def kernel(*args, **kwargs):
        full = fill_defaults(s.name, params, args, kwargs)
        if torch.is_grad_enabled() and any(
                isinstance(t, torch.Tensor) and t.requires_grad
                for a in full for t in (a if isinstance(a, list) else (a,))):
            return Formula.apply(*full)
        return run(s, "cpu", full)

    kernel.__name__ = f"{s.name}_cpu_differentiating"
    return kernel


def replace_fbgemm_cpu(ops: Sequence[Tuple[OpSpec, Defined]], run: Run) -> torch.library.Library:
    """A library that registers our CPU kernel for each ``fbgemm::<op>``; ``lib._destroy()``
    gives fbgemm's kernels back."""
    lib = torch.library.Library("fbgemm", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
        for s, d in ops:
            if s.backward is not None and not d.fbgemm_autograd:
                lib.impl(s.name, _differentiating_kernel(s, d.params, run), "CPU")
            else:
                lib.impl(s.name, _python_kernel(s, "cpu", d.params, run), "CPU")
    return lib
