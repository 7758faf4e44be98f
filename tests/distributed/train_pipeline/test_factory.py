"""make_train_pipeline argument rules (no process group needed: they are checked first)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchrec")

from torchrec_ascend.distributed.train_pipeline import KINDS, make_train_pipeline  # noqa: E402


class _Stale(torch.nn.Module):
    staleness = 2


def test_argument_rules():
    m, opt, cpu = torch.nn.Linear(2, 2), None, torch.device("cpu")
    with pytest.raises(ValueError, match="kind: 'async' is not one of"):
        make_train_pipeline("async", m, opt, cpu)
    with pytest.raises(ValueError, match="device='cpu'"):
        make_train_pipeline("sync", m, opt, "cpu")
    with pytest.raises(ValueError, match="staleness: -1 is not an integer >= 0"):
        make_train_pipeline("semi_async", m, opt, cpu, staleness=-1)
    for kind in ("sync", "sparse_dist"):
        with pytest.raises(ValueError, match=f"pipeline '{kind}' is synchronous"):
            make_train_pipeline(kind, m, opt, cpu, staleness=1)
    with pytest.raises(ValueError, match="must equal model.staleness=2"):
        make_train_pipeline("semi_async", _Stale(), opt, cpu, staleness=1)
    with pytest.raises(ValueError, match="pipeline 'sync' is synchronous"):
        make_train_pipeline("sync", _Stale(), opt, cpu)  # staleness taken from the model
    with pytest.raises(ValueError, match="prefetch_depth=-1"):
        make_train_pipeline("semi_async", m, opt, cpu, staleness=1, prefetch_depth=-1)
    with pytest.raises(ValueError, match="track_versions"):
        make_train_pipeline("sync", m, opt, cpu, track_versions=True)
    with pytest.raises(ValueError, match="sync_warmup_steps: 3 needs staleness >= 1"):
        make_train_pipeline("sparse_dist", m, opt, cpu, sync_warmup_steps=3)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=f"sync_warmup_steps: {bad!r} is not an integer"):
            make_train_pipeline("semi_async", m, opt, cpu, staleness=1, sync_warmup_steps=bad)
    assert KINDS == ("sync", "sparse_dist", "semi_async")


class _Batch:
    """The least a pipeline batch needs: ``.to(device, non_blocking)``."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def to(self, device, non_blocking=False):
        return _Batch(self.x.to(device), self.y.to(device))


def test_sync_pipeline_trains_a_plain_module():
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 1)

        def forward(self, batch):
            x, y = batch.x, batch.y
            loss = ((self.lin(x).squeeze(-1) - y) ** 2).mean()
            return loss, loss.detach()

    net = Net()
    ref = Net()
    ref.load_state_dict(net.state_dict())
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    data = [_Batch(torch.randn(4, 3), torch.randn(4)) for _ in range(3)]
    records = []
    pipe = make_train_pipeline("sync", net, opt, torch.device("cpu"), on_step=records.append)
    it = iter(data)
    outs = [pipe.progress(it) for _ in range(3)]
    with pytest.raises(StopIteration):
        pipe.progress(it)
    for b, out in zip(data, outs):
        x, y = b.x, b.y  # the same loop by hand
        ref_opt.zero_grad()
        loss = ((ref.lin(x).squeeze(-1) - y) ** 2).mean()
        torch.testing.assert_close(out, loss.detach(), atol=1e-7, rtol=1e-6)
        loss.backward()
        ref_opt.step()
    torch.testing.assert_close(net.lin.weight, ref.lin.weight, atol=1e-7, rtol=1e-6)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert set(records[0]["stages_ms"]) == {"batch_copy", "dense_fwd", "dense_bwd", "optimizer"}
    assert records[0]["pipeline"] == "sync" and 0.0 <= records[0]["busy_fraction"] <= 1.0
