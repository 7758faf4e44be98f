"""ops/__init__.py: the public surface (every public op of every area exported) and the former
module names kept working."""

from __future__ import annotations

import importlib

import torchrec_ascend.ops as ops
from torchrec_ascend.ops import embedding, hstu, jagged, sparse


def test_every_public_op_is_exported():
    for area in (sparse, jagged, hstu, embedding):
        for name in area.__all__:
            if name.isupper():  # constants (OPTIMIZERS, POOLING_MODES, ...) stay in their module
                continue
            if name in ("backward_op_name",):
                continue
            assert name in ops.__all__, f"{area.__name__}.{name} is not in torchrec_ascend.ops"
            assert getattr(ops, name) is getattr(area, name)
    assert len(jagged.__all__) == 15 and all(n in ops.__all__ for n in jagged.__all__)
    assert "hstu_mha" in ops.__all__
    for name in ops.__all__:
        assert hasattr(ops, name), name


def test_former_module_names_are_the_same_modules():
    assert importlib.import_module("torchrec_ascend.ops.cpu") is ops.extension
    assert importlib.import_module("torchrec_ascend.ops._checks") is ops.validation
    from torchrec_ascend.ops import cpu, _checks  # noqa: F401

    assert cpu is ops.extension and _checks is ops.validation


def test_tbe_npu_plumbing_moved_to_distributed():
    moved = importlib.import_module("torchrec_ascend.distributed.fbgemm_tbe_npu")
    assert ops.embedding_npu is moved
    assert moved.infos_metadata(8, 3) == (30, (1 << 30) - 1)
