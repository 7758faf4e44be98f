"""The backend table: for each op and each device, which implementation runs, and why.

Every op of the suite is described once by an :class:`OpSpec` (its schema, its implementations
side by side, its fake kernel, its autograd formula, the :class:`Limit` of a backend that covers
only some calls) and handed to :func:`register`.  One concern per module:

=================  ==============================================================================
``spec``           :class:`OpSpec`, :class:`Limit`, the table of registered ops
``environment``    probes: fbgemm_gpu / fbgemm-ascend, Triton per device, fbgemm's own kernels
``choice``         the preference rule (:func:`candidates`, pure), forcing state, :func:`choose`,
                   the per-call capability routing and :func:`run`
``forcing``        :func:`use_backend` (optionally replacing fbgemm's CPU kernels)
``dispatch``       every dispatcher registration (the risky, torch-internals part)
``describe``       :func:`describe` / :func:`describe_rows`
=================  ==============================================================================

Preference, first available wins (DESIGN.md)::

    fbgemm (native, cpu/cuda) > fbgemm_ascend (npu) > triton (cuda, npu) > cpu_kernel (csrc) > reference

Forcing: ``TORCHREC_ASCEND_BACKEND=<backend>`` (all ops) or ``<op>=<backend>,...`` in the
environment, or :func:`use_backend`.  ``use_backend(..., replace_fbgemm=True)`` also puts our
implementation in place of fbgemm's own CPU kernels, so TorchRec's code (which calls
``torch.ops.fbgemm.*`` directly) runs on our kernels.
"""

from __future__ import annotations

from . import choice, dispatch, environment, forcing
from . import spec as _spec_mod
from .choice import (
    ENV_BACKEND,
    Installed,
    available_backends,
    backend_for_call,
    candidates,
    choose,
    run,
)
from .describe import describe, describe_rows
from .dispatch import routes_direct
from .environment import fbgemm_loaded, triton_usable
from .forcing import replaced_fbgemm_ops, use_backend
from .spec import BACKENDS, DEVICES, Limit, OpSpec, all_specs, spec

__all__ = [
    "BACKENDS",
    "DEVICES",
    "ENV_BACKEND",
    "Installed",
    "Limit",
    "OpSpec",
    "register",
    "spec",
    "all_specs",
    "candidates",
    "available_backends",
    "choose",
    "backend_for_call",
    "run",
    "use_backend",
    "replaced_fbgemm_ops",
    "routes_direct",
    "describe",
    "describe_rows",
    "fbgemm_loaded",
    "triton_usable",
]

# read by torchrec_ascend.testing (fbgemm's own kernels per op, recorded before ours)
_NATIVE_KEYS = environment.NATIVE_KEYS
_DIRECT = dispatch.DIRECT


def register(s: OpSpec) -> OpSpec:
    """Register an op with the dispatcher and the backend table (once per name)."""
    with choice.LOCK:
        if s.name in _spec_mod.SPECS:
            raise ValueError(f"op {s.name!r} is already registered")
        s.validate()
        _spec_mod.SPECS[s.name] = s
        try:
            dispatch.install(s)
        except Exception:
            del _spec_mod.SPECS[s.name]
            raise
        choice.forcing_changed()
        return s
