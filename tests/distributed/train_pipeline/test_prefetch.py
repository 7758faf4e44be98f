"""BatchPrefetcher: order, end of data, iterator errors re-raised, copy/wait spans."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchrec")

from torchrec_ascend.distributed.train_pipeline.prefetch import BatchPrefetcher  # noqa: E402
from torchrec_ascend.distributed.train_pipeline.stages import StageTimer  # noqa: E402


def test_batches_in_order_then_none():
    timer = StageTimer()
    data = [torch.full((2,), float(i)) for i in range(5)]
    pf = BatchPrefetcher(iter(data), torch.device("cpu"), timer, depth=2)
    got = [pf.next(i) for i in range(5)]
    assert all(torch.equal(a, b) for a, b in zip(got, data))
    assert pf.next() is None and pf.next() is None
    stages = {s.stage for s in timer.spans}
    assert stages == {"batch_copy", "wait_batch"}
    pf.close()


def test_iterator_error_reaches_the_consumer():
    def gen():
        yield torch.zeros(1)
        raise KeyError("bad row 7")

    pf = BatchPrefetcher(gen(), torch.device("cpu"), StageTimer())
    assert pf.next() is not None
    with pytest.raises(KeyError, match="bad row 7"):
        pf.next()
    with pytest.raises(ValueError, match="depth"):
        BatchPrefetcher(iter([]), torch.device("cpu"), StageTimer(), depth=0)
