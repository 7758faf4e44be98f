"""HSTUCostModel: the FLOP model against hstu_flops (the module's published formula), the cost
formula against a float64 loop, the non-negative fit against known coefficients, calibration
and its cache on a tiny real encoder, and bad input."""

from __future__ import annotations

import json
import warnings
import math

import pytest
import torch

pytest.importorskip("torchrec")

from torchrec_ascend.distributed.load_balance import HSTUCostModel, calibration_key  # noqa: E402
from torchrec_ascend.distributed.load_balance import cost as cost_mod  # noqa: E402
from torchrec_ascend.modules.hstu import HSTUEncoder, hstu_flops  # noqa: E402


@pytest.mark.parametrize("shape", [(2, 64, 2, 32, 32), (1, 8, 1, 4, 6), (3, 48, 4, 16, 24)])
def test_from_flops_sums_to_hstu_flops(shape):
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(0, 300, (37,), generator=g)
    offsets = torch.zeros(38, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    for backward in (False, True):
        model = HSTUCostModel.from_flops(*shape, backward=backward)
        want = hstu_flops(offsets, *shape, backward=backward)
        assert float(model.cost(lengths).sum()) == pytest.approx(want, rel=1e-12)
        # per sequence too: one sequence's FLOPs
        for n in (0, 1, 17):
            one = hstu_flops(torch.tensor([0, n]), *shape, backward=backward)
            assert float(model.cost(torch.tensor([n]))[0]) == pytest.approx(one, rel=1e-12, abs=1e-9)


def test_from_encoder_reads_the_shape():
    enc = HSTUEncoder(16, 2, 2, 8, 4, 32)
    assert HSTUCostModel.from_encoder(enc) == HSTUCostModel.from_flops(2, 16, 2, 8, 4)
    with pytest.raises(ValueError, match="lacks"):
        HSTUCostModel.from_encoder(torch.nn.Linear(2, 2))


def test_cost_matches_a_float64_loop_with_targets():
    m = HSTUCostModel(0.7, 0.013, target_coef=2.5)
    lengths = torch.tensor([0, 1, 5, 40, 3], dtype=torch.int32)
    nt = torch.tensor([0, 1, 2, 10, 0])
    got = m.cost(lengths, nt)
    want = [0.7 * n + 0.013 * n * n + 2.5 * t for n, t in zip(lengths.tolist(), nt.tolist())]
    assert got.dtype == torch.float64 and got.device.type == "cpu"
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), rtol=1e-15, atol=0)


@pytest.mark.parametrize("lengths, nt, match", [
    (torch.tensor([1.0, 2.0]), None, "integer dtype"),
    (torch.tensor([[1, 2]]), None, "1-D"),
    (torch.tensor([3, -1]), None, ">= 0"),
    (torch.tensor([3, 1]), torch.tensor([1]), "shape"),
    (torch.tensor([3, 1]), torch.tensor([1, 2]), "more targets than tokens"),
    ([3, 1], None, "expected a Tensor"),
])
def test_cost_bad_input(lengths, nt, match):
    with pytest.raises(ValueError, match=match):
        HSTUCostModel(1.0, 1.0).cost(lengths, nt)


@pytest.mark.parametrize("a, b, t, match", [(-1.0, 1.0, 0.0, "a: must"), (1.0, math.nan, 0.0, "b: must"),
                                            (1.0, 1.0, -2.0, "target_coef"), (0.0, 0.0, 0.0, "at least one")])
def test_coefficients_are_checked(a, b, t, match):
    with pytest.raises(ValueError, match=match):
        HSTUCostModel(a, b, t)


