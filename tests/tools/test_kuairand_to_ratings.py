"""tools/kuairand_to_ratings.py: a hand-made KuaiRand-format log against the lines written by hand."""

from __future__ import annotations

import importlib

import pytest

HEADER = ("user_id,video_id,date,hourmin,time_ms,is_click,is_like,is_follow,is_comment,"
          "is_forward,is_hate,long_view,play_time_ms,duration_ms,profile_stay_time,"
          "comment_stay_time,is_profile_enter,is_rand,tab")


def _row(user, video, ms, like):
    return f"{user},{video},20220408,1000,{ms},1,{like},0,0,0,0,0,10,20,0,0,0,0,1"


def test_positive_sequences_as_movielens_lines(tmp_path):
    # user 7: three likes (out of time order in the file) and one non-like; user 9: two likes
    # (fewer than min_len 3: dropped).  Videos 500 / 30 / 8000000 / 41 / 9.
    rows = [_row(7, 500, 3_000_999, 1), _row(7, 30, 1_000_000, 1), _row(9, 41, 5_000, 1),
            _row(7, 8_000_000, 2_500_000, 0), _row(7, 8_000_000, 2_000_500, 1),
            _row(9, 9, 6_000, 1)]
    log = tmp_path / "log.csv"
    log.write_text("\n".join([HEADER] + rows) + "\n")
    t = importlib.import_module("tools.kuairand_to_ratings")
    out = tmp_path / "ratings.dat"
    assert t.write_ratings([str(log)], str(out), cache_root=str(tmp_path / "cache")) == 3
    lines = out.read_text().splitlines()
    users, items, ratings, secs = zip(*(tuple(map(int, l.split("::"))) for l in lines))
    assert users == (7, 7, 7) and ratings == (1, 1, 1)
    assert secs == (1000, 2000, 3000)  # time order, ms floored to seconds
    # dense ids + 1: distinct per video, >= 1, the same video the same id
    assert len(set(items)) == 3 and min(items) >= 1
    assert max(items) <= 5  # the corpus is the 5 videos of the input, not the raw ids
    with pytest.raises(ValueError):
        t.write_ratings([str(log)], str(out), positive=(), cache_root=str(tmp_path / "c2"))
