"""Leave-two-out split (and the leave-one-out variant) and the sequence windows the trainer
and the evaluator read.

Each user's positive sequence ``p_0 .. p_{n-1}`` (``n >= 3``, time order):

* **training** sees ``p_0 .. p_{n-3}`` only (a user needs two of them to give a query);
* **validation** target ``p_{n-2}``, history ``p_0 .. p_{n-3}``;
* **test** target ``p_{n-1}``, history ``p_0 .. p_{n-2}`` (the validation item is history).

Training never sees a validation or test item as an input or a target; periodic evaluation,
early stopping and model choices use validation only; the test is computed once at the end.

:func:`leave_one_out` is the published protocol of Meta's reference HSTU (no validation split):
training sees ``p_0 .. p_{n-2}``, the test is the same as above, and there is no validation
(``Split.has_valid`` is False).  It is for running the reference's protocol next to it after the
settings were chosen on the leave-two-out validation, never for choosing them.

Time bias at evaluation (issue 16): in training the query at position ``i`` attends with the
time of its *target* (``ts[i + 1]``: HSTU's relative time bias).  At serving time the request
time is known, so evaluation does the same: the input is the most recent ``max_len - 1``
history items followed by a **request token** carrying the target's timestamp (its item is the
last history item and its action bits are zero; causal attention keeps it out of every earlier
position, so only its timestamp matters) and the query is the position before it -- exactly
the shape of a training window's last query.  docs/training.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Literal, Tuple

import numpy as np

from ...datasets import DataError, Sequences
from ...datasets.ragged import offsets_of, ranges
from ...options import choices

__all__ = ["Split", "leave_two_out", "leave_one_out", "hold_out", "Holdout", "HOLDOUTS",
           "EVAL_SPLITS"]

EVAL_SPLITS = ("valid", "test")
Holdout = Literal["leave_two_out", "leave_one_out"]
"""``eval.holdout``: which of each user's last positives are held out (module docstring)."""
HOLDOUTS = choices(Holdout)


