"""AsyncNegativePrefetcher: async == sync, overlap, determinism, errors, shutdown."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from torchrec_ascend.sampling import (AsyncNegativePrefetcher, MixedSampler, NegativeSampler,
                                      SampledSoftmaxLoss, UniformSampler)

N, D, T, R = 500, 8, 40, 24


def _batches(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, N, (T,), generator=g) for _ in range(n)]


def _workers_alive() -> int:
    return sum(t.name.startswith("negative-prefetch") for t in threading.enumerate())


def _collect(asynchronous: bool, seed: int, jitter: bool = False, **kw):
    table = torch.randn(N, D, generator=torch.Generator().manual_seed(1))

    def lookup(ids):
        if jitter:
            time.sleep(random.random() * 0.01)
        return table[ids]

    out = []
    with AsyncNegativePrefetcher(MixedSampler(N), R, lookup_fn=lookup, per_token_negatives=3,
                                 seed=seed, device="cpu", asynchronous=asynchronous, **kw) as pf:
        for batch, neg in pf.prefetch(_batches(6, seed=2), lambda b: b):
            if jitter:
                time.sleep(random.random() * 0.01)
            out.append((batch, neg))
    return out


def test_async_equals_sync_for_same_seed():
    seed = random.randrange(1 << 30)
    a = _collect(True, seed, jitter=True)
    b = _collect(False, seed)
    assert len(a) == len(b) == 6
    for (ba, na), (bb, nb) in zip(a, b):
        assert torch.equal(ba, bb) and na.step == nb.step
        for x, y in ((na.negatives.ids, nb.negatives.ids), (na.negatives.log_q, nb.negatives.log_q),
                     (na.negatives.pos_log_q, nb.negatives.pos_log_q), (na.neg_emb, nb.neg_emb),
                     (na.extra_negatives.ids, nb.extra_negatives.ids), (na.extra_neg_emb, nb.extra_neg_emb)):
            assert torch.equal(x, y)
    c = _collect(True, seed + 1)
    assert not all(torch.equal(x[1].negatives.ids, y[1].negatives.ids) for x, y in zip(a, c))
    # the negatives follow the step's sampler draw: same as sampling inline with step_generator
    from torchrec_ascend.sampling import step_generator
    direct = MixedSampler(N).sample(a[3][0], R, step_generator(seed, 3))
    assert torch.equal(direct.ids, a[3][1].negatives.ids)
    assert _workers_alive() == 0


def test_next_step_work_runs_while_current_step_trains():
    """Step 1's sampling starts while the caller still holds step 0 (no timing assumptions)."""
    started = threading.Event()
    main_thread = threading.get_ident()
    threads = []

    def lookup(ids):
        threads.append(threading.get_ident())
        if len(threads) == 2:
            started.set()
        return torch.zeros(ids.numel(), D)

    with AsyncNegativePrefetcher(UniformSampler(N), R, lookup_fn=lookup, device="cpu") as pf:
        for i, (_, neg) in enumerate(pf.prefetch(_batches(3, 0), lambda b: b)):
            if i == 0:
                assert started.wait(timeout=30), "step 1 did not start during step 0"
    assert threads and all(t != main_thread for t in threads)


