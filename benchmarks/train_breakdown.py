"""Time per training step split into its parts, for ``benchmarks/train.py``.

Two sources, both from the same run:

* the pipeline's stage record of every step (``semi_async`` at staleness 0, synchronous, which
  times ``lookup``, ``sparse_bwd``, ``dense_fwd``, ``dense_bwd``, ``optimizer`` separately):
  embedding lookup + update = ``lookup`` + ``sparse_bwd`` (the fused row-wise Adagrad runs
  inside the sparse backward), optimizer = ``optimizer`` (AdamW + clipping);
* the dense parts timed on their own, on the batches the run really trained (their offsets are
  recorded by a forward pre-hook on the model's head), in the run's compute dtype, forward +
  backward (``torch.autograd.grad``: no accumulation into the inputs' ``.grad``, which a training
  step does not do either), with ``torch.utils.benchmark`` (``benchmarks/side_by_side.py``):
  **attention** (the fused ``hstu_mha`` op of every layer), **projections** (the UVQK and output matmuls of every
  layer, or for SASRec nothing: its encoder is counted in overhead), **sampled softmax** (the
  model's own loss module on the batch's queries and the shared pool).

``overhead`` = mean step wall time - the parts above: LayerNorms, SiLU, dropout, residuals,
dtype casts under autocast, autograd and pipeline bookkeeping, batch building and copy.
"""

from __future__ import annotations

import statistics
from typing import Callable, Dict, List, Sequence

import torch

from benchmarks.side_by_side import interleaved
from torchrec_ascend.modules.projection import project
from torchrec_ascend.ops.hstu import hstu_mha
from torchrec_ascend.sampling import NegativeSample

__all__ = ["OffsetsRecorder", "StageTimes", "dense_part_fns", "breakdown"]


class OffsetsRecorder:
    """Keeps the offsets of the last ``keep`` batches the model's head saw (forward pre-hook)."""

    def __init__(self, head: torch.nn.Module, keep: int = 3) -> None:
        self.keep, self.offsets = keep, []  # type: ignore[var-annotated]
        self.handle = head.register_forward_pre_hook(self._hook)

    def _hook(self, _module: torch.nn.Module, args: tuple) -> None:
        self.offsets.append(args[1].offsets.detach().clone())
        del self.offsets[:-self.keep]

    def close(self) -> None:
        self.handle.remove()


class StageTimes:
    """The pipeline's per-stage milliseconds of every recorded step (``step_row``'s
    ``stage_ms/<stage>`` entries of ``pipeline.last_stats``)."""

    def __init__(self) -> None:
        self.ms: Dict[str, List[float]] = {}

    def record(self, pipeline) -> None:
        """Add the stage times of the step ``pipeline`` ran last."""
        from torchrec_ascend.training.pipelines import step_row

        for k, v in step_row(pipeline.last_stats).items():
            if k.startswith("stage_ms/"):
                self.ms.setdefault(k[len("stage_ms/"):], []).append(v)

    def means(self) -> Dict[str, float]:
        """Mean ms per step of every stage."""
        return {k: statistics.mean(v) for k, v in self.ms.items()}


def _attention(enc, offsets: torch.Tensor, dtype: torch.dtype, g: torch.Generator) -> Callable[[], None]:
    T, H = int(offsets[-1]), enc.num_heads
    dqk, dv, n = enc.attention_dim, enc.linear_dim, enc.max_seq_len
    q, k = (torch.randn(T, H, dqk, generator=g).to(dtype).requires_grad_() for _ in range(2))
    v = torch.randn(T, H, dv, generator=g).to(dtype).requires_grad_()
    pos_w = (0.02 * torch.randn(2 * n - 1, generator=g)).to(dtype).requires_grad_()
    ts_w = (0.02 * torch.randn(129, generator=g)).to(dtype).requires_grad_()
    ts = torch.cumsum(torch.randint(1, 3600, (T,), generator=g), 0)
    grad = torch.randn(T, H, dv, generator=g).to(dtype)

    def run() -> None:
        for _ in range(enc.num_layers):
            out = hstu_mha(q, k, v, offsets, max_seq_len=n, alpha=dqk ** -0.5, pos_w=pos_w,
                           ts_w=ts_w, timestamps=ts)
            torch.autograd.grad(out, (q, k, v, pos_w, ts_w), grad)  # no accumulation into .grad
    return run


