"""Fixtures shared by the op tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def isa_cap():
    """set(cap): the widest vector ISA the csrc kernels may pick (2 AVX-512, 1 AVX2, 0 scalar:
    csrc/isa.h), restored afterwards; the AVX2 and scalar paths run on an AVX-512 CPU too."""
    from torchrec_ascend.ops import extension

    ext = extension.extension()
    if ext is None:
        pytest.skip("the csrc extension is not built")
    old = ext._set_isa_cap(2)
    yield ext._set_isa_cap
    ext._set_isa_cap(old)
