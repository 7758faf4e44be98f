"""ops/__init__.py: the public surface (every public op of every area exported), and nothing
of a layer above (the former aliases ops.cpu / ops._checks / ops.embedding_npu are gone)."""

from __future__ import annotations

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


def test_no_former_aliases_and_no_import_from_a_higher_layer():
    """ops/ is the layer above device.py (and options.py, the option machinery, itself importing
    nothing of the package): no module of it imports anything else of torchrec_ascend (read from
    the sources: relative imports resolved against their module)."""
    import ast
    import pathlib

    for name in ("cpu", "_checks", "embedding_npu"):
        assert not hasattr(ops, name), name
    root = pathlib.Path(ops.__file__).parent
    for path in root.rglob("*.py"):
        package = ["torchrec_ascend"] + list(path.relative_to(root.parent).parent.parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                names = [".".join(base + ([node.module] if node.module else []))]
                if not node.module:  # from .. import x, y: each is a module
                    names = [f"{names[0]}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.startswith("torchrec_ascend"):
                    assert name.startswith(("torchrec_ascend.ops", "torchrec_ascend.device",
                                            "torchrec_ascend.options")), \
                        f"{path}: imports {name}"
