"""Negative samplers behind one interface, each reporting its logQ correction.

Every sampler returns a :class:`NegativeSample`: the sampled ids and ``log_q``, the log of the
**expected number of times** each id appears in the sample (``log(R * q(id))`` for R draws with
replacement from ``q``; the log inclusion probability for a de-duplicated pool).  With that
convention one correction is right for every sampler and for mixtures of them: for any function
``f`` of the items, ``sum_k f(ids[k]) / exp(log_q[k])`` is an unbiased (Horvitz-Thompson)
estimate of ``sum_i f(i)`` over the whole corpus, which is what sampled softmax approximates
(its partition function) once ``log_q`` is subtracted from the logits.

Two shapes of sample:

* **shared pool** (:meth:`NegativeSampler.sample`): ``ids`` is ``[R]``, one pool for all T
  tokens of the batch, looked up once and scored with one ``[T, D] x [D, R]`` GEMM;
* **per-token** (:meth:`NegativeSampler.sample_per_token`): ``ids`` is ``[T, K]``.

``pos_log_q`` ``[T]`` is the same quantity for each token's positive (the sampled-softmax loss
subtracts it from the positive logit too, as TensorFlow's ``sampled_softmax_loss`` does).

Samplers never hide a positive by down-weighting: a sampled id equal to the token's positive
stays in the sample and the loss masks that logit to ``-inf`` (see
:class:`torchrec_ascend.sampling.loss.SampledSoftmaxLoss`).  Random numbers come only from the
``generator`` argument, so a sample is a pure function of ``(pos_ids, generator state)``.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import Callable, Dict, Literal, Optional, Tuple, Union

import torch

from ..ops.validation import INDEX_DTYPES, check_tensor
from ..options import check_choice, choices

__all__ = [
    "NegativeSample",
    "NegativeSampler",
    "UniformSampler",
    "InBatchSampler",
    "PopularitySampler",
    "MixedSampler",
    "SamplerName",
    "SAMPLER_NAMES",
    "NegativesMode",
    "NEGATIVES_MODES",
    "make_sampler",
]


@dataclass
class NegativeSample:
    """Sampled negatives and their logQ correction terms.

    Attributes:
        ids: int64 item ids, ``[R]`` (shared pool) or ``[T, K]`` (per token).
        log_q: float32, same shape as ``ids``: log expected count of each id in the sample.
        pos_log_q: float32 ``[T]``: the same quantity for each token's positive id.
    """

    ids: torch.Tensor
    log_q: torch.Tensor
    pos_log_q: torch.Tensor

    @property
    def shared(self) -> bool:
        """True for a shared pool (``ids`` is 1-D), False for per-token negatives."""
        return self.ids.dim() == 1

    @property
    def num_negatives(self) -> int:
        """R for a shared pool, K for per-token negatives."""
        return int(self.ids.shape[-1])

    def to(self, device: Union[str, torch.device], non_blocking: bool = False) -> "NegativeSample":
        """The same sample on another device."""
        return NegativeSample(
            self.ids.to(device, non_blocking=non_blocking),
            self.log_q.to(device, non_blocking=non_blocking),
            self.pos_log_q.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> "NegativeSample":
        """The same sample in pinned host memory (for an asynchronous host-to-device copy)."""
        return NegativeSample(self.ids.pin_memory(), self.log_q.pin_memory(),
                              self.pos_log_q.pin_memory())


def _check_num_items(num_items: int) -> int:
    if isinstance(num_items, bool) or not isinstance(num_items, int):
        raise ValueError(f"num_items: expected an int, got {type(num_items).__name__}")
    if num_items <= 0:
        raise ValueError(f"num_items: the item corpus must be non-empty (num_items >= 1), got {num_items}")
    return num_items


def check_count(name: str, n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise ValueError(f"{name}: expected an int, got {type(n).__name__}")
    if n <= 0:
        raise ValueError(f"{name}: must be >= 1, got {n}")
    return n


def _log_inclusion(p: torch.Tensor, draws: int) -> torch.Tensor:
    """log P(item with per-draw probability p appears in ``draws`` iid draws) = log(1-(1-p)^n)."""
    p = p.to(torch.float64).clamp(max=1.0)
    return torch.log(-torch.expm1(draws * torch.log1p(-p.clamp(max=1.0 - 1e-16)))).to(torch.float32)


class NegativeSampler(abc.ABC):
    """Common interface: ``sample`` (shared pool) and ``sample_per_token``.

    Args:
        num_items: size of the item corpus; ids are in ``[0, num_items)``.
        validate: check that ``pos_ids`` lie in ``[0, num_items)`` (reads values: a device sync
            on npu/cuda).
    """

    def __init__(self, num_items: int, validate: bool = True) -> None:
        self.num_items = _check_num_items(num_items)
        self.validate = validate

    # -- public API --------------------------------------------------------------------------
    def sample(self, pos_ids: torch.Tensor, num_negatives: int,
               generator: Optional[torch.Generator] = None) -> NegativeSample:
        """One shared pool of (at most) ``num_negatives`` ids for the whole batch.

        Args:
            pos_ids: ``[T]`` int32/int64 positive item id of every valid token.
            num_negatives: R >= 1, the pool size (in-batch pools may be smaller: the batch
                has fewer distinct items).
            generator: the source of randomness (``None``: torch's default generator).
        """
        pos_ids = self._check_pos(pos_ids)
        check_count("num_negatives", num_negatives)
        return self._sample(pos_ids, num_negatives, generator)

    def sample_per_token(self, pos_ids: torch.Tensor, num_negatives: int,
                         generator: Optional[torch.Generator] = None) -> NegativeSample:
        """``num_negatives`` = K ids for every token: ``ids`` is ``[T, K]``."""
        pos_ids = self._check_pos(pos_ids)
        check_count("num_negatives", num_negatives)
        return self._sample_per_token(pos_ids, num_negatives, generator)

    # -- implementations ---------------------------------------------------------------------
    @abc.abstractmethod
    def _sample(self, pos_ids: torch.Tensor, r: int,
                generator: Optional[torch.Generator]) -> NegativeSample: ...

    @abc.abstractmethod
    def _sample_per_token(self, pos_ids: torch.Tensor, k: int,
                          generator: Optional[torch.Generator]) -> NegativeSample: ...

    def _check_pos(self, pos_ids: torch.Tensor) -> torch.Tensor:
        check_tensor("pos_ids", pos_ids, dim=1, dtypes=INDEX_DTYPES)
        if self.validate and pos_ids.numel():
            lo, hi = int(pos_ids.min()), int(pos_ids.max())
            if lo < 0 or hi >= self.num_items:
                bad = lo if lo < 0 else hi
                raise ValueError(f"pos_ids: id {bad} out of range [0, num_items={self.num_items})")
        return pos_ids.to(torch.int64)


class _IidSampler(NegativeSampler):
    """Samplers drawing iid from a fixed distribution q over the corpus."""

    @abc.abstractmethod
    def _draw(self, n: int, device: torch.device,
              generator: Optional[torch.Generator]) -> torch.Tensor: ...

    @abc.abstractmethod
    def log_prob(self, ids: torch.Tensor) -> torch.Tensor:
        """log q(id) of one draw, float32, same shape as ``ids``."""

    def _sample(self, pos_ids, r, generator):
        ids = self._draw(r, pos_ids.device, generator)
        lr = math.log(r)
        return NegativeSample(ids, self.log_prob(ids) + lr, self.log_prob(pos_ids) + lr)

    def _sample_per_token(self, pos_ids, k, generator):
        t = pos_ids.numel()
        ids = self._draw(t * k, pos_ids.device, generator).view(t, k)
        lk = math.log(k)
        return NegativeSample(ids, self.log_prob(ids) + lk, self.log_prob(pos_ids) + lk)


class UniformSampler(_IidSampler):
    """Uniform over the corpus, with replacement: ``log_q = log(R / num_items)``."""

    def _draw(self, n, device, generator):
        return torch.randint(self.num_items, (n,), generator=generator, device=device,
                             dtype=torch.int64)

    def log_prob(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.full(ids.shape, -math.log(self.num_items), dtype=torch.float32,
                          device=ids.device)


class PopularitySampler(_IidSampler):
    """Draws with probability ``q(i) ∝ (counts[i] + smoothing) ** alpha`` (with replacement).

    Sampling is by inverse CDF (``searchsorted`` on a float64 cumulative sum), so any corpus
    size works.

    Args:
        counts: ``[num_items]`` non-negative item frequencies (e.g. training interactions).
        alpha: exponent (1: proportional to popularity; word2vec uses 0.75).
        smoothing: added to every count before the exponent, so unseen items can be drawn.
    """

    def __init__(self, counts: torch.Tensor, alpha: float = 1.0, smoothing: float = 0.0,
                 validate: bool = True) -> None:
        check_tensor("counts", counts, dim=1)
        if counts.numel() == 0:
            raise ValueError("counts: the item corpus must be non-empty (counts has 0 entries)")
        super().__init__(int(counts.numel()), validate)
        w = counts.to(torch.float64) + float(smoothing)
        if bool((w < 0).any()) or not bool(torch.isfinite(w).all()):
            raise ValueError("counts: must be finite and non-negative (after adding smoothing)")
        if alpha < 0:
            raise ValueError(f"alpha: must be >= 0, got {alpha}")
        w = w.pow(alpha) if alpha != 1.0 else w
        total = float(w.sum())
        if total <= 0:
            raise ValueError("counts: all weights are zero; give some item a positive count "
                             "or use smoothing > 0")
        self.probs = (w / total)                                   # float64 [N]
        self._cdf = torch.cumsum(self.probs, 0)
        self._cdf[-1] = 1.0
        self._log_probs = torch.log(self.probs).to(torch.float32)  # -inf for zero-weight items

    def _draw(self, n, device, generator):
        u = torch.rand(n, generator=generator, dtype=torch.float64,
                       device=generator.device if generator is not None else "cpu")
        cdf = self._cdf.to(u.device)
        ids = torch.searchsorted(cdf, u, right=True).clamp_(max=self.num_items - 1)
        return ids.to(device)

    def log_prob(self, ids: torch.Tensor) -> torch.Tensor:
        return self._log_probs.to(ids.device)[ids]


class InBatchSampler(NegativeSampler):
    """The batch's own (de-duplicated) positive items as negatives.

    The pool is ``unique(pos_ids)``; when it holds more than R items, R of them are kept,
    chosen uniformly without replacement.  ``log_q`` is the log probability that the item is in
    the pool: the batch is modelled as T iid draws from the item distribution p, so an item is in
    it with probability ``1 - (1 - p)^T``, times ``R / U`` when the U distinct items are
    subsampled to R (an approximation: U varies between batches).

    p comes from ``counts`` when given (the popularity of the training data: exact), else from
    the batch itself (``count_in_batch / T``: the usual streaming estimate).

    Args:
        num_items: corpus size.
        counts: optional ``[num_items]`` item frequencies of the training stream.
    """

    def __init__(self, num_items: int, counts: Optional[torch.Tensor] = None,
                 validate: bool = True) -> None:
        super().__init__(num_items, validate)
        self.probs: Optional[torch.Tensor] = None
        if counts is not None:
            check_tensor("counts", counts, dim=1)
            if counts.numel() != num_items:
                raise ValueError(f"counts: expected {num_items} entries (num_items), got {counts.numel()}")
            c = counts.to(torch.float64)
            if bool((c < 0).any()) or float(c.sum()) <= 0:
                raise ValueError("counts: must be non-negative with a positive sum")
            self.probs = c / c.sum()

    def log_inclusion(self, pos_ids: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """log P(id in this batch's de-duplicated pool, before subsampling), for any ``ids``.

        Ids absent from the batch get ``-inf`` under the batch estimate (no ``counts``).
        """
        t = pos_ids.numel()
        if self.probs is not None:
            return _log_inclusion(self.probs.to(ids.device)[ids], t)
        if t == 0:
            return torch.full(ids.shape, -math.inf, dtype=torch.float32, device=ids.device)
        uniq, counts = torch.unique(pos_ids, return_counts=True)
        pos = torch.searchsorted(uniq, ids).clamp_(max=uniq.numel() - 1)
        hit = uniq[pos] == ids
        c = torch.where(hit, counts[pos], torch.zeros_like(counts[pos]))
        return _log_inclusion(c.to(torch.float64) / t, t)

    def _pool(self, pos_ids: torch.Tensor, r: int,
              generator: Optional[torch.Generator]) -> Tuple[torch.Tensor, float]:
        """(pool ids, log of the subsampling rate R/U (0 when not subsampled))."""
        uniq = torch.unique(pos_ids)
        u = uniq.numel()
        if u <= r:
            return uniq, 0.0
        perm = torch.randperm(u, generator=generator,
                              device=generator.device if generator is not None else "cpu")
        return uniq[perm[:r].to(uniq.device)], math.log(r / u)

    def _sample(self, pos_ids, r, generator):
        if pos_ids.numel() == 0:
            raise ValueError("pos_ids: in-batch sampling needs at least one token (got T=0)")
        ids, log_rate = self._pool(pos_ids, r, generator)
        return NegativeSample(ids, self.log_inclusion(pos_ids, ids) + log_rate,
                              self.log_inclusion(pos_ids, pos_ids) + log_rate)

    def _sample_per_token(self, pos_ids, k, generator):
        """K draws (with replacement) from the batch's tokens: ``log_q = log(K * c / T)``."""
        t = pos_ids.numel()
        if t == 0:
            raise ValueError("pos_ids: in-batch sampling needs at least one token (got T=0)")
        j = torch.randint(t, (t * k,), generator=generator,
                          device=generator.device if generator is not None else "cpu")
        ids = pos_ids[j.to(pos_ids.device)].view(t, k)
        if self.probs is not None:
            p_ids, p_pos = self.probs.to(ids.device)[ids], self.probs.to(ids.device)[pos_ids]
        else:
            uniq, counts = torch.unique(pos_ids, return_inverse=False, return_counts=True)
            p_ids = counts[torch.searchsorted(uniq, ids)].to(torch.float64) / t
            p_pos = counts[torch.searchsorted(uniq, pos_ids)].to(torch.float64) / t
        lk = math.log(k)
        return NegativeSample(ids, (torch.log(p_ids) + lk).to(torch.float32),
                              (torch.log(p_pos) + lk).to(torch.float32))


class MixedSampler(NegativeSampler):
    """Mixed negative sampling (Yi et al., RecSys 2019): in-batch pool + uniform draws.

    The shared pool is the in-batch pool (at most ``num_negatives - num_uniform`` ids) followed
    by ``num_uniform`` uniform draws.  An id's expected count in the pool is the sum over the two
    sources, so ``log_q = logaddexp(in_batch_log_q, log(num_uniform / N))`` for every pool entry
    (and for the positives).

    Args:
        num_items: corpus size.
        uniform_fraction: share of R drawn uniformly (used when ``num_uniform`` is None).
        num_uniform: exact number of uniform draws per pool (overrides the fraction).
        counts: optional item frequencies for the in-batch part (see :class:`InBatchSampler`).
    """

    def __init__(self, num_items: int, uniform_fraction: float = 0.5,
                 num_uniform: Optional[int] = None, counts: Optional[torch.Tensor] = None,
                 validate: bool = True) -> None:
        super().__init__(num_items, validate)
        if not 0.0 <= uniform_fraction <= 1.0:
            raise ValueError(f"uniform_fraction: must be in [0, 1], got {uniform_fraction}")
        if num_uniform is not None and (isinstance(num_uniform, bool) or num_uniform < 0):
            raise ValueError(f"num_uniform: must be >= 0, got {num_uniform}")
        self.uniform_fraction = uniform_fraction
        self.num_uniform = num_uniform
        self.in_batch = InBatchSampler(num_items, counts=counts, validate=False)
        self.uniform = UniformSampler(num_items, validate=False)

    def _split(self, r: int) -> Tuple[int, int]:
        n_u = self.num_uniform if self.num_uniform is not None else int(round(r * self.uniform_fraction))
        if n_u > r:
            raise ValueError(f"num_uniform: {n_u} exceeds num_negatives={r}")
        return r - n_u, n_u

    def _combine(self, pos_ids, ids_b, log_rate_b, ids_u, n_u) -> NegativeSample:
        ids = torch.cat([ids_b, ids_u])

        def lq(x: torch.Tensor) -> torch.Tensor:
            lb = self.in_batch.log_inclusion(pos_ids, x) + log_rate_b
            if n_u == 0:
                return lb
            return torch.logaddexp(lb, self.uniform.log_prob(x) + math.log(n_u))

        return NegativeSample(ids, lq(ids), lq(pos_ids))

    def _sample(self, pos_ids, r, generator):
        n_b, n_u = self._split(r)
        if n_b > 0 and pos_ids.numel():
            ids_b, log_rate = self.in_batch._pool(pos_ids, n_b, generator)
        else:
            ids_b, log_rate = pos_ids.new_empty(0), -math.inf
        ids_u = self.uniform._draw(n_u, pos_ids.device, generator)
        return self._combine(pos_ids, ids_b, log_rate, ids_u, n_u)

    def _sample_per_token(self, pos_ids, k, generator):
        """Per token: ``k - k_u`` in-batch draws and ``k_u`` uniform draws, each with replacement."""
        k_b, k_u = self._split(k)
        t = pos_ids.numel()
        parts = []
        if k_b:
            parts.append(self.in_batch._sample_per_token(pos_ids, k_b, generator).ids)
        if k_u:
            parts.append(self.uniform._draw(t * k_u, pos_ids.device, generator).view(t, k_u))
        ids = torch.cat(parts, dim=1) if parts else pos_ids.new_empty(t, 0)
        # expected count of id x among one token's k draws: k_b * c(x)/T + k_u / N
        uniq, counts = torch.unique(pos_ids, return_counts=True)

        def lq(x: torch.Tensor) -> torch.Tensor:
            if self.in_batch.probs is not None:
                pb = self.in_batch.probs.to(x.device)[x]
            else:
                pos = torch.searchsorted(uniq, x).clamp_(max=uniq.numel() - 1)
                pb = torch.where(uniq[pos] == x, counts[pos], torch.zeros_like(counts[pos])).to(torch.float64) / t
            return torch.log(k_b * pb + k_u / self.num_items).to(torch.float32)

        return NegativeSample(ids, lq(ids), lq(pos_ids))


SamplerName = Literal["uniform", "in_batch", "mixed", "popularity"]
"""The samplers :func:`make_sampler` builds by name (``train.sampler``)."""
SAMPLER_NAMES = choices(SamplerName)

NegativesMode = Literal["shared", "per_position"]
"""How a training step draws negatives (``train.negatives``): one pool shared by every query of
the step, or ``num_negatives`` drawn for each query position on its own (Meta's reference)."""
NEGATIVES_MODES = choices(NegativesMode)


def _popularity(num_items: int, counts: Optional[torch.Tensor], **kwargs: object) -> NegativeSampler:
    if counts is None:
        raise ValueError("counts: the popularity sampler needs item counts")
    if counts.numel() != num_items:
        raise ValueError(f"counts: expected {num_items} entries (num_items), got {counts.numel()}")
    return PopularitySampler(counts, **kwargs)


_BUILDERS: Dict[str, Callable[..., NegativeSampler]] = {
    "uniform": lambda n, counts, **kw: UniformSampler(n, **kw),
    "in_batch": lambda n, counts, **kw: InBatchSampler(n, counts=counts, **kw),
    "mixed": lambda n, counts, **kw: MixedSampler(n, counts=counts, **kw),
    "popularity": _popularity,
}


def make_sampler(name: SamplerName, num_items: int, counts: Optional[torch.Tensor] = None,
                 **kwargs: object) -> NegativeSampler:
    """Build a sampler by name (:data:`SAMPLER_NAMES`).

    ``counts`` (item frequencies) is required for ``popularity`` and optional for the in-batch
    based samplers; ``kwargs`` go to the sampler's constructor.
    """
    check_choice("name", name, SamplerName)
    return _BUILDERS[name](num_items, counts, **kwargs)
