"""Test infrastructure: the simulated NPU and helpers for multi-process (gloo) tests.

Nothing here is imported by ``import torchrec_ascend``; tests import it explicitly.
"""

from __future__ import annotations

__all__ = ["simulated_npu", "multiprocess", "torchrec_workload", "pipeline_workload", "trace_ops"]
