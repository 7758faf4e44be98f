"""Ranking batches: examples -> :class:`~torchrec_ascend.models.generative_ranker.RankingBatch`
(the HSTU ranker) or :class:`~torchrec_ascend.models.dlrm_ranker.DLRMBatch` (the DLRM baseline:
the candidates alone), deterministic in the step.

Order: step ``s`` takes slot ``s % S`` of epoch ``s // S`` (``S`` = training examples // global
batch, global batch = ``batch_size x world`` examples); an epoch is a permutation of the examples
seeded by ``(seed, epoch)``.  Each rank builds its share (:class:`~..balancing.RankShare`: the
cost of an example is its tokens, its candidates are its targets; ``all_to_all`` moves example
indices, every rank holding the data); every rank's loss is scaled by 1 / the candidates of the
global batch, so summed gradients equal one process training the global batch.

What the input holds of a candidate: its item, side features and the context it was served in,
never its labels nor its outcomes (the builder zeroes both); the history is every earlier
impression with its actions and outcomes.
"""

from __future__ import annotations

from typing import Iterator, List, Optional, Tuple, Union

import numpy as np
import torch
from torchrec import KeyedJaggedTensor

from ...datasets.ragged import offsets_of, ranges
from ...models.dlrm_ranker import DLRMBatch, dlrm_features
from ...models.generative_ranker import (ROLE_CANDIDATE, ROLE_HISTORY, ActionLayout, RankerSpec,
                                         RankingBatch, ranking_kjt_keys, split_key)
from ...options import OptionError
from ..balancing import BuildAhead, RankShare
from .data import Examples, RankingData

__all__ = ["ExampleBuilder", "RankingBatches", "ModelKindOfBatch"]

ModelKindOfBatch = Union[RankingBatch, DLRMBatch]


