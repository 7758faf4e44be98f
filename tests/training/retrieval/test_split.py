"""Leave-two-out / leave-one-out splits and evaluation inputs against a plain-Python oracle."""

from __future__ import annotations

import numpy as np
import pytest

from torchrec_ascend.datasets import Sequences
from torchrec_ascend.training.retrieval.split import leave_one_out, leave_two_out


def seqs(lens, seed=0, num_items=50):
    rng = np.random.default_rng(seed)
    off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    items = rng.integers(0, num_items, off[-1]).astype(np.int64)
    times = np.concatenate([np.sort(rng.integers(0, 10**6, n)) for n in lens]) * 1000
    acts = rng.integers(0, 256, off[-1]).astype(np.uint8)
    return Sequences(items, times.astype(np.int64), acts, off, np.arange(len(lens)), num_items)


def test_leave_two_out_matches_python_oracle():
    s = seqs([3, 5, 9, 4])
    sp = leave_two_out(s)
    for u in range(4):
        it = s.items[s.offsets[u]:s.offsets[u + 1]].tolist()
        tm = (s.times[s.offsets[u]:s.offsets[u + 1]] // 1000).tolist()
        assert sp.items[sp.offsets[u]:sp.offsets[u + 1]].tolist() == it[:-2]
        assert sp.times[sp.offsets[u]:sp.offsets[u + 1]].tolist() == tm[:-2]
        assert (sp.valid_items[u], sp.test_items[u]) == (it[-2], it[-1])
        assert (sp.valid_times[u], sp.test_times[u]) == (tm[-2], tm[-1])
        ids, off = sp.history(np.array([u]), "valid")
        assert ids.tolist() == it[:-2]
        ids, off = sp.history(np.array([u]), "test")
        assert ids.tolist() == it[:-1]
    assert sp.trainable_users().tolist() == [1, 2, 3]  # user 0 has a 1-item prefix
    with pytest.raises(ValueError, match="at least 3 positive events"):
        leave_two_out(seqs([3, 2]))


@pytest.mark.parametrize("which", ["valid", "test"])
def test_eval_inputs_window_and_request_token(which):
    s = seqs([3, 6, 12, 7], seed=1)
    sp = leave_two_out(s)
    users = np.array([0, 2, 3])
    max_len = 5
    items, times, acts, off, q = sp.eval_inputs(users, which, max_len)
    for row, u in enumerate(users):
        full_i = s.items[s.offsets[u]:s.offsets[u + 1]].tolist()
        full_t = (s.times[s.offsets[u]:s.offsets[u + 1]] // 1000).tolist()
        full_a = s.actions[s.offsets[u]:s.offsets[u + 1]].tolist()
        n_hist = len(full_i) - (2 if which == "valid" else 1)
        keep = min(n_hist, max_len - 1)
        hist = slice(n_hist - keep, n_hist)
        a, b = off[row], off[row + 1]
        assert items[a:b - 1].tolist() == full_i[hist]
        assert times[a:b - 1].tolist() == full_t[hist]
        assert acts[a:b - 1].tolist() == full_a[hist]
        # the request token: last history item, no actions, the target's timestamp
        assert items[b - 1] == full_i[n_hist - 1] and acts[b - 1] == 0
        assert times[b - 1] == full_t[n_hist]
        assert q[row] == b - 2
    assert (np.diff(off) <= max_len).all()
    with pytest.raises(ValueError, match="which: 'train' is not one of"):
        sp.eval_inputs(users, "train", max_len)


def test_leave_one_out_trains_on_the_second_to_last_and_tests_the_last():
    s = seqs([3, 5, 9, 4], seed=2)
    sp = leave_one_out(s)
    assert not sp.has_valid and leave_two_out(s).has_valid
    max_len = 4
    items, times, acts, off, q = sp.eval_inputs(np.arange(4), "test", max_len)
    for u in range(4):
        it = s.items[s.offsets[u]:s.offsets[u + 1]].tolist()
        tm = (s.times[s.offsets[u]:s.offsets[u + 1]] // 1000).tolist()
        assert sp.items[sp.offsets[u]:sp.offsets[u + 1]].tolist() == it[:-1]  # valid item in
        assert sp.test_items[u] == it[-1] and sp.test_times[u] == tm[-1]
        ids, _ = sp.history(np.array([u]), "test")
        assert ids.tolist() == it[:-1]  # the second-to-last once, not twice
        # the test window: the last max_len - 1 items before the target + the request token
        hist = it[:-1][-(max_len - 1):]
        a, b = off[u], off[u + 1]
        assert items[a:b - 1].tolist() == hist and items[b - 1] == hist[-1]
        assert times[b - 1] == tm[-1] and q[u] == b - 2
    # the same test (targets, windows) as leave-two-out: only training differs
    l2 = leave_two_out(s).eval_inputs(np.arange(4), "test", max_len)
    for x, y in zip((items, times, acts, off, q), l2):
        assert np.array_equal(x, y)
    assert sp.trainable_users().tolist() == [0, 1, 2, 3]  # user 0: a 2-item prefix now
    for call in (lambda: sp.targets(np.arange(4), "valid"),
                 lambda: sp.history(np.arange(4), "valid"),
                 lambda: sp.eval_inputs(np.arange(4), "valid", max_len)):
        with pytest.raises(ValueError, match="not held out in a leave-one-out split"):
            call()
    with pytest.raises(ValueError, match="at least 3 positive events for leave_one_out"):
        leave_one_out(seqs([3, 2]))
