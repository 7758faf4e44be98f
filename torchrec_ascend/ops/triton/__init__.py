"""Triton kernels: the portable fast path (CUDA via ``triton``, Ascend via ``triton-ascend``,
CPU tensors under ``TRITON_INTERPRET=1`` for tests).  Importing a module here needs triton; the
op modules import these lazily, so ``torchrec_ascend.ops`` imports without triton."""