class ExampleBuilder:
    """Batches of given examples for the ``hstu`` ranker (``layout``) or the ``dlrm`` baseline;
    ``targets``: a regression target per event (the watch time) that the candidates' batches
    carry, or None."""

    def __init__(self, data: RankingData, spec: RankerSpec, kind: str,
                 layout: ActionLayout = "summed", item_stats: Optional[np.ndarray] = None,
                 user_stats: Optional[np.ndarray] = None,
                 targets: Optional[np.ndarray] = None) -> None:
        self.data, self.spec, self.kind, self.layout = data, spec, kind, layout
        self.targets = targets
        self.context = {c.name: c for c in data.context}
        none = np.zeros((data.num_events, 0), dtype=np.float32)
        self.item_stats = none if item_stats is None else item_stats
        self.user_stats = none if user_stats is None else user_stats
        cols = self.item_stats.shape[1] + self.user_stats.shape[1]
        if cols != spec.item_stats:
            raise ValueError(f"item_stats + user_stats: {cols} columns, the spec has "
                             f"{spec.item_stats}")

    def _stats(self, events: np.ndarray, as_of: np.ndarray) -> np.ndarray:
        """The dense statistics of ``events``: each one's item statistics and its user's as of
        event ``as_of`` (a candidate's: its window's first candidate, so that no candidate's
        label reaches another of its window)."""
        return np.concatenate([self.item_stats[events], self.user_stats[as_of]], axis=1)

    @property
    def regression_columns(self) -> int:
        """Columns of the batches' ``targets`` (1 with a target, else 0)."""
        return 0 if self.targets is None else 1

    def _targets(self, events: np.ndarray) -> torch.Tensor:
        """``[len(events), R]`` the events' regression targets (R = 0 without)."""
        if self.targets is None:
            return torch.zeros((len(events), 0), dtype=torch.float32)
        return torch.from_numpy(self.targets[events].astype(np.float32)[:, None])

    def token_lengths(self, ex: Examples) -> np.ndarray:
        """Tokens of each example (contextual + history (x2 interleaved) + candidates)."""
        h = ex.history_lengths * (2 if self.layout == "interleaved" else 1)
        return self.spec.contextual_tokens + h + ex.num_candidates

    def build(self, ex: Examples, loss_scale: float) -> ModelKindOfBatch:
        return (self._hstu(ex, loss_scale) if self.kind == "hstu"
                else self._dlrm(ex, loss_scale))

    # ------------------------------------------------------------------ HSTU ranker
    def _hstu(self, ex: Examples, loss_scale: float) -> RankingBatch:
        d, spec = self.data, self.spec
        n = len(ex)
        hist, cand = ex.history_lengths, ex.num_candidates
        n_items = hist + cand
        events = ranges(ex.hist_start, ex.end)  # history then candidates, example by example
        item_off = offsets_of(n_items)
        j = np.arange(len(events)) - np.repeat(item_off[:-1], n_items)  # index in its example
        is_cand = j >= np.repeat(hist, n_items)
        c = spec.contextual_tokens
        lengths = self.token_lengths(ex)
        tok_off = offsets_of(lengths)
        base = np.repeat(tok_off[:-1], n_items) + c
        if self.layout == "interleaved":
            h_rep = np.repeat(hist, n_items)
            item_pos = base + np.where(is_cand, 2 * h_rep + (j - h_rep), 2 * j)
            hist_items = np.flatnonzero(~is_cand)
            action_pos, action_item = item_pos[hist_items] + 1, hist_items
        else:
            item_pos = base + j
            action_pos = action_item = np.zeros(0, dtype=np.int64)
        times_s = d.times[events] // 1000
        ts = np.empty(int(tok_off[-1]), dtype=np.int64)
        ts[item_pos] = times_s
        ts[action_pos] = times_s[action_item] if len(action_pos) else ts[action_pos]
        first_time = times_s[item_off[:-1]] if len(events) else np.zeros(n, dtype=np.int64)
        for k in range(c):
            ts[tok_off[:-1] + k] = first_time
        actions = np.where(is_cand, 0, d.actions[events]).astype(np.uint8)
        kjt = self._kjt(ex.user, events, is_cand, n_items)
        cand_events = events[is_cand]
        return RankingBatch(
            kjt=kjt, offsets=torch.from_numpy(tok_off), num_targets=torch.from_numpy(cand),
            timestamps=torch.from_numpy(ts), item_pos=torch.from_numpy(item_pos),
            item_role=torch.from_numpy(np.where(is_cand, ROLE_CANDIDATE, ROLE_HISTORY).astype(np.int8)),
            item_actions=torch.from_numpy(actions),
            item_stats=torch.from_numpy(
                self._stats(events, np.where(is_cand, np.repeat(ex.start, n_items), events))),
            action_pos=torch.from_numpy(action_pos.astype(np.int64)),
            action_item=torch.from_numpy(action_item.astype(np.int64)),
            labels=torch.from_numpy(d.labels(cand_events)),
            users=torch.from_numpy(ex.user), candidate_users=torch.from_numpy(np.repeat(ex.user, cand)),
            loss_scale=torch.tensor(loss_scale, dtype=torch.float32),
            targets=self._targets(cand_events))

    def _kjt(self, users: np.ndarray, events: np.ndarray, is_cand: np.ndarray,
             n_items: np.ndarray) -> KeyedJaggedTensor:
        d, spec = self.data, self.spec
        per_example, per_item = ranking_kjt_keys(spec)
        values: List[np.ndarray] = []
        lengths: List[np.ndarray] = []
        ones = np.ones(len(users), dtype=np.int64)
        for key in per_example:
            values.append(self._values(key, users, None))
            lengths.append(ones)
        for key in per_item:
            v = self._values(key, None, events)
            prefix, name = split_key(key)
            if prefix == "ctx" and self.context[name].outcome:
                v = np.where(is_cand, 0, v)  # a candidate's outcome is not known
            values.append(v)
            lengths.append(n_items)
        return KeyedJaggedTensor.from_lengths_sync(
            keys=per_example + per_item,
            values=torch.from_numpy(np.concatenate(values).astype(np.int64)),
            lengths=torch.from_numpy(np.concatenate(lengths).astype(np.int64)))

    def _values(self, key: str, users: Optional[np.ndarray], events: Optional[np.ndarray]
                ) -> np.ndarray:
        """The ids of feature ``key`` for ``users`` (per-user keys) or ``events`` (the rest)."""
        d = self.data
        prefix, name = split_key(key)
        if key == "user":
            return users  # type: ignore[return-value]
        if key == "item":
            return d.items[events]
        if prefix == "user":
            return d.user_side.codes[users, d.user_side.names.index(name)]  # type: ignore[union-attr]
        if prefix == "item":
            return d.item_side.codes[d.items[events], d.item_side.names.index(name)]  # type: ignore[union-attr]
        return self.context[name].codes[events]

    # ------------------------------------------------------------------ DLRM baseline
    def _dlrm(self, ex: Examples, loss_scale: float) -> DLRMBatch:
        d, spec = self.data, self.spec
        events = ranges(ex.start, ex.end)
        users = np.repeat(ex.user, ex.num_candidates)
        feats = dlrm_features(spec)
        values = [self._values(key, users, events) for key in feats]
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=feats, values=torch.from_numpy(np.concatenate(values).astype(np.int64)),
            lengths=torch.ones(len(feats) * len(events), dtype=torch.int64))
        dense = [np.ones(len(events), dtype=np.float32)]
        for col in d.context:
            if not col.outcome:
                dense.append(col.codes[events].astype(np.float32) / max(col.cardinality - 1, 1))
        dense_in = np.concatenate([np.stack(dense, axis=1),
                                   self._stats(events, np.repeat(ex.start, ex.num_candidates))],
                                  axis=1)
        return DLRMBatch(kjt=kjt, dense=torch.from_numpy(dense_in),
                         labels=torch.from_numpy(d.labels(events)),
                         users=torch.from_numpy(users),
                         loss_scale=torch.tensor(loss_scale, dtype=torch.float32),
                         targets=self._targets(events))