@dataclass
class Split:
    """Training prefixes (jagged) and each user's validation and test target.

    ``items`` / ``times`` (seconds) / ``actions`` (uint8 bits) / ``offsets [U + 1]``: the
    training prefixes.  ``valid_*`` / ``test_*`` ``[U]``: the held-out items, their times and
    action bits.  ``has_valid`` False (leave-one-out): the ``valid_*`` item is the last item of
    the training prefix, not held out, and there is no validation split."""

    items: np.ndarray
    times: np.ndarray
    actions: np.ndarray
    offsets: np.ndarray
    valid_items: np.ndarray
    valid_times: np.ndarray
    valid_actions: np.ndarray
    test_items: np.ndarray
    test_times: np.ndarray
    num_items: int
    has_valid: bool = True
    duplicates_dropped: int = 0

    @property
    def num_users(self) -> int:
        return len(self.offsets) - 1

    @property
    def prefix_lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def targets_in_history(self) -> Dict[str, int]:
        """Per evaluated split, how many users' target item is already in their history (a
        re-consumed item: filtered with the history, so a miss for every model)."""
        out = {}
        users = np.arange(self.num_users)
        for which in EVAL_SPLITS:
            if which == "valid" and not self.has_valid:
                continue
            hist, off = self.history(users, which)
            owner = np.repeat(users, np.diff(off))
            tgt = self.targets(users, which)
            out[which] = int(len(np.unique(owner[hist == tgt[owner]])))
        return out

    def item_counts(self) -> np.ndarray:
        """Occurrences of each item in the training prefixes (the most-popular baseline)."""
        return np.bincount(self.items, minlength=self.num_items)

    def trainable_users(self) -> np.ndarray:
        """Users whose prefix has >= 2 items (at least one input -> next-item pair)."""
        return np.flatnonzero(self.prefix_lengths >= 2)

    def train_windows(self, users: np.ndarray, max_len: int) -> Tuple[np.ndarray, np.ndarray]:
        """(token indices into the prefix arrays, offsets): each user's most recent
        ``max_len`` training items."""
        ends = self.offsets[users + 1]
        starts = np.maximum(self.offsets[users], ends - max_len)
        return ranges(starts, ends), offsets_of(ends - starts)

    def targets(self, users: np.ndarray, which: str) -> np.ndarray:
        if which not in EVAL_SPLITS:
            raise ValueError(f"which: {which!r} is not one of {list(EVAL_SPLITS)}")
        if which == "valid" and not self.has_valid:
            raise ValueError("which: 'valid' is not held out in a leave-one-out split (the "
                             "second-to-last item is trained on); evaluate 'test' only")
        return (self.valid_items if which == "valid" else self.test_items)[users]

    def history(self, users: np.ndarray, which: str) -> Tuple[np.ndarray, np.ndarray]:
        """The full history of each user for ``which`` (ids, offsets): the training prefix, plus
        the validation item for ``test``."""
        idx = ranges(self.offsets[users], self.offsets[users + 1])
        lens = self.prefix_lengths[users]
        self.targets(users, which)
        if which == "valid" or not self.has_valid:  # the prefix is the whole history
            return self.items[idx], offsets_of(lens)
        off = offsets_of(lens + 1)
        ids = np.empty(off[-1], dtype=np.int64)
        last = off[1:] - 1
        mask = np.ones(off[-1], dtype=bool)
        mask[last] = False
        ids[mask] = self.items[idx]
        ids[last] = self.valid_items[users]
        return ids, off

    def eval_inputs(self, users: np.ndarray, which: str, max_len: int
                    ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Model inputs for evaluation (module docstring): ``items, times, actions, offsets``
        of (last ``max_len - 1`` history items + the request token) and the query positions
        (the token before each request token)."""
        hist_idx = ranges(self.offsets[users], self.offsets[users + 1])
        lens = self.prefix_lengths[users]
        items, times, actions = self.items[hist_idx], self.times[hist_idx], self.actions[hist_idx]
        self.targets(users, which)
        if which == "test" and self.has_valid:  # append the validation item to each history
            off = offsets_of(lens + 1)
            keep = np.ones(off[-1], dtype=bool)
            keep[off[1:] - 1] = False
            it, tm, ac = (np.empty(off[-1], dtype=a.dtype) for a in (items, times, actions))
            it[keep], tm[keep], ac[keep] = items, times, actions
            it[~keep], tm[~keep] = self.valid_items[users], self.valid_times[users]
            ac[~keep] = self.valid_actions[users]
            items, times, actions, lens = it, tm, ac, lens + 1
        hist_off = offsets_of(lens)
        keep_n = np.minimum(lens, max_len - 1)
        sel = ranges(hist_off[1:] - keep_n, hist_off[1:])
        out_off = offsets_of(keep_n + 1)
        req = out_off[1:] - 1
        tok = np.ones(out_off[-1], dtype=bool)
        tok[req] = False
        o_items = np.empty(out_off[-1], dtype=np.int64)
        o_times = np.empty(out_off[-1], dtype=np.int64)
        o_act = np.zeros(out_off[-1], dtype=np.uint8)
        o_items[tok], o_times[tok], o_act[tok] = items[sel], times[sel], actions[sel]
        o_items[req] = o_items[req - 1]
        o_times[req] = (self.valid_times if which == "valid" else self.test_times)[users]
        return o_items, o_times, o_act, out_off, req - 1


def hold_out(seqs: Sequences, holdout: Holdout) -> Split:
    """Hold out each user's last positive (test) and, for ``leave_two_out``, the one before it
    (validation); users need >= 3 positives."""
    lens = seqs.lengths
    if len(lens) == 0:
        raise DataError(seqs.source or "data", 0, None,
                        "no user has enough positive events (data.min_len)")
    if (lens < 3).any():  # the same users under both holdouts: the same test set
        raise ValueError(f"seqs: every user needs at least 3 positive events for {holdout} "
                         f"(min_len >= 3); {int((lens < 3).sum())} have fewer")
    test = seqs.offsets[1:] - 1
    valid = test - 1
    keep = np.ones(len(seqs.items), dtype=bool)
    keep[test] = False
    has_valid = holdout == "leave_two_out"
    if has_valid:
        keep[valid] = False
    times_s = (np.asarray(seqs.times) // 1000).astype(np.int64)
    items = np.asarray(seqs.items).astype(np.int64)
    actions = np.asarray(seqs.actions).astype(np.uint8)
    return Split(items[keep], times_s[keep], actions[keep],
                 offsets_of(lens - (2 if has_valid else 1)),
                 items[valid], times_s[valid], actions[valid], items[test], times_s[test],
                 int(seqs.num_items), has_valid, int(seqs.duplicates_dropped))


def leave_two_out(seqs: Sequences) -> Split:
    """Hold out each user's last two positives (validation, test); users need >= 3."""
    return hold_out(seqs, "leave_two_out")


def leave_one_out(seqs: Sequences) -> Split:
    """Hold out each user's last positive (test) and train on the rest, validation item
    included: the reference's protocol (module docstring); users need >= 3, as for
    :func:`leave_two_out`, so both test the same users."""
    return hold_out(seqs, "leave_one_out")
