"""The registry's state, in one object: :data:`STATE`, a :class:`RegistryState`.

It holds the registered specs and what the dispatcher got for each, the environment (read once,
on import, and again on :meth:`~RegistryState.reload_environment`), the forcing stack of
``use_backend()``, the fbgemm ops whose CPU kernel is ours, the libraries and direct-kernel
handles it keeps registered, the choice cache and the observers.  The choice itself is
:mod:`.choice`'s pure functions; the dispatcher tables are rewritten (direct kernels registered
or dropped, fbgemm's CPU kernels replaced or given back) only when the choice changes.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from . import dispatch
from .choice import Force, Installed, candidates, decide, serving_backend
from .environment import Environment, read_environment
from .spec import FBGEMM_BACKENDS, OpSpec

__all__ = ["RegistryState", "STATE", "Observer"]

Observer = Callable[[str, str, str], None]
"""``observer(op, device, backend)``: called for every call a Python kernel of the registry
serves (not for the csrc direct kernels, which run without Python)."""


class RegistryState:
    """Everything the registry knows and has changed (see the module docstring)."""

    def __init__(self, environment: Environment):
        self.environment = environment
        self._lock = threading.RLock()
        self._specs: Dict[str, OpSpec] = {}
        self._defined: Dict[str, dispatch.Defined] = {}
        self._libraries: Dict[Tuple[str, str], torch.library.Library] = {}
        self._forces: List[Force] = []
        self._replaced: set = set()
        self._direct: Dict[str, object] = {}  # op -> handle of its registered direct kernels
        self._choices: Dict[Tuple[str, str], tuple] = {}  # (op, device) -> ((backend, why), names)
        self._observers: Tuple[Observer, ...] = ()

    # ----------------------------------------------------------------------------- the table

    def register(self, s: OpSpec) -> OpSpec:
        """Register an op with the dispatcher and the backend table (once per name)."""
        with self._lock:
            if s.name in self._specs:
                raise ValueError(f"op {s.name!r} is already registered")
            s.validate()
            self._specs[s.name] = s
            try:
                self._defined[s.name] = dispatch.define(s, self._library, self.run,
                                                        self.environment.fbgemm)
            except Exception:
                del self._specs[s.name]
                raise
            self._sync_direct([s.name])
            return s

    def _library(self, namespace: str, kind: str) -> torch.library.Library:
        if (namespace, kind) not in self._libraries:
            self._libraries[namespace, kind] = torch.library.Library(namespace, kind)
        return self._libraries[namespace, kind]

    def spec(self, name: str) -> OpSpec:
        """The :class:`~.spec.OpSpec` of a registered op."""
        try:
            return self._specs[name]
        except KeyError:
            raise KeyError(f"op {name!r} is not registered; registered: "
                           f"{sorted(self._specs)}") from None

    def all_specs(self) -> List[OpSpec]:
        """Every registered op, in registration order."""
        return list(self._specs.values())

    def fbgemm_keys(self, name: str) -> frozenset:
        """The device keys fbgemm itself has a kernel for ``name`` (recorded before ours)."""
        return self._defined[name].fbgemm_keys

    def full_args(self, name: str, args: Sequence[object], kwargs: Optional[dict] = None) -> tuple:
        """``args`` (+ ``kwargs``) of op ``name`` as the full positional arguments its
        implementations take (the schema's defaults filled in)."""
        return dispatch.fill_defaults(name, self._defined[name].params, tuple(args), kwargs or {})

    # ----------------------------------------------------------------------------- changes

    def reload_environment(self, **overrides) -> Environment:
        """Read the environment again ($TORCHREC_ASCEND_BACKEND, Triton, the extension; see
        :func:`~.environment.read_environment`), ``overrides`` replacing fields (tests)."""
        with self._lock:
            self.environment = read_environment(**overrides)
            self._changed()
            return self.environment

    @contextlib.contextmanager
    def forcing(self, force: Force, replace_fbgemm: bool) -> Iterator[None]:
        """``force`` on top of the forcing stack inside the block (and, with ``replace_fbgemm``,
        our CPU kernel in place of fbgemm's for the ops it covers; given back afterwards)."""
        with self._lock:
            self._forces.append(force)
            lib, replaced = None, []
            if replace_fbgemm and (force.devices is None or "cpu" in force.devices):
                replaced = [op for op in (force.ops if force.ops is not None else self._specs)
                            if self._specs[op].fbgemm and op not in self._replaced
                            and "CPU" in self._defined[op].fbgemm_keys]
                lib = dispatch.replace_fbgemm_cpu(
                    [(self._specs[op], self._defined[op]) for op in replaced], self.run)
                self._replaced.update(replaced)
            self._changed()
        try:
            yield
        finally:
            with self._lock:
                if lib is not None:
                    lib._destroy()  # the dispatcher falls back to fbgemm's kernels
                self._replaced.difference_update(replaced)
                self._forces.remove(force)
                self._changed()

    def replaced_fbgemm_ops(self) -> List[str]:
        """fbgemm ops whose CPU kernel is ours right now (``use_backend(replace_fbgemm=True)``)."""
        return sorted(self._replaced)

    def _changed(self) -> None:
        self._choices.clear()
        self._sync_direct(list(self._defined))

    # ----------------------------------------------------------------------------- the choice

    def installed(self, name: str, device: str) -> Installed:
        """The :class:`~.choice.Installed` snapshot of op ``name`` on ``device``."""
        s, d, env = self.spec(name), self._defined[name], self.environment
        return Installed(fbgemm_keys=d.fbgemm_keys, fbgemm_cpu_replaced=name in self._replaced,
                         triton=device in env.triton_devices,
                         cpu_kernel=s.cpu_kernel is not None and hasattr(env.extension,
                                                                         s.cpu_kernel),
                         direct=d.direct and name in env.direct_ops)

    def available_backends(self, name: str, device: str) -> List[Tuple[str, str]]:
        """Backends that can run ``name`` on ``device`` here, in preference order, with reasons."""
        return candidates(self.spec(name), device, self.installed(name, device))

    def _decide(self, name: str, device: str) -> tuple:
        with self._lock:
            avail = self.available_backends(name, device)
            hit = (decide(name, device, avail, self._forces, self.environment.forcing),
                   [b for b, _ in avail])
            self._choices[name, device] = hit
            return hit

    def choose(self, name: str, device: str) -> Tuple[str, str]:
        """(backend, why) for ``name`` on ``device`` under the current forcing (a backend with
        a :class:`~.spec.Limit` may still pass a particular call on: :meth:`backend_for_call`)."""
        return (self._choices.get((name, device)) or self._decide(name, device))[0]

    def backend_for_call(self, name: str, device: str, args: Sequence[object]) -> str:
        """The backend that serves a call of ``name`` on ``device`` with ``args`` (the full
        positional arguments)."""
        (backend, _), names = self._choices.get((name, device)) or self._decide(name, device)
        return serving_backend(self.spec(name), names, backend, args)

    def routes_direct(self, name: str) -> bool:
        """Whether a CPU call of ``torchrec_ascend::<name>`` now runs the csrc kernel straight from
        the dispatcher (no Python on the way)."""
        return name in self._direct

    def _sync_direct(self, names: Sequence[str]) -> None:
        """Register the direct kernel of each op of ``names`` whose CPU choice is ``cpu_kernel``
        (where the extension has one), and drop those of the others."""
        env = self.environment
        for name in names:
            d = self._defined[name]
            try:
                want = (d.direct and name in env.direct_ops
                        and self.choose(name, "cpu")[0] == "cpu_kernel")
            except (ValueError, RuntimeError):  # the Python kernel raises it at call time
                want = False
            if want and name not in self._direct and not sys.is_finalizing():
                # csrc/direct.h: the csrc function becomes the CPU kernel (on top of the Python
                # one), plus its AutogradCPU kernel (not while the interpreter shuts down: a
                # use_backend block left open until then exits after our libraries are gone)
                self._direct[name] = env.extension.register_direct(name, d.direct_grad)
            elif not want:
                self._direct.pop(name, None)  # the handle's destructor deregisters them

    # ----------------------------------------------------------------------------- running

    def run(self, s: OpSpec, device: str, args: tuple):
        """Run op ``s`` on ``device`` with the backend that serves these arguments (what every
        Python kernel of the registry does; ``args`` are the full positional arguments)."""
        (backend, _), names = self._choices.get((s.name, device)) or self._decide(s.name, device)
        if s.limits:
            backend = serving_backend(s, names, backend, args)
        for observer in self._observers:
            observer(s.name, device, backend)
        if backend in FBGEMM_BACKENDS:
            kernel = getattr(torch.ops.fbgemm, s.name)
            out = kernel(*args) if s.fbgemm_fixup is None else s.fbgemm_fixup(kernel, args)
            return _unalias(out, args)
        if backend == "cpu_kernel":  # checks fbgemm's rules itself, in C++
            return getattr(self.environment.extension, s.cpu_kernel)(*args)
        if s.contract is not None:
            s.contract(*args)
        return (s.triton if backend == "triton" else s.reference)(*args)

    @contextlib.contextmanager
    def observe(self, observer: Observer) -> Iterator[None]:
        """Call ``observer(op, device, backend)`` for every call a Python kernel of the registry
        serves inside the block (tests: which backend ran what)."""
        with self._lock:
            self._observers += (observer,)
        try:
            yield
        finally:
            with self._lock:
                rest = list(self._observers)
                rest.remove(observer)
                self._observers = tuple(rest)


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


STATE = RegistryState(read_environment())
"""The registry's state (the only mutable module-level object of ``ops/registry/``)."""