class RankingBatches:
    """This rank's training batches of one model kind (module docstring); a
    :class:`~..task.BatchSource`."""

    def __init__(self, builder: ExampleBuilder, examples: Examples, global_batch: int, seed: int,
                 share: RankShare, ahead: bool = False) -> None:
        self.ahead = BuildAhead(share, ahead)
        self.builder, self.examples, self.share = builder, examples, share
        self.global_batch, self.seed = int(global_batch), int(seed)
        self.steps_per_epoch = len(examples) // self.global_batch
        if self.steps_per_epoch == 0:
            raise OptionError("train.batch_size", f"a global batch of {self.global_batch} "
                                                  f"examples (batch_size x ranks) exceeds the "
                                                  f"{len(examples)} training examples")
        self.last_balance_s: Optional[float] = None

    def global_rows(self, step: int) -> np.ndarray:
        epoch, slot = divmod(int(step), self.steps_per_epoch)
        perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.examples))
        return perm[slot * self.global_batch:(slot + 1) * self.global_batch]

    def _build(self, step: int) -> Tuple[ModelKindOfBatch, Optional[float]]:
        rows = self.global_rows(step)
        ex = self.examples.take(rows)
        scale = 1.0 / max(int(ex.num_candidates.sum()), 1)
        lengths = self.builder.token_lengths(ex)
        mine = self.share.rows(lengths, ex.num_candidates)
        moved = self.share.exchange(torch.from_numpy(lengths[mine]), None,
                                    {"rows": torch.from_numpy(rows[mine])},
                                    torch.from_numpy(ex.num_candidates[mine]))
        take = moved.sample_fields["rows"].numpy()
        return self.builder.build(self.examples.take(take), scale), moved.seconds

    def stream(self, start: int, stop: int) -> Iterator[ModelKindOfBatch]:
        steps = iter(range(start, stop))
        for batch, secs in self.ahead.run(lambda: self._build(next(steps)), stop - start):
            self.last_balance_s = secs
            yield batch

    def close(self) -> None:
        self.ahead.close()