def test_fit_recovers_known_coefficients_and_stays_non_negative():
    c0, a, b = 2e-3, 3e-6, 4e-8
    pts = [{"tokens": float(n * k), "pairs": float(k * n * n), "s": c0 + a * n * k + b * k * n * n}
           for n, k in cost_mod._shapes(256)]
    got = cost_mod._fit(pts)
    assert got[:3] == pytest.approx((c0, a, b), rel=1e-9)
    assert got[3] < 1e-9
    # a machine where the n^2 term is invisible: the unconstrained fit would give b < 0
    g = torch.Generator().manual_seed(3)
    noisy = [dict(p, s=(c0 + a * p["tokens"]) * (1 + 0.05 * float(torch.randn(1, generator=g)))
                  - 1e-9 * p["pairs"]) for p in pts]
    got = cost_mod._fit(noisy)
    assert min(got[:3]) >= 0.0 and got[1] > 0


def test_shapes_vary_tokens_and_pairs_independently():
    shapes = cost_mod._shapes(512)
    assert max(n for n, _ in shapes) == 512 and min(n for n, _ in shapes) == 32
    X = torch.tensor([[1.0, n * k, k * n * n] for n, k in shapes], dtype=torch.float64)
    assert int(torch.linalg.matrix_rank(X / X.abs().amax(0))) == 3


