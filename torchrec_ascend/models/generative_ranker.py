"""The multi-task HSTU ranker: a user's history of impressions with their actions, contextual
user features and candidates under the target-aware mask, scored for every task.

    model = GenerativeRanker(RankerSpec(...), ModelConfig(embedding_dim=64), tasks=..., layout=...)
    loss, (loss_value, stats) = model(batch)          # batch: RankingBatch
    logits = model.predict(batch)                     # [candidates, tasks]

**Tokens** of one example (one user, :class:`RankingBatch`)::

    [user] [user features] | history ... | candidates ...
     contextual (C tokens)   H tokens      K tokens: num_targets = K

* an *item token* (history or candidate) sums the item's embedding, its side features' (e.g.
  KuaiRand's author, music, tag, duration) and the impression's context (tab, hour, ...): what
  was known when it was served;
* its *action* (the 8 label bits through a linear map, plus the outcomes, e.g. the watch time
  bucket) is known for history only.  ``layout="summed"`` adds it to the history item token
  (H = history length); ``"interleaved"`` puts it in a token of its own after the item (HSTU's
  and NVIDIA's interleaving; H = 2 x history length);
* a learned *role* vector marks history items, candidates and action tokens;
* the contextual tokens are the user's id embedding and the sum of the user's side features';
* optional dense *item statistics* per item token (``RankerSpec.item_stats`` columns: what the
  log knew of the item when it was served, :mod:`torchrec_ascend.training.ranking.item_stats`)
  enter through a linear map, added to the item token.

The fused HSTU kernel (:func:`torchrec_ascend.ops.hstu_mha`) runs causal attention with
``contextual_seq_len = C`` (every token sees the contextual ones) and ``num_targets = K`` (each
candidate sees the history and itself only: no candidate's label -- nor its being a candidate
next to others -- reaches another's score).  The task head reads, for each candidate, its HSTU
output (layer-normed) and DLRM's vectors -- one embedding per feature (the item, each item side
feature, each context column, the user, each user side feature) and the projected item
statistics -- with the pairwise dot products of all of them (DLRM's interaction), and (with
``head_stats``) the raw statistics themselves, a wide input: an MLP maps them to one logit per
task (and, with a ``target_weight``, one regression output: the watch time).  So the head sees
what the DLRM baseline sees, plus the sequence.  The loss (:mod:`.ranking_loss`) is the sum over
tasks of ``weight x BCE`` (plus ``target_weight x`` the squared error), summed over candidates
and scaled by ``batch.loss_scale``.

**Tables** live in one TorchRec ``EmbeddingCollection`` (``model.ec``: sharded by the planner,
trained by the fused row-wise Adagrad): ``item`` and ``user`` ids, and one small table per side /
context feature; everything else is the dense ``model.head``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Dict, List, Literal, Optional, Sequence, Tuple

import torch
from torch import nn
from torchrec import EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor

from ..modules.hstu import HSTUEncoder
from ..options import choices
from .batch import FieldsBatch
from .config import ModelConfig, embedding_columns
from .generative_retrieval import NUM_ACTIONS, action_features
from .ranking_loss import ranking_loss, regression_outputs

__all__ = ["ActionLayout", "ACTION_LAYOUTS", "RankerSpec", "RankingBatch", "GenerativeRanker",
           "TaskHead", "ranking_kjt_keys", "feature_key", "split_key", "ROLE_HISTORY",
           "ROLE_CANDIDATE", "ROLE_ACTION"]

ActionLayout = Literal["summed", "interleaved"]
"""How a history impression's action enters the sequence: added to its item token, or a token
of its own after it."""
ACTION_LAYOUTS = choices(ActionLayout)

ROLE_HISTORY, ROLE_CANDIDATE, ROLE_ACTION = 0, 1, 2
_SEP = "__"  # TorchRec table names cannot hold a dot


def feature_key(prefix: str, name: str) -> str:
    """The table / KJT key of side or context feature ``name`` (``prefix``: ``user``, ``item``,
    ``ctx``)."""
    return f"{prefix}{_SEP}{name}"


def split_key(key: str) -> Tuple[str, str]:
    """``(prefix, name)`` of a :func:`feature_key` (``("item", "")`` for the item id, ...)."""
    prefix, _, name = key.partition(_SEP)
    return prefix, name


@dataclass
class RankerSpec:
    """The tables of a ranking model: ``num_items``, ``num_users``, and ``{name: codes}`` of
    the user / item side features and of the impression context (``outcomes``: context columns
    known after the impression only, history tokens); ``item_stats``: the width of the dense
    statistics per item token -- the item's and, with ``ranking.user_stats``, the user's
    (0: none)."""

    num_items: int
    num_users: int
    user_features: Dict[str, int] = field(default_factory=dict)
    item_features: Dict[str, int] = field(default_factory=dict)
    context: Dict[str, int] = field(default_factory=dict)
    outcomes: Tuple[str, ...] = ()
    item_stats: int = 0

    @property
    def contextual_tokens(self) -> int:
        """Tokens before the history: the user, and the user's features when there are any."""
        return 1 + (1 if self.user_features else 0)

    def tables(self) -> Dict[str, Tuple[int, List[str]]]:
        """``{table: (rows, [features])}``: ``item``, ``user``, ``user__<f>``, ``item__<f>``,
        ``ctx__<c>`` (each table serves the feature of its name)."""
        out = {"item": (self.num_items, ["item"]), "user": (self.num_users, ["user"])}
        for prefix, feats in (("user", self.user_features), ("item", self.item_features),
                              ("ctx", self.context)):
            for name, rows in feats.items():
                out[feature_key(prefix, name)] = (rows, [feature_key(prefix, name)])
        return out

    def served_context(self) -> List[str]:
        """The context columns known when an impression is served (not outcomes)."""
        return [c for c in self.context if c not in self.outcomes]

    def head_vectors(self) -> int:
        """The vectors the task head interacts: the HSTU output, the item, its side features,
        the served context, the user, its side features, and the item statistics."""
        return (3 + len(self.item_features) + len(self.served_context())
                + len(self.user_features) + (1 if self.item_stats else 0))


