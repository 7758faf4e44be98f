"""Per-sequence cost of an HSTU training step: ``c(n) = a * n + b * n**2 + target_coef * t``.

``n`` is the sequence's token count, ``t`` its number of target (candidate) tokens.  ``a`` and ``b``
come from one of three places:

* given: ``HSTUCostModel(a, b, target_coef)``;
* :meth:`HSTUCostModel.from_flops`: the matmul FLOPs of :func:`torchrec_ascend.modules.hstu.hstu_flops`
  (forward + backward = 3x forward), no measurement;
* :meth:`HSTUCostModel.calibrate`: a short timed forward + backward of the real encoder on the
  running device (about ten batch shapes, a few seconds), fitted by non-negative weighted least
  squares ``t = c0 + a * tokens + b * sum(n**2)``; ``c0`` is the per-step overhead every rank pays
  and is not part of a sequence's cost.  Results are cached in a JSON file keyed by device, thread
  count, torch version, encoder shape, dtype and ``max_len``.

Only ratios of costs matter to the balancer, so the units (seconds, FLOPs) are free.  Costs are
host arithmetic: :meth:`HSTUCostModel.cost` returns a float64 tensor on the CPU (NPUs have little
float64 support, and the plan is made on the host anyway).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import math
import os
import platform
import re
import time
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from ... import device as _device

__all__ = ["HSTUCostModel", "default_cache_dir", "calibration_key"]

ENV_CACHE_DIR = "TORCHREC_ASCEND_CACHE_DIR"
CACHE_FILE = "hstu_cost.json"
_SHAPE_ATTRS = ("num_layers", "embedding_dim", "num_heads", "attention_dim", "linear_dim", "max_seq_len")


def default_cache_dir() -> str:
    """``$TORCHREC_ASCEND_CACHE_DIR``, else ``$XDG_CACHE_HOME/torchrec_ascend``, else
    ``~/.cache/torchrec_ascend``."""
    env = os.environ.get(ENV_CACHE_DIR)
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torchrec_ascend")


def _check_lengths(name: str, t: torch.Tensor) -> np.ndarray:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a Tensor, got {type(t).__name__}")
    if t.dim() != 1:
        raise ValueError(f"{name}: expected a 1-D tensor, got shape {tuple(t.shape)}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name}: expected an integer dtype, got {t.dtype}")
    a = t.detach().to("cpu", torch.int64).numpy()
    if a.size and int(a.min()) < 0:
        raise ValueError(f"{name}: must be >= 0, got min {int(a.min())}")
    return a


@dataclasses.dataclass(frozen=True)
class HSTUCostModel:
    """``c(n, t) = a * n + b * n**2 + target_coef * t`` per sequence (all coefficients >= 0).

    ``source`` says where the coefficients came from (``"given"``, ``"flops"``, ``"measured ..."``)
    and ``fit`` holds the calibration's details (overhead ``c0``, relative RMS error, points); they
    do not take part in equality."""

    a: float
    b: float
    target_coef: float = 0.0
    source: str = dataclasses.field(default="given", compare=False)
    fit: Optional[Dict[str, object]] = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("a", "b", "target_coef"):
            v = float(getattr(self, name))
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"{name}: must be a finite number >= 0, got {v}")
            object.__setattr__(self, name, v)
        if self.a == 0.0 and self.b == 0.0:
            raise ValueError("a, b: at least one must be > 0 (every sequence would cost 0)")

    # ------------------------------------------------------------------ cost
    def cost(self, lengths: torch.Tensor, num_targets: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Cost of each sequence: ``lengths [B]`` (integer, >= 0) and optional ``num_targets [B]``
        (``0 <= num_targets <= lengths``) -> float64 ``[B]`` on the CPU."""
        n = _check_lengths("lengths", lengths)  # host numpy: small arrays
        t = None
        if num_targets is not None:
            t = _check_lengths("num_targets", num_targets)
            if t.shape != n.shape:
                raise ValueError(f"num_targets: shape {tuple(t.shape)} != lengths shape {tuple(n.shape)}")
            if t.size and bool((t > n).any()):
                raise ValueError("num_targets: a sequence has more targets than tokens "
                                 "(num_targets > lengths)")
        return torch.from_numpy(self.cost_host(n, t))

    def cost_host(self, lengths: np.ndarray, num_targets: Optional[np.ndarray] = None) -> np.ndarray:
        """:meth:`cost` of already checked host arrays (int64 ``lengths [B] >= 0``, optional
        ``0 <= num_targets <= lengths``) -> float64 ``[B]``, without the checks (for callers that
        made them, e.g. the all_to_all balancer)."""
        n = lengths.astype(np.float64)
        c = n * self.a + n * n * self.b
        if num_targets is not None:
            c = c + num_targets.astype(np.float64) * self.target_coef
        return c

    # ------------------------------------------------------------------ FLOPs
    @classmethod
    def from_flops(cls, num_layers: int, embedding_dim: int, num_heads: int, attention_dim: int,
                   linear_dim: int, *, backward: bool = True, target_coef: float = 0.0) -> "HSTUCostModel":
        """FLOP-proportional coefficients of an HSTU stack (the formula of
        :func:`~torchrec_ascend.modules.hstu.hstu_flops`, per layer: ``n`` tokens cost
        ``2nDH(2dv + 2dqk) + 2nHdvD`` in the projections and ``n(n + 1)H(dqk + dv)`` in attention);
        ``backward=True`` counts forward + backward as 3x forward."""
        for name, v in (("num_layers", num_layers), ("embedding_dim", embedding_dim),
                        ("num_heads", num_heads), ("attention_dim", attention_dim),
                        ("linear_dim", linear_dim)):
            if int(v) < 1:
                raise ValueError(f"{name}: must be >= 1, got {v}")
        L, D, H, dqk, dv = (int(num_layers), int(embedding_dim), int(num_heads), int(attention_dim),
                            int(linear_dim))
        mult = L * (3 if backward else 1)
        attn = H * (dqk + dv)
        a = mult * (2 * D * H * (2 * dv + 2 * dqk) + 2 * H * dv * D + attn)
        b = mult * attn
        return cls(float(a), float(b), target_coef, source="flops")

    @classmethod
    def from_encoder(cls, encoder: nn.Module, *, backward: bool = True,
                     target_coef: float = 0.0) -> "HSTUCostModel":
        """:meth:`from_flops` with the shape of an :class:`~torchrec_ascend.modules.hstu.HSTUEncoder`."""
        missing = [a for a in _SHAPE_ATTRS[:5] if not hasattr(encoder, a)]
        if missing:
            raise ValueError(f"encoder: {type(encoder).__name__} lacks {missing} (expected an HSTUEncoder)")
        return cls.from_flops(*(getattr(encoder, a) for a in _SHAPE_ATTRS[:5]), backward=backward,
                              target_coef=target_coef)

    # ------------------------------------------------------------------ calibration
    @classmethod
    def calibrate(cls, encoder: nn.Module, device: "torch.device | str", max_len: int, cache: bool = True,
                  *, target_coef: float = 0.0, cache_dir: Optional[str] = None,
                  repeats: int = 3, refresh: bool = False) -> "HSTUCostModel":
        """Time forward + backward of (a copy of) ``encoder`` on ``device`` for about ten batch
        shapes with sequence lengths up to ``max_len``, fit ``a`` and ``b`` (non-negative, relative
        least squares) and return the model; with ``cache=True`` a result stored under the same
        :func:`calibration_key` is returned without measuring (unless ``refresh``), and a new one
        is stored; ``cache=False`` neither reads nor writes the cache.

        ``encoder`` is called as ``encoder(x [T, D], offsets [B + 1], timestamps [T])`` and must
        have ``embedding_dim``; it is deep-copied, so its parameters and gradients are untouched.
        Each shape runs once to warm up and ``repeats`` times; the fastest run counts (the least
        disturbed by other work on the machine).  If the timings do not grow with the token count
        (the fitted per-sequence part is under 1% of every measured time: noise), it warns and
        returns :meth:`from_encoder` (uncached), or raises
        ``RuntimeError`` for an encoder without the HSTU shape attributes."""
        if int(max_len) < 2:
            raise ValueError(f"max_len: must be >= 2, got {max_len}")
        if int(repeats) < 1:
            raise ValueError(f"repeats: must be >= 1, got {repeats}")
        dim = getattr(encoder, "embedding_dim", None)
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"encoder: needs an int attribute embedding_dim, got {dim!r}")
        limit = getattr(encoder, "max_seq_len", None)
        if isinstance(limit, int) and int(max_len) > limit:
            raise ValueError(f"max_len: {max_len} > the encoder's max_seq_len={limit}")
        dev = torch.device(device)
        key = calibration_key(encoder, dev, int(max_len))
        path = os.path.join(cache_dir or default_cache_dir(), CACHE_FILE)
        if cache and not refresh:
            hit = _read_cache(path).get(key)
            if hit is not None:
                return cls(hit["a"], hit["b"], target_coef, source=f"cached {key}", fit=hit)
        points = _measure(encoder, dev, int(max_len), int(repeats))
        c0, a, b, rel_rms = _fit(points)
        fit = {"a": a, "b": b, "c0": c0, "rel_rms": rel_rms, "points": points,
               "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        signal = max((a * p["tokens"] + b * p["pairs"]) / p["s"] for p in points)
        if signal < 0.01:  # the times did not grow with the tokens: noise (a loaded machine)
            if not all(hasattr(encoder, n) for n in _SHAPE_ATTRS[:5]):
                raise RuntimeError(f"calibration found no per-token cost (fit {fit}); pass a and b instead")
            warnings.warn(f"HSTUCostModel.calibrate: the timings did not grow with the token count "
                          f"(relative RMS {rel_rms:.2f}); using the FLOP model instead (not cached)")
            flops = cls.from_encoder(encoder, target_coef=target_coef)
            return cls(flops.a, flops.b, target_coef, source="flops (calibration failed)", fit=fit)
        if cache:
            _write_cache(path, key, fit)
        return cls(a, b, target_coef, source=f"measured {key}", fit=fit)


# ---------------------------------------------------------------------- calibration helpers
def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.M)
    except OSError:
        m = None
    return m.group(1).strip() if m else (platform.processor() or platform.machine())