@pytest.fixture
def one_thread():
    """Calibrate as a rank does (one thread): two OpenMP threads on a loaded 2-core machine spin
    for tens of milliseconds per op and drown the signal."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _synthetic_timings(a: float, b: float, c0: float = 1e-3):
    """Timings that follow ``c0 + a tokens + b pairs`` exactly (real ones on a loaded 2-core
    machine can drown the per-token signal and make calibration fall back, by design)."""
    return lambda enc, dev, max_len, repeats: [
        {"n": n, "k": k, "tokens": float(n * k), "pairs": float(k * n * n),
         "s": c0 + a * n * k + b * k * n * n} for n, k in cost_mod._shapes(max_len)]


def test_calibrate_fits_caches_and_refreshes(tmp_path, monkeypatch):
    monkeypatch.setattr(cost_mod, "_measure", _synthetic_timings(2e-5, 1.5e-7))
    enc = HSTUEncoder(8, 1, 1, 4, 4, 32)
    m = HSTUCostModel.calibrate(enc, "cpu", 32, cache_dir=str(tmp_path), repeats=1)
    assert m.source.startswith("measured") and len(m.fit["points"]) == len(cost_mod._shapes(32))
    assert m.a == pytest.approx(2e-5, rel=1e-3) and m.b == pytest.approx(1.5e-7, rel=1e-3)
    doc = json.loads((tmp_path / cost_mod.CACHE_FILE).read_text())
    key = calibration_key(enc, "cpu", 32)
    assert doc[key]["a"] == m.a and doc[key]["b"] == m.b

    def no_measuring(*a, **k):
        raise AssertionError("measured although cached")

    monkeypatch.setattr(cost_mod, "_measure", no_measuring)
    again = HSTUCostModel.calibrate(enc, "cpu", 32, cache_dir=str(tmp_path), target_coef=1.5)
    assert (again.a, again.b, again.target_coef) == (m.a, m.b, 1.5) and again.source.startswith("cached")
    with pytest.raises(AssertionError, match="measured although cached"):  # other key: measures
        HSTUCostModel.calibrate(enc, "cpu", 16, cache_dir=str(tmp_path))
    with pytest.raises(AssertionError, match="measured although cached"):  # cache=False: measures
        HSTUCostModel.calibrate(enc, "cpu", 32, cache=False, cache_dir=str(tmp_path))
    with pytest.raises(AssertionError, match="measured although cached"):  # refresh: measures
        HSTUCostModel.calibrate(enc, "cpu", 32, refresh=True, cache_dir=str(tmp_path))
    monkeypatch.setattr(cost_mod, "_measure", _synthetic_timings(4e-5, 1e-7))
    fresh = HSTUCostModel.calibrate(enc, "cpu", 32, refresh=True, cache_dir=str(tmp_path), repeats=1)
    stored = json.loads((tmp_path / cost_mod.CACHE_FILE).read_text())[key]
    assert (stored["a"], stored["b"]) == (fresh.a, fresh.b) and fresh.a == pytest.approx(4e-5, rel=1e-3)


def test_real_calibration_leaves_the_encoder_alone(tmp_path, one_thread):
    """A real measurement: its outcome depends on the machine's load (a fit, or the documented
    FLOP-model fallback when the times do not grow with the tokens); the encoder is untouched."""
    torch.manual_seed(0)
    enc = HSTUEncoder(8, 1, 1, 4, 4, 32)
    before = {k: v.clone() for k, v in enc.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the fallback's warning, under load
        m = HSTUCostModel.calibrate(enc, "cpu", 32, cache_dir=str(tmp_path), repeats=1)
    assert m.a >= 0 and m.b >= 0 and m.a + m.b > 0
    assert m.source.startswith("measured") or m.source == "flops (calibration failed)"
    assert all(torch.equal(before[k], v) for k, v in enc.state_dict().items())
    assert all(p.grad is None for p in enc.parameters())


def test_a_corrupt_cache_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setattr(cost_mod, "_measure", _synthetic_timings(2e-5, 1.5e-7))
    (tmp_path / cost_mod.CACHE_FILE).write_text("{not json")
    enc = HSTUEncoder(8, 1, 1, 4, 4, 16)
    m = HSTUCostModel.calibrate(enc, "cpu", 16, cache_dir=str(tmp_path), repeats=1)
    assert calibration_key(enc, "cpu", 16) in json.loads((tmp_path / cost_mod.CACHE_FILE).read_text())
    assert m.a + m.b > 0


def test_noise_only_timings_fall_back_to_the_flop_model(tmp_path, monkeypatch):
    flat = [{"n": n, "k": k, "tokens": float(n * k), "pairs": float(k * n * n),
             "s": 0.05 * (1 + 0.01 * (-1) ** (i // 2))}  # noise, uncorrelated with tokens
            for i, (n, k) in enumerate(cost_mod._shapes(32))]
    monkeypatch.setattr(cost_mod, "_measure", lambda *a: flat)
    enc = HSTUEncoder(8, 1, 1, 4, 4, 32)
    with pytest.warns(UserWarning, match="did not grow with the token count"):
        m = HSTUCostModel.calibrate(enc, "cpu", 32, cache_dir=str(tmp_path), target_coef=0.5)
    assert m == HSTUCostModel.from_encoder(enc, target_coef=0.5) and m.source.startswith("flops")
    assert not (tmp_path / cost_mod.CACHE_FILE).exists()

    class Bare(torch.nn.Module):
        embedding_dim = 8

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(8, 8)

    with pytest.raises(RuntimeError, match="no per-token cost"):
        HSTUCostModel.calibrate(Bare(), "cpu", 32, cache_dir=str(tmp_path))


def test_calibration_key_separates_shapes_devices_and_lengths():
    a, b = HSTUEncoder(8, 1, 1, 4, 4, 32), HSTUEncoder(8, 1, 2, 4, 4, 32)
    keys = {calibration_key(a, "cpu", 32), calibration_key(b, "cpu", 32), calibration_key(a, "cpu", 16)}
    assert len(keys) == 3
    assert calibration_key(a, "cpu", 32) == calibration_key(HSTUEncoder(8, 1, 1, 4, 4, 32), "cpu", 32)


@pytest.mark.parametrize("kw, match", [({"max_len": 1}, "max_len: must be >= 2"),
                                       ({"max_len": 64}, "max_seq_len=32"),
                                       ({"max_len": 8, "repeats": 0}, "repeats")])
def test_calibrate_bad_arguments(kw, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        HSTUCostModel.calibrate(HSTUEncoder(8, 1, 1, 4, 4, 32), "cpu", cache_dir=str(tmp_path), **kw)
    with pytest.raises(ValueError, match="embedding_dim"):
        HSTUCostModel.calibrate(torch.nn.Linear(2, 2), "cpu", 8, cache_dir=str(tmp_path))