def ranking_kjt_keys(spec: RankerSpec) -> Tuple[List[str], List[str]]:
    """``(per-example keys, per-item-token keys)`` of a :class:`RankingBatch`'s KJT."""
    per_example = ["user"] + [feature_key("user", f) for f in spec.user_features]
    per_item = (["item"] + [feature_key("item", f) for f in spec.item_features]
                + [feature_key("ctx", c) for c in spec.context])
    return per_example, per_item


@dataclass
class RankingBatch(FieldsBatch):
    """One rank's ranking examples, jagged (module docstring).

    ``kjt``: per example ``user`` / ``user__<f>`` (one id each), per item token ``item`` /
    ``item__<f>`` / ``ctx__<c>`` (history items, then candidates, of each example in turn).
    ``offsets [B + 1]`` of the tokens (contextual included), ``num_targets [B]`` (candidates),
    ``timestamps [T]`` (seconds), ``item_pos [I]`` (token of each item token), ``item_role [I]``
    (0 history, 1 candidate), ``item_actions [I]`` (uint8 label bits; 0 for candidates),
    ``item_stats [I, S]`` (the spec's dense item statistics; S = 0 without),
    ``action_pos [A]`` / ``action_item [A]`` (interleaved: the action tokens and the item token
    each belongs to; empty when summed), ``labels [Kc, tasks]`` (the candidates', in order),
    ``users [B]`` and ``candidate_users [Kc]`` (dense user index), ``loss_scale`` (1 / the
    candidates of the global batch), ``targets [Kc, R]`` (the candidates' regression targets,
    e.g. watch time; R = 0 without)."""

    kjt: KeyedJaggedTensor
    offsets: torch.Tensor
    num_targets: torch.Tensor
    timestamps: torch.Tensor
    item_pos: torch.Tensor
    item_role: torch.Tensor
    item_actions: torch.Tensor
    item_stats: torch.Tensor
    action_pos: torch.Tensor
    action_item: torch.Tensor
    labels: torch.Tensor
    users: torch.Tensor
    candidate_users: torch.Tensor
    loss_scale: torch.Tensor
    targets: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.timestamps.numel())

    @property
    def num_candidates(self) -> int:
        return int(self.labels.shape[0])


class TaskHead(nn.Module):
    """``[N, in_dim]`` -> ``[N, tasks]`` logits: an MLP (``hidden`` widths, ReLU, dropout)."""

    def __init__(self, in_dim: int, hidden: Sequence[int], tasks: int, dropout: float) -> None:
        super().__init__()
        layers: List[nn.Module] = []
        d = in_dim
        for h in hidden:
            layers += [nn.Linear(d, h), nn.ReLU(), nn.Dropout(dropout)]
            d = h
        layers.append(nn.Linear(d, tasks))
        self.mlp = nn.Sequential(*layers)
        self.dims = [in_dim] + list(hidden) + [tasks]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x)

    def flops(self, rows: int) -> float:
        """Forward matmul FLOPs for ``rows`` inputs."""
        return float(sum(2 * rows * a * b for a, b in zip(self.dims[:-1], self.dims[1:])))


