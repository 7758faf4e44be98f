"""The backend table: for each op and each device, which implementation runs, and why.

Every op of the suite is described once by an :class:`OpSpec` (data: its schema, its
implementations side by side, its fake kernel, its autograd formula, the :class:`Limit` of a
backend that covers only some calls, fbgemm's rules and fix-ups) and handed to :func:`register`.
Spec -> choice -> dispatch, one concern per module:

=================  ==============================================================================
``spec``           :class:`OpSpec`, :class:`Limit` (data)
``environment``    what is installed and forced, read once: fbgemm_gpu / fbgemm-ascend, Triton
                   per device, the csrc extension, ``$TORCHREC_ASCEND_BACKEND``
``choice``         the preference rule and forcing as pure functions (:func:`candidates`, ...)
``dispatch``       every dispatcher registration (the risky, torch-internals part)
``state``          the one state object (:data:`~.state.STATE`): table, environment, forcing,
                   choice cache, direct kernels, observers; ``run`` (what every Python kernel
                   calls)
``forcing``        :func:`use_backend` (optionally replacing fbgemm's CPU kernels)
``describe``       :func:`describe` / :func:`describe_rows`
=================  ==============================================================================

Preference, first available wins::

    fbgemm (native, cpu/cuda) > fbgemm_ascend (npu) > triton (cuda, npu) > cpu_kernel (csrc) > reference

Forcing: ``TORCHREC_ASCEND_BACKEND=<backend>`` (all ops) or ``<op>=<backend>,...`` in the
environment (read on import; :func:`reload_environment` reads it again), or :func:`use_backend`.
``use_backend(..., replace_fbgemm=True)`` also puts our implementation in place of fbgemm's own
CPU kernels, so TorchRec's code (which calls ``torch.ops.fbgemm.*`` directly) runs on our kernels.
"""

from __future__ import annotations

from .choice import Installed, candidates
from .describe import describe, describe_rows
from .environment import ENV_BACKEND, Environment
from .forcing import use_backend
from .spec import BACKENDS, DEVICES, Limit, OpSpec
from .state import STATE

__all__ = [
    "BACKENDS", "DEVICES", "ENV_BACKEND", "Environment", "Installed", "Limit", "OpSpec",
    "register", "spec", "all_specs", "candidates", "available_backends", "choose",
    "backend_for_call", "use_backend", "replaced_fbgemm_ops", "routes_direct", "observe",
    "reload_environment", "fbgemm_keys", "full_args", "describe", "describe_rows",
    "fbgemm_loaded", "triton_usable",
]

(register, spec, all_specs, available_backends, choose, backend_for_call, replaced_fbgemm_ops,
 routes_direct, observe, reload_environment, fbgemm_keys, full_args) = (
    STATE.register, STATE.spec, STATE.all_specs, STATE.available_backends, STATE.choose,
    STATE.backend_for_call, STATE.replaced_fbgemm_ops, STATE.routes_direct, STATE.observe,
    STATE.reload_environment, STATE.fbgemm_keys, STATE.full_args)


def fbgemm_loaded() -> bool:
    """fbgemm_gpu is installed and imported."""
    return STATE.environment.fbgemm


def triton_usable(device: str) -> bool:
    """Triton can run here for ``device`` (cuda with triton, npu with triton-ascend, cpu only
    under ``TRITON_INTERPRET=1``, as the environment was read)."""
    return device in STATE.environment.triton_devices