def test_lookup_on_caller_thread_and_training_matches_sync():
    """lookup_in_background=False: fresh table values, so async training == sync training."""
    def train(asynchronous: bool):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(N, D)
        proj = torch.nn.Linear(D, D)
        opt = torch.optim.SGD(list(emb.parameters()) + list(proj.parameters()), lr=0.5)
        loss_fn = SampledSoftmaxLoss(temperature=0.1)
        callers = set()

        def lookup(ids):
            callers.add(threading.get_ident())
            return emb(ids)

        losses = []
        with AsyncNegativePrefetcher(MixedSampler(N), R, lookup_fn=lookup, seed=7, device="cpu",
                                     asynchronous=asynchronous, lookup_in_background=False) as pf:
            for batch, neg in pf.prefetch(_batches(4, 3), lambda b: b):
                q = proj(emb(torch.roll(batch, 1)))
                loss = loss_fn(q, batch, emb(batch), neg.negatives, neg.neg_emb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
        assert callers == {threading.get_ident()}
        return losses

    a, b = train(True), train(False)
    assert a == b and a[0] != a[-1]


class _FailingSampler(UniformSampler):
    def __init__(self, fail_at: int):
        super().__init__(N)
        self.calls, self.fail_at = 0, fail_at

    def _sample(self, pos_ids, r, generator):
        self.calls += 1
        if self.calls == self.fail_at + 1:
            raise KeyError("boom in the worker")
        return super()._sample(pos_ids, r, generator)


@pytest.mark.parametrize("asynchronous", [True, False])
def test_worker_exception_surfaces_in_training_loop(asynchronous):
    pf = AsyncNegativePrefetcher(_FailingSampler(fail_at=2), R, device="cpu",
                                 asynchronous=asynchronous)
    seen = []
    with pytest.raises(KeyError, match="boom in the worker"):
        for _, neg in pf.prefetch(_batches(5, 0), lambda b: b):
            seen.append(neg.step)
    assert seen == [0, 1]
    assert pf.closed and _workers_alive() == 0
    with pytest.raises(RuntimeError, match="after close"):
        pf.submit(_batches(1, 0)[0])


def test_bad_ids_in_worker_raise_value_error():
    with AsyncNegativePrefetcher(UniformSampler(N), R, device="cpu") as pf:
        pf.submit(torch.tensor([1, N + 5]))
        with pytest.raises(ValueError, match="out of range"):
            pf.get()


def test_clean_shutdown_with_pending_work():
    gate = threading.Event()

    def slow_lookup(ids):
        gate.wait(timeout=30)
        return torch.zeros(ids.numel(), D)

    pf = AsyncNegativePrefetcher(UniformSampler(N), R, lookup_fn=slow_lookup, device="cpu",
                                 max_pending=3)
    for b in _batches(3, 0):
        pf.submit(b)
    with pytest.raises(RuntimeError, match="max_pending"):
        pf.submit(_batches(1, 0)[0])
    closer = threading.Thread(target=pf.close)
    closer.start()
    gate.set()  # let the running step finish; queued steps are cancelled
    closer.join(timeout=30)
    assert not closer.is_alive() and pf.closed and _workers_alive() == 0
    pf.close()  # idempotent


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_negatives"):
        AsyncNegativePrefetcher(UniformSampler(N), 0, device="cpu")
    with pytest.raises(ValueError, match="sampler"):
        AsyncNegativePrefetcher(object(), 4, device="cpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="per_token_negatives"):
        AsyncNegativePrefetcher(UniformSampler(N), 4, per_token_negatives=-1, device="cpu")
    with AsyncNegativePrefetcher(UniformSampler(N), 4, device="cpu") as pf:
        with pytest.raises(RuntimeError, match="nothing submitted"):
            pf.get()
        assert list(pf.prefetch([], lambda b: b)) == []
    assert isinstance(UniformSampler(N), NegativeSampler)


def _accelerator() -> torch.device:
    """npu (real, else the simulated one when built) or cuda; skip on a CPU-only build."""
    from torchrec_ascend import device as dev_mod
    for kind in ("npu", "cuda"):
        if dev_mod.is_available(kind):
            return torch.device(kind, 0)
    from torchrec_ascend.testing import simulated_npu
    if simulated_npu.available() and simulated_npu.enable():
        return torch.device("npu", 0)
    pytest.skip("no npu/cuda device and the simulated npu is not built (make build)")


def test_side_stream_on_accelerator(monkeypatch):
    """npu/cuda: the worker copies ids and looks up on a side stream (not the training stream);
    get() hands every tensor to the training stream (record_stream); same values as on cpu."""
    from torchrec_ascend import device as dev_mod
    dev = _accelerator()
    table_cpu = torch.randn(N, D, generator=torch.Generator().manual_seed(1))
    table = table_cpu.to(dev)
    main_stream = dev_mod.current_stream(dev)
    seen = []

    def lookup(ids):
        seen.append((threading.get_ident(), dev_mod.current_stream(dev).stream_id, ids.device))
        return table[ids]

    handed = []
    real_record = dev_mod.record_stream
    monkeypatch.setattr(dev_mod, "record_stream",
                        lambda t, s: (handed.append((t.data_ptr(), s.stream_id)), real_record(t, s)))
    got = []
    with AsyncNegativePrefetcher(MixedSampler(N), R, lookup_fn=lookup, per_token_negatives=2,
                                 seed=5, device=dev) as pf:
        for batch, neg in pf.prefetch(_batches(3, 4), lambda b: b.to(dev)):
            got.append(neg)
    assert len(seen) == 6 and all(tid != threading.get_ident() for tid, _, _ in seen)
    assert all(sid != main_stream.stream_id and d == dev for _, sid, d in seen)
    for neg in got:
        for t in (neg.negatives.ids, neg.neg_emb, neg.extra_negatives.ids, neg.extra_neg_emb):
            assert t.device == dev and (t.data_ptr(), main_stream.stream_id) in handed

    want = _collect_cpu_reference(table_cpu, seed=5)
    for a, b in zip(got, want):
        assert torch.equal(a.negatives.ids.cpu(), b.negatives.ids)
        assert torch.equal(a.negatives.log_q.cpu(), b.negatives.log_q)
        assert torch.equal(a.neg_emb.cpu(), b.neg_emb)
        assert torch.equal(a.extra_neg_emb.cpu(), b.extra_neg_emb)


def _collect_cpu_reference(table: torch.Tensor, seed: int):
    with AsyncNegativePrefetcher(MixedSampler(N), R, lookup_fn=lambda ids: table[ids],
                                 per_token_negatives=2, seed=seed, device="cpu",
                                 asynchronous=False) as pf:
        return [neg for _, neg in pf.prefetch(_batches(3, 4), lambda b: b)]


def test_start_step_continues_the_step_sequence():
    """A prefetcher started at step 3 (a resumed run) draws what an uninterrupted one draws
    from step 3 on."""
    pos = [torch.randint(0, 50, (8,), generator=torch.Generator().manual_seed(i)) for i in range(6)]
    with AsyncNegativePrefetcher(UniformSampler(50), 5, seed=9) as full:
        want = [n.negatives.ids for _, n in full.prefetch(pos, lambda p: p)]
    with AsyncNegativePrefetcher(UniformSampler(50), 5, seed=9, start_step=3) as resumed:
        got = [(n.step, n.negatives.ids) for _, n in resumed.prefetch(pos[3:], lambda p: p)]
    assert [s for s, _ in got] == [3, 4, 5]
    assert all(torch.equal(g, w) for (_, g), w in zip(got, want[3:]))
    with pytest.raises(ValueError, match="start_step: must be an integer >= 0"):
        AsyncNegativePrefetcher(UniformSampler(50), 5, start_step=-1)


def test_per_token_only_prefetch():
    """``num_negatives=0``: no shared pool, only K per token, the sampler's draw with the
    step's generator; 0 and 0 is an error."""
    from torchrec_ascend.sampling import step_generator

    pos = _batches(3, seed=6)
    with AsyncNegativePrefetcher(UniformSampler(N), 0, per_token_negatives=5, seed=4,
                                 device="cpu") as pf:
        got = list(pf.prefetch(pos, lambda p: p))
    for step, (p, n) in enumerate(got):
        assert n.negatives is None and n.neg_emb is None and n.extra_negatives.ids.shape == (T, 5)
        want = UniformSampler(N).sample_per_token(p, 5, step_generator(4, step))
        assert torch.equal(n.extra_negatives.ids, want.ids)
    with pytest.raises(ValueError, match="num_negatives: 0 .* needs per_token_negatives >= 1"):
        AsyncNegativePrefetcher(UniformSampler(N), 0, per_token_negatives=0, device="cpu")
