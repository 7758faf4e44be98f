"""Leave-one-out split, deterministic batch order and batch tensors for the KuaiRand example.

Split (as in the HSTU paper): each user's positive sequence ``p_0 .. p_{n-1}``; the model trains
on ``p_0 .. p_{n-2}`` and is evaluated on retrieving ``p_{n-1}`` from the whole corpus given
``p_0 .. p_{n-2}`` (the most recent ``max_seq_len`` of them as input; every one of them is
filtered from the candidates).

Order: step ``s`` of a run with ``W`` ranks and per-rank batch ``B`` uses epoch ``s // S`` and
slot ``s % S`` (``S = users // (W B)``); an epoch is a permutation of the users seeded by
``(seed, epoch)``; rank ``r`` takes users ``[slot W B + r B, slot W B + (r + 1) B)`` of it.  So
the data order is a pure function of ``(seed, step, rank)``: a resumed run continues exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Tuple

import numpy as np
import torch
from torchrec import KeyedJaggedTensor

from torchrec_ascend.datasets import Sequences
from torchrec_ascend.sampling import NegativeSampler

from kuairand_model import NUM_ACTION_BITS


@dataclass
class Split:
    """Training prefixes (jagged, all but the last positive) and the held-out last items."""

    items: np.ndarray      # int64 [E'] train prefixes, concatenated
    times: np.ndarray      # int64 [E'] seconds
    actions: np.ndarray    # uint8 [E']
    offsets: np.ndarray    # int64 [U + 1]
    targets: np.ndarray    # int64 [U]
    num_items: int

    @property
    def num_users(self) -> int:
        return len(self.targets)

    def item_counts(self) -> np.ndarray:
        """Occurrences of each item in the training prefixes (the most-popular baseline)."""
        return np.bincount(self.items, minlength=self.num_items)


def leave_one_out(seqs: Sequences) -> Split:
    """Hold out every user's last positive item (users need >= 2 positives)."""
    lens = seqs.lengths
    if (lens < 2).any():
        raise ValueError("seqs: every user needs at least 2 positive events for leave-one-out")
    last = seqs.offsets[1:] - 1
    keep = np.ones(len(seqs.items), dtype=bool)
    keep[last] = False
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens - 1, out=offsets[1:])
    return Split(seqs.items[keep].astype(np.int64), (seqs.times[keep] // 1000).astype(np.int64),
                 seqs.actions[keep], offsets, seqs.items[last].astype(np.int64), seqs.num_items)


def action_bits(actions: np.ndarray) -> torch.Tensor:
    """uint8 bitmask [T] -> float [T, 8] of 0/1."""
    a = torch.from_numpy(np.ascontiguousarray(actions)).to(torch.int64)
    return ((a[:, None] >> torch.arange(NUM_ACTION_BITS)) & 1).to(torch.float32)


@dataclass
class Batch:
    """One rank's tensors for a training step (or an evaluation batch)."""

    users: np.ndarray
    items: torch.Tensor        # [T]
    offsets: torch.Tensor      # [B + 1]
    timestamps: torch.Tensor   # [T]
    action_bits: torch.Tensor  # [T, 8]
    query_idx: torch.Tensor    # positions that have a next item (all but each sequence's last)

    @property
    def num_tokens(self) -> int:
        return int(self.items.numel())


def gather_batch(split: Split, users: np.ndarray, max_len: int) -> Batch:
    """The most recent ``max_len`` training items of each of ``users``."""
    starts = split.offsets[users]
    ends = split.offsets[users + 1]
    starts = np.maximum(starts, ends - max_len)
    lens = ends - starts
    idx = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)]) if len(users) else \
        np.zeros(0, dtype=np.int64)
    offsets = np.zeros(len(users) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    is_last = np.zeros(len(idx), dtype=bool)
    is_last[offsets[1:][lens > 0] - 1] = True
    return Batch(users, torch.from_numpy(split.items[idx]), torch.from_numpy(offsets),
                 torch.from_numpy(split.times[idx]), action_bits(split.actions[idx]),
                 torch.from_numpy(np.flatnonzero(~is_last)))


class BatchOrder:
    """Deterministic per-step user batches (see module docstring)."""

    def __init__(self, split: Split, batch_size: int, world_size: int, rank: int, seed: int) -> None:
        # users whose training prefix has >= 2 items give at least one (input, next) pair
        self.users = np.flatnonzero(np.diff(split.offsets) >= 2)
        self.batch_size, self.world_size, self.rank, self.seed = batch_size, world_size, rank, seed
        self.steps_per_epoch = len(self.users) // (batch_size * world_size)
        if self.steps_per_epoch == 0:
            raise ValueError(f"batch_size: {batch_size} x {world_size} ranks exceeds the "
                             f"{len(self.users)} trainable users")

    def users_at(self, step: int) -> np.ndarray:
        epoch, slot = divmod(step, self.steps_per_epoch)
        perm = np.random.default_rng([self.seed, epoch]).permutation(self.users)
        g = slot * self.batch_size * self.world_size + self.rank * self.batch_size
        return perm[g:g + self.batch_size]


def step_generator(seed: int, step: int, rank: int) -> torch.Generator:
    """The negative sampler's random source for one step: a pure function of (seed, step, rank)."""
    return torch.Generator().manual_seed((seed * 1_000_003 + step) * 4099 + rank)


def make_kjt(items: torch.Tensor, batch_size: int, neg_ids: torch.Tensor,
             lengths: torch.Tensor) -> KeyedJaggedTensor:
    """``item`` = the sequences; ``neg`` = the pool, all in row 0 (same table, one lookup)."""
    neg_len = torch.zeros(batch_size, dtype=torch.int64)
    if batch_size:
        neg_len[0] = neg_ids.numel()
    return KeyedJaggedTensor.from_lengths_sync(
        keys=["item", "neg"], values=torch.cat([items, neg_ids.to(torch.int64)]),
        lengths=torch.cat([lengths, neg_len]))


def training_inputs(batch: Batch, sampler: NegativeSampler, num_negatives: int, seed: int,
                    step: int, rank: int) -> Tuple[KeyedJaggedTensor, torch.Tensor, torch.Tensor]:
    """KJT and the logQ terms for one step."""
    pos_ids = batch.items[batch.query_idx + 1]
    sample = sampler.sample(pos_ids, num_negatives, generator=step_generator(seed, step, rank))
    lengths = batch.offsets[1:] - batch.offsets[:-1]
    kjt = make_kjt(batch.items, len(batch.users), sample.ids, lengths)
    return kjt, sample.log_q, sample.pos_log_q


def eval_batches(split: Split, users: np.ndarray, batch_size: int, max_len: int) -> Iterator[Batch]:
    for i in range(0, len(users), batch_size):
        yield gather_batch(split, users[i:i + batch_size], max_len)


def history_of(split: Split, users: np.ndarray) -> Tuple[torch.Tensor, torch.Tensor]:
    """The full training prefix of each user (jagged ids + offsets) for history filtering."""
    lens = split.offsets[users + 1] - split.offsets[users]
    idx = np.concatenate([np.arange(split.offsets[u], split.offsets[u + 1]) for u in users]) \
        if len(users) else np.zeros(0, dtype=np.int64)
    off = np.zeros(len(users) + 1, dtype=np.int64)
    np.cumsum(lens, out=off[1:])
    return torch.from_numpy(split.items[idx]), torch.from_numpy(off)
