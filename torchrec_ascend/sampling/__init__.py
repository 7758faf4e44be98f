"""Negative sampling for generative retrieval: samplers, sampled softmax with a shared negative
pool (intra-batch logit sharing), half-precision logits, asynchronous prefetch.  Torch only.

Quick start (T valid tokens of a jagged batch, D-dim embeddings, corpus of N items)::

    from torchrec_ascend.sampling import (MixedSampler, SampledSoftmaxLoss,
                                          AsyncNegativePrefetcher)

    sampler = MixedSampler(num_items=N, uniform_fraction=0.5)   # or UniformSampler(N),
                                  # InBatchSampler(N), PopularitySampler(counts), make_sampler(...)
    neg = sampler.sample(pos_ids, num_negatives=R, generator=g)  # NegativeSample:
                                  # ids [R], log_q [R], pos_log_q [T]
    loss_fn = SampledSoftmaxLoss(temperature=0.05, l2_normalize=True, logq_correction=True,
                                 half_precision=None)           # or "fp16" / "bf16"
    loss = loss_fn(query,            # [T, D] model outputs at valid tokens (jagged values)
                   pos_ids,          # [T] next-item ids
                   pos_emb,          # [T, D] = item_emb(pos_ids)
                   neg, item_emb(neg.ids))   # [R, D]: the pool, looked up once
    # optional: extra_negatives=sampler.sample_per_token(pos_ids, K, g), extra_neg_emb [T, K, D];
    # valid_mask [T] bool for padded rows; neg_mask [T, R] bool for more false negatives.

    # one step ahead, in the background (a thread on cpu, a side stream on npu/cuda):
    with AsyncNegativePrefetcher(sampler, num_negatives=R, lookup_fn=item_emb, seed=0,
                                 lookup_in_background=False) as pf:
        for batch, n in pf.prefetch(loader, lambda b: b.pos_ids):
            loss = loss_fn(q, pos_ids, pos_emb, n.negatives, n.neg_emb)

Conventions: ``log_q`` is the log *expected count* of an id in the sample (``log(R q)`` for R
draws with replacement, the log inclusion probability for de-duplicated in-batch pools), so
mixtures add counts.  A negative equal to the token's positive is masked exactly (its logit
contributes exp(.) == 0), never down-weighted.  See docs/sampling.md.
"""

from __future__ import annotations

from .loss import MASKED_LOGIT, SampledSoftmaxLoss, sampled_softmax_loss
from .offload import AsyncNegativePrefetcher, PrefetchedNegatives, step_generator
from .quant import HALF_DTYPES, QuantizedRows, half_gemm_is_fast, half_logits, quantize_rows
from .samplers import (NEGATIVES_MODES, SAMPLER_NAMES, InBatchSampler, MixedSampler,
                       NegativesMode, NegativeSample, NegativeSampler, PopularitySampler,
                       SamplerName, UniformSampler, make_sampler)

__all__ = [
    "NegativeSample", "NegativeSampler", "UniformSampler", "InBatchSampler", "MixedSampler",
    "PopularitySampler", "SamplerName", "SAMPLER_NAMES", "NegativesMode", "NEGATIVES_MODES",
    "make_sampler",
    "SampledSoftmaxLoss", "sampled_softmax_loss", "MASKED_LOGIT",
    "HALF_DTYPES", "QuantizedRows", "quantize_rows", "half_logits", "half_gemm_is_fast",
    "AsyncNegativePrefetcher", "PrefetchedNegatives", "step_generator",
]
