"""Process-wide set-up of a peer-test run (tools/peer_tests.py puts this folder on PYTHONPATH).

Python imports ``sitecustomize`` at start-up in every interpreter, so this runs in the pytest
process and in every worker process TorchRec's multi-process tests spawn (forkserver / spawn):

* ``TORCHREC_ASCEND_PEER_BACKEND=<backend>`` (not ``fbgemm``): imports fbgemm_gpu and
  torchrec_ascend, then enters ``registry.use_backend(<backend>, replace_fbgemm=True)`` for the
  life of the process, so every ``torch.ops.fbgemm.<op>`` our registry has runs our kernel;
* ``TORCHREC_ASCEND_PEER_TORCHREC=<checkout>``: imports the installed torchrec first (so the
  checkout's ``torchrec`` package, which pytest puts on ``sys.path``, never shadows it) and makes
  the checkout's test packages (``torchrec.<pkg>.tests``, absent from the wheel) importable;
* ``TORCHREC_ASCEND_PEER_MAX_EXAMPLES=<n>``: caps every hypothesis ``settings`` object (the
  profiles and each test's ``@settings``) at ``n`` examples, without deadlines (a loaded machine
  must not fail a test on time).

Nothing happens where neither variable is set.
"""

from __future__ import annotations

import atexit
import os

_BACKEND = os.environ.get("TORCHREC_ASCEND_PEER_BACKEND", "")
_MAX_EXAMPLES = os.environ.get("TORCHREC_ASCEND_PEER_MAX_EXAMPLES", "")
_TORCHREC = os.environ.get("TORCHREC_ASCEND_PEER_TORCHREC", "")
_FORCE = None  # the entered use_backend() context: held for the life of the process


def _cap_hypothesis(n: int) -> None:
    try:
        import hypothesis
    except ImportError:
        return
    original = hypothesis.settings.__init__
    if getattr(original, "_peer_capped", False):
        return

    def capped(self, parent=None, **kwargs):
        given = kwargs.get("max_examples")
        kwargs["max_examples"] = n if not isinstance(given, int) else min(given, n)
        kwargs["deadline"] = None
        original(self, parent, **kwargs)

    capped._peer_capped = True  # type: ignore[attr-defined]
    hypothesis.settings.__init__ = capped  # type: ignore[method-assign]
    # the profile already loaded was built before the patch: rebuild it capped
    hypothesis.settings.register_profile("torchrec_ascend_peer", max_examples=n, deadline=None)
    hypothesis.settings.load_profile("torchrec_ascend_peer")


def _force(backend: str) -> None:
    global _FORCE
    import torch  # noqa: F401

    try:
        import fbgemm_gpu  # noqa: F401  (fbgemm's ops first: ours are registered over them)
    except ImportError:
        pass
    from torchrec_ascend.ops import registry

    _FORCE = registry.use_backend(backend, replace_fbgemm=True)
    _FORCE.__enter__()
    # leave the block while the interpreter can still import (its exit re-syncs the direct
    # kernels); left to garbage collection at shutdown it fails on a torn-down sys.meta_path
    atexit.register(_FORCE.__exit__, None, None, None)


class _CheckoutTests:
    """Meta path finder of last resort: a ``torchrec.*`` module the installed torchrec lacks is
    looked up in the checkout (only its test packages are missing from the wheel)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        import importlib.machinery

        parts = fullname.split(".")
        if parts[0] != "torchrec" or "tests" not in parts:
            return None
        where = os.path.join(self.root, *parts[:-1])
        return importlib.machinery.PathFinder.find_spec(fullname, [where])


def _torchrec_checkout(root: str) -> None:
    import sys

    import torchrec  # noqa: F401  (the installed one, before pytest prepends the checkout)

    sys.meta_path.append(_CheckoutTests(root))


if _TORCHREC:
    _torchrec_checkout(_TORCHREC)
if _MAX_EXAMPLES:
    _cap_hypothesis(int(_MAX_EXAMPLES))
if _BACKEND and _BACKEND != "fbgemm":
    _force(_BACKEND)
