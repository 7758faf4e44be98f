"""ParameterVersions: identifies the version a read sees from the weights."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchrec")

from torchrec_ascend.distributed.parameter_versions import ParameterVersions  # noqa: E402


def test_versions_from_weights():
    emb = torch.nn.Embedding(10, 4)
    v = ParameterVersions([emb])
    v.record_update()                      # version 0
    assert v.record_lookup(0) == 0
    saved = emb.weight.detach().clone()
    with torch.no_grad():
        emb.weight[3] += 0.5
    v.record_update()                      # version 1
    with torch.no_grad():
        emb.weight[7] -= 0.25
    v.record_update()                      # version 2
    assert v.record_lookup(3) == 2         # fresh weights: version 2, 1 update stale
    with torch.no_grad():
        emb.weight.copy_(saved)
    assert v.record_lookup(4) == 0         # weights of version 0 again
    with torch.no_grad():
        emb.weight[0] += 9.0
    assert v.record_lookup(5) == -1        # matches no version (a torn read)
    assert v.staleness() == {0: 0, 3: 1, 4: 4, 5: 6}
    assert v.distinct() and v.max_staleness() == 6 and v.version == 2
