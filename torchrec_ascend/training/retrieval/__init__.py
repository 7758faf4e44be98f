"""Next-item retrieval: the leave-two-out split (:mod:`.split`), deterministic batches with
negatives (:mod:`.batches`), full-corpus evaluation (:mod:`.evaluator`) and the task that puts
them under the trainer (:mod:`.task`)."""

from __future__ import annotations

from .batches import BatchBuilder, BatchOrder, NegativeStream, Windows, cost_model_for
from .evaluator import Evaluator, eval_users
from .split import HOLDOUTS, Holdout, Split, hold_out, leave_one_out, leave_two_out
from .task import RetrievalTask

__all__ = ["BatchBuilder", "BatchOrder", "NegativeStream", "Windows", "cost_model_for",
           "Evaluator", "eval_users", "HOLDOUTS", "Holdout", "Split", "hold_out",
           "leave_one_out", "leave_two_out", "RetrievalTask"]