def _projections(enc, offsets: torch.Tensor, dtype: torch.dtype,
                 g: torch.Generator) -> Callable[[], None]:
    T, D, H = int(offsets[-1]), enc.embedding_dim, enc.num_heads
    width = H * (2 * enc.linear_dim + 2 * enc.attention_dim)
    x = torch.randn(T, D, generator=g).to(dtype).requires_grad_()
    a = torch.randn(T, H * enc.linear_dim, generator=g).to(dtype).requires_grad_()
    w1 = (0.02 * torch.randn(D, width, generator=g)).to(dtype).requires_grad_()
    w2 = (0.02 * torch.randn(H * enc.linear_dim, D, generator=g)).to(dtype).requires_grad_()
    g1 = torch.randn(T, width, generator=g).to(dtype)
    g2 = torch.randn(T, D, generator=g).to(dtype)

    def run() -> None:
        for _ in range(enc.num_layers):  # as HSTUBlock multiplies them
            torch.autograd.grad(project(x, w1), (x, w1), g1)
            torch.autograd.grad(project(a, w2), (a, w2), g2)
    return run


def _softmax(head, offsets: torch.Tensor, num_negatives: int, num_items: int,
             g: torch.Generator) -> Callable[[], None]:
    B, T, D = offsets.numel() - 1, int(offsets[-1]), head.embedding_dim
    Q = T - B
    query = torch.randn(Q, D, generator=g).requires_grad_()
    pos = torch.randn(Q, D, generator=g).requires_grad_()
    neg = torch.randn(num_negatives, D, generator=g).requires_grad_()
    sample = NegativeSample(torch.randint(0, num_items, (num_negatives,), generator=g),
                            torch.full((num_negatives,), -3.0), torch.full((Q,), -3.0))
    pos_ids = torch.randint(0, num_items, (Q,), generator=g)

    def run() -> None:
        torch.autograd.grad(head.loss_fn(query, pos_ids, pos, sample, neg), (query, pos, neg))
    return run


def dense_part_fns(head, offsets_list: Sequence[torch.Tensor], dtype: torch.dtype,
                   num_negatives: int, num_items: int) -> Dict[str, Callable[[], None]]:
    """``{part: fn}``: each fn runs forward + backward of that part on every recorded batch."""
    g = torch.Generator().manual_seed(0)
    parts: Dict[str, List[Callable[[], None]]] = {"sampled_softmax": []}
    if head.kind == "hstu":
        parts.update(attention=[], projections=[])
    for off in offsets_list:
        off = off.to(torch.int64)
        parts["sampled_softmax"].append(_softmax(head, off, num_negatives, num_items, g))
        if head.kind == "hstu":
            parts["attention"].append(_attention(head.encoder, off, dtype, g))
            parts["projections"].append(_projections(head.encoder, off, dtype, g))

    def each(fns: List[Callable[[], None]]) -> Callable[[], None]:
        def run() -> None:
            for fn in fns:
                fn()
        return run
    return {name: each(fns) for name, fns in parts.items()}


def breakdown(step_ms: float, stage_ms: Dict[str, float], head, offsets_list, dtype: torch.dtype,
              num_negatives: int, num_items: int, min_run_time: float = 0.2) -> Dict[str, float]:
    """``breakdown_ms`` of one contender: mean ms per step of every part (module docstring)."""
    fns = dense_part_fns(head, offsets_list, dtype, num_negatives, num_items)
    times = interleaved(fns, rounds=1, min_run_time=min_run_time)
    per = {name: t["ms"] / len(offsets_list) for name, t in times.items()}
    out = {"attention": per.get("attention", 0.0), "projections": per.get("projections", 0.0),
           "embedding_lookup_update": stage_ms.get("lookup", 0.0) + stage_ms.get("sparse_bwd", 0.0),
           "sampled_softmax": per["sampled_softmax"], "optimizer": stage_ms.get("optimizer", 0.0)}
    out["overhead"] = step_ms - sum(out.values())
    out["step"] = step_ms
    return out
