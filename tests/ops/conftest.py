"""Fixtures shared by the op tests."""

from __future__ import annotations

import pytest


def _extension():
    from torchrec_ascend.ops import extension

    ext = extension.extension()
    if ext is None:
        pytest.skip("the csrc extension is not built")
    return ext


@pytest.fixture
def isa_cap():
    """set(cap): the widest vector ISA the csrc kernels may pick (2 AVX-512, 1 AVX2, 0 scalar:
    csrc/isa.h), restored afterwards; the AVX2 and scalar paths run on an AVX-512 CPU too."""
    ext = _extension()
    old = ext._set_isa_cap(2)
    yield ext._set_isa_cap
    ext._set_isa_cap(old)


@pytest.fixture
def llc_bytes():
    """set(n): the last-level cache size in bytes the csrc kernels plan for (csrc/isa.h
    llc_bytes: which outputs are streamed, whether TBE weights count as cache-resident), so both
    sides of each choice run on any machine; the OS's figure is restored afterwards."""
    ext = _extension()
    old = ext._set_llc_bytes(-1)
    yield ext._set_llc_bytes
    ext._set_llc_bytes(old)


@pytest.fixture
def far_prefetch():
    """set(mode): the pooled TBE forward's two-stage prefetch for weights past the LLC forced off
    (0) or on (1) instead of measured per CPU (-1; csrc/embedding.cpp far_prefetch_pays), so both
    paths run on any machine; restored afterwards."""
    ext = _extension()
    old = ext._set_far_prefetch(-1)
    yield ext._set_far_prefetch
    ext._set_far_prefetch(old)


@pytest.fixture
def reread(monkeypatch):
    """reread(**overrides): the registry reads its environment again (it reads it once, on
    import: set variables with ``monkeypatch`` first), fields of ``registry.Environment``
    overridden; afterwards the variables are restored and the environment read again."""
    from torchrec_ascend.ops import registry

    yield registry.reload_environment
    monkeypatch.undo()
    registry.reload_environment()
