"""The registration tables, one per op area (``jagged``, ``sparse``, ``embedding``, ``hstu``).

Each area module holds, side by side and named after their op, the fake kernels
(``<op>_fake``), the autograd formulas (``<op>_setup_context`` / ``<op>_backward``) and the
:class:`~torchrec_ascend.ops.registry.OpSpec` table ``SPECS``; its ``register_all()`` registers
the table.  The public entry points (``torchrec_ascend.ops.<area>``) import their table and call
``register_all()`` once.
"""