def _device_name(dev: torch.device) -> str:
    if dev.type == "cpu":
        return f"cpu:{_cpu_name()}:threads={torch.get_num_threads()}"
    get_name = getattr(_device.device_module(dev), "get_device_name", None)
    return f"{dev.type}:{get_name(dev) if get_name else 'unknown'}"


def calibration_key(encoder: nn.Module, device: "torch.device | str", max_len: int) -> str:
    """The cache key of a calibration: device (and CPU thread count), torch version, encoder class
    and shape attributes, a hash of its parameter shapes and dtypes, and ``max_len``."""
    dev = torch.device(device)
    shape = ",".join(f"{a}={getattr(encoder, a)}" for a in _SHAPE_ATTRS if hasattr(encoder, a))
    params = [(n, tuple(p.shape), str(p.dtype)) for n, p in encoder.named_parameters()]
    digest = hashlib.sha1(repr(params).encode()).hexdigest()[:12]
    return (f"{_device_name(dev)}|torch={torch.__version__}|{type(encoder).__name__}({shape})"
            f"|params={digest}|max_len={int(max_len)}")


def _shapes(max_len: int) -> List[Tuple[int, int]]:
    """(sequence length, sequences) pairs: 5 lengths from max_len/16 to max_len, each at about
    2 * max_len and 4 * max_len tokens (so the token and pair terms vary independently)."""
    lo = max(2, max_len // 16)
    ns = sorted({int(round(lo * (max_len / lo) ** (i / 4))) for i in range(5)})
    out = []
    for n in ns:
        k = max(1, round(2 * max_len / n))
        out += [(n, k), (n, 2 * k)]
    return out


def _measure(encoder: nn.Module, dev: torch.device, max_len: int, repeats: int) -> List[Dict[str, float]]:
    model = copy.deepcopy(encoder).to(dev).train()
    dtype = next(model.parameters()).dtype
    g = torch.Generator().manual_seed(0)
    points = []
    for n, k in _shapes(max_len):
        offsets = (torch.arange(k + 1, dtype=torch.int64) * n).to(dev)
        tokens = n * k
        x = torch.randn(tokens, model.embedding_dim, generator=g, dtype=dtype).to(dev)
        ts = torch.cumsum(torch.randint(1, 10_000, (tokens,), generator=g), 0).to(dev)
        best = math.inf
        for i in range(repeats + 1):
            xi = x.clone().requires_grad_(True)
            _device.synchronize(dev)
            t0 = time.perf_counter()
            model(xi, offsets, ts).sum().backward()
            _device.synchronize(dev)
            if i:  # the first run warms up
                best = min(best, time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
        points.append({"n": n, "k": k, "tokens": float(tokens), "pairs": float(k * n * n), "s": best})
    return points


def _fit(points: Sequence[Dict[str, float]]) -> Tuple[float, float, float, float]:
    """Non-negative least squares of ``s = c0 + a * tokens + b * pairs`` with relative weights
    (every subset of free coefficients is solved; the best feasible one wins).  Returns
    ``(c0, a, b, relative RMS error)``."""
    X = torch.tensor([[1.0, p["tokens"], p["pairs"]] for p in points], dtype=torch.float64)
    y = torch.tensor([p["s"] for p in points], dtype=torch.float64)
    w = 1.0 / y
    scale = X.abs().amax(0)  # conditioning: columns to unit scale
    Xw, yw = X / scale * w[:, None], y * w
    best: Tuple[float, torch.Tensor] = (math.inf, torch.zeros(3, dtype=torch.float64))
    for r in range(1, 4):
        for cols in itertools.combinations(range(3), r):
            sol = torch.linalg.lstsq(Xw[:, list(cols)], yw[:, None]).solution[:, 0]
            if bool((sol < 0).any()):
                continue
            coef = torch.zeros(3, dtype=torch.float64)
            coef[list(cols)] = sol
            err = float(((Xw @ coef - yw) ** 2).mean())
            if err < best[0]:
                best = (err, coef)
    coef = best[1] / scale
    return float(coef[0]), float(coef[1]), float(coef[2]), math.sqrt(best[0])


def _read_cache(path: str) -> Dict[str, Dict[str, object]]:
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return {}  # absent or unreadable: measure again (and rewrite it)
    return doc if isinstance(doc, dict) else {}


def _write_cache(path: str, key: str, fit: Dict[str, object]) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    doc = _read_cache(path)
    doc[key] = fit
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)
