"""Retrieval metrics (HR@K, NDCG@K, MRR with history filtering), ranking metrics (AUC, GAUC,
NE, log loss; exact over a split) and FLOP counting / MFU.  Torch and numpy only (no torchrec)."""

from __future__ import annotations

from .flops import (
    device_peak_flops,
    measure_peak_gemm_flops,
    mfu,
    sampled_softmax_flops,
    sasrec_forward_flops,
    training_flops,
)
from .ranking import auc, gauc, log_loss, normalized_entropy, ranking_metrics, regression_metrics
from .retrieval import (DEFAULT_KS, NonFiniteScoreError, RetrievalMetrics, check_finite_scores,
                        filter_history, metrics_from_ranks, target_ranks)

__all__ = [
    "DEFAULT_KS", "NonFiniteScoreError", "RetrievalMetrics", "check_finite_scores",
    "device_peak_flops", "filter_history",
    "measure_peak_gemm_flops", "metrics_from_ranks", "mfu", "sampled_softmax_flops",
    "sasrec_forward_flops", "target_ranks", "training_flops",
    "auc", "gauc", "log_loss", "normalized_entropy", "ranking_metrics", "regression_metrics",
]
