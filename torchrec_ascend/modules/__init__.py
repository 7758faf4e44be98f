"""torchrec_ascend.modules: nn.Modules for generative recommenders (HSTU), torch-only imports."""

from __future__ import annotations

from .hstu import HSTUBlock, HSTUEncoder, HSTUStack, InputPreprocessor, RelativeBias, hstu_flops

__all__ = ["HSTUBlock", "HSTUEncoder", "HSTUStack", "InputPreprocessor", "RelativeBias", "hstu_flops"]