class RankerHead(nn.Module):
    """Everything after the embedding lookup (module docstring): token assembly, HSTU, the
    task head and the loss."""

    def __init__(self, spec: RankerSpec, cfg: ModelConfig, task_weights: Sequence[float],
                 layout: ActionLayout, head_dims: Sequence[int],
                 compute_dtype: torch.dtype = torch.float32, target_weight: float = 0.0,
                 head_stats: bool = False) -> None:
        super().__init__()
        d = cfg.embedding_dim
        self.target_weight = float(target_weight)
        self.spec, self.cfg, self.layout, self.dim = spec, cfg, layout, d
        self.compute_dtype = compute_dtype
        self.register_buffer("task_weights", torch.tensor(list(task_weights), dtype=torch.float32),
                             persistent=False)
        self.action_proj = nn.Linear(NUM_ACTIONS, d, bias=False)
        self.role = nn.Embedding(3, d)
        nn.init.normal_(self.role.weight, 0.0, 0.02)
        self.encoder = HSTUEncoder(d, cfg.num_layers, cfg.num_heads, cfg.attention_dim,
                                   cfg.linear_dim, cfg.max_seq_len, dropout=cfg.dropout,
                                   attn_alpha=cfg.attn_alpha, normalization=cfg.normalization,
                                   use_time_bias=cfg.use_time_bias,
                                   num_time_buckets=cfg.num_time_buckets,
                                   contextual_seq_len=spec.contextual_tokens, l2_normalize=False)
        self.out_norm = nn.LayerNorm(d)
        self.stats_proj = nn.Linear(spec.item_stats, d) if spec.item_stats else None
        v = spec.head_vectors()
        # head_stats: the MLP also reads the raw statistics (a wide input: the rates' evidence)
        self.wide = spec.item_stats if head_stats else 0
        self.tasks = TaskHead(v * d + v * (v - 1) // 2 + self.wide, head_dims,
                              len(task_weights) + regression_outputs(target_weight), cfg.dropout)

    def _values(self, lookups: Dict[str, object], key: str) -> torch.Tensor:
        return embedding_columns(lookups[key].values(), self.dim)  # type: ignore[attr-defined]

    def _sum(self, lookups: Dict[str, object], keys: Sequence[str], like: torch.Tensor
             ) -> torch.Tensor:
        out = torch.zeros_like(like)
        for k in keys:
            out = out + self._values(lookups, k)
        return out

    def _item_keys(self) -> List[str]:
        spec = self.spec
        return (["item"] + [feature_key("item", f) for f in spec.item_features]
                + [feature_key("ctx", c) for c in spec.served_context()])

    def tokens(self, lookups: Dict[str, object], batch: RankingBatch
               ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``(x [T, D], stats [I, D] or None)``: every token's input, and the item tokens'
        projected statistics."""
        spec = self.spec
        item = self._values(lookups, "item")
        item_x = self._sum(lookups, self._item_keys(), item)
        stats = None
        if self.stats_proj is not None:
            stats = self.stats_proj(batch.item_stats.to(item.dtype))
            item_x = item_x + stats
        outcome = self._sum(lookups, [feature_key("ctx", c) for c in spec.outcomes], item)
        action = self.action_proj(action_features(batch.item_actions).to(item.dtype)) + outcome
        x = item.new_zeros(batch.num_tokens, self.dim)
        role = batch.item_role.long()
        tok = item_x + self.role(role)
        if self.layout == "summed":
            tok = tok + action * (role == ROLE_HISTORY).unsqueeze(1).to(item.dtype)
        x = x.index_put((batch.item_pos,), tok)
        if batch.action_pos.numel():
            x = x.index_put((batch.action_pos,), action[batch.action_item]
                            + self.role.weight[ROLE_ACTION])
        starts = batch.offsets[:-1]
        user = self._values(lookups, "user")
        x = x.index_put((starts,), user)
        if spec.user_features:
            ufeat = self._sum(lookups, [feature_key("user", f) for f in spec.user_features], user)
            x = x.index_put((starts + 1,), ufeat)
        return x, stats

    def predict(self, lookups: Dict[str, object], batch: RankingBatch) -> torch.Tensor:
        """``[candidates, tasks (+ 1: the regression)]`` logits (and prediction), fp32."""
        x, stats = self.tokens(lookups, batch)
        mixed = self.compute_dtype != torch.float32
        amp = (torch.autocast(x.device.type, dtype=self.compute_dtype) if mixed
               else contextlib.nullcontext())
        with amp:
            h = self.encoder(x, batch.offsets, batch.timestamps, batch.num_targets)
        cand = batch.item_role == ROLE_CANDIDATE
        example = torch.repeat_interleave(torch.arange(batch.num_targets.numel(),
                                                       device=x.device), batch.num_targets)
        vecs = [self.out_norm(h[batch.item_pos[cand]].float())]
        vecs += [self._values(lookups, k)[cand] for k in self._item_keys()]
        vecs += [self._values(lookups, k)[example] for k in
                 ["user"] + [feature_key("user", f) for f in self.spec.user_features]]
        if stats is not None:
            vecs.append(stats[cand])
        stacked = torch.stack(vecs, dim=1)  # [Kc, V, D]
        dots = torch.bmm(stacked, stacked.transpose(1, 2))
        i, j = torch.triu_indices(len(vecs), len(vecs), offset=1, device=x.device)
        wide = [batch.item_stats[cand].to(stacked.dtype)] if self.wide else []
        return self.tasks(torch.cat(vecs + [dots[:, i, j]] + wide, dim=1)).float()

    def forward(self, lookups: Dict[str, object], batch: RankingBatch
                ) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        """``(loss, (loss.detach(), stats))``; ``stats`` = float64 cpu ``[candidates, tokens,
        step FLOPs]``."""
        loss = ranking_loss(self.predict(lookups, batch), batch.labels, batch.targets,
                            self.task_weights, self.target_weight, batch.loss_scale)
        stats = torch.tensor([float(batch.num_candidates), float(batch.num_tokens),
                              self.step_flops(batch)], dtype=torch.float64)
        return loss, (loss.detach(), stats)

    def step_flops(self, batch: RankingBatch) -> float:
        """Forward + backward matmul FLOPs of one training step on this batch (the encoder, the
        interaction's dot products, the task MLP)."""
        v = self.spec.head_vectors()
        dots = 2.0 * batch.num_candidates * v * v * self.dim
        return (float(self.encoder.flops(batch.offsets, backward=True))
                + 3.0 * (self.tasks.flops(batch.num_candidates) + dots))


class GenerativeRanker(nn.Module):
    """Sharded embedding tables (``ec``) + :class:`RankerHead` (module docstring).

    Args:
        spec: the tables.  cfg: sizes (:class:`~.config.ModelConfig`; ``max_seq_len`` bounds
        contextual + history + candidate tokens).  task_weights: one per task.  layout: the
        action tokens.  head_dims: the task MLP's hidden widths.  device: where the tables are
        created (``meta``: DMP materialises the shards).  compute_dtype: fp32, or bf16 (the
        encoder under autocast; tables, heads and loss in fp32).  target_weight: > 0 adds one
        regression output (the batch's ``targets``, e.g. watch time) with that loss weight
        (:mod:`.ranking_loss`).  head_stats: the task MLP also reads the raw statistics."""

    def __init__(self, spec: RankerSpec, cfg: ModelConfig, task_weights: Sequence[float],
                 layout: ActionLayout = "summed", head_dims: Sequence[int] = (256,),
                 device: torch.device = torch.device("meta"),
                 compute_dtype: torch.dtype = torch.float32, target_weight: float = 0.0,
                 head_stats: bool = False) -> None:
        super().__init__()
        self.spec, self.cfg = spec, cfg
        self.ec = EmbeddingCollection(
            tables=[EmbeddingConfig(name=name, embedding_dim=cfg.table_dim,
                                    num_embeddings=max(int(rows), 1), feature_names=feats)
                    for name, (rows, feats) in spec.tables().items()],
            device=device)
        self.head = RankerHead(spec, cfg, task_weights, layout, head_dims, compute_dtype,
                               target_weight, head_stats)

    def forward(self, batch: RankingBatch):
        """Training loss of one batch: ``(loss, (loss.detach(), stats))``."""
        return self.head(self.ec(batch.kjt), batch)

    @torch.no_grad()
    def predict(self, batch: RankingBatch) -> torch.Tensor:
        """``[candidates, tasks (+ 1)]`` logits (and the regression)."""
        return self.head.predict(self.ec(batch.kjt), batch)
