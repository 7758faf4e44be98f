"""tools/reference_hstu_cpu.py: its data-file logic against hand-made oracles, its step clock on a
fake loader, and (when the reference checkout and pandas are present) the reference's own
preprocessor run through it on a tiny hand-made ratings.dat."""

from __future__ import annotations

import csv
import importlib
import os

import pytest
import torch

REFERENCE = os.environ.get("GR_REFERENCE_DIR", "/tmp/gr/gr")

# three users; user 2 has two ratings at the same second; file order is not time order
RATINGS = """\
2::30::4::500
1::10::5::300
1::20::3::100
2::10::2::400
1::40::1::200
2::50::5::400
3::20::4::700
"""
# the oracle, by hand: each user's (timestamp, movie, rating) in time order, ties by movie
SEQUENCES = {1: [(100, 20, 3), (200, 40, 1), (300, 10, 5)],
             2: [(400, 10, 2), (400, 50, 5), (500, 30, 4)],
             3: [(700, 20, 4)]}


def _tool():
    """tools/reference_hstu_cpu.py as a module (the repository root is on sys.path under ``python -m pytest``)."""
    return importlib.import_module("tools.reference_hstu_cpu")


def _write(tmp_path, text=RATINGS):
    p = tmp_path / "ratings.dat"
    p.write_text(text)
    return str(p)


def test_read_ratings_and_errors(tmp_path):
    t = _tool()
    got = t.read_ratings(_write(tmp_path))
    assert got[0] == (2, 30, 4, 500) and got[1] == (1, 10, 5, 300) and len(got) == 7
    with pytest.raises(ValueError, match=r"ratings.dat:2: expected 4"):
        t.read_ratings(_write(tmp_path, "1::2::3::4\n1::2::3\n"))
    with pytest.raises(ValueError, match=r"ratings.dat:1: fields must be integers"):
        t.read_ratings(_write(tmp_path, "1::x::3::4\n"))
    with pytest.raises(ValueError, match="no ratings"):
        t.read_ratings(_write(tmp_path, "\n"))


def test_side_files_list_each_user_and_rated_movie_once(tmp_path):
    t = _tool()
    users, movies = t.side_file_lines(t.read_ratings(_write(tmp_path)))
    assert users == ["1::M::1::0::00000", "2::M::1::0::00000", "3::M::1::0::00000"]
    assert movies == ["10::Item 10 (2000)::Unknown", "20::Item 20 (2000)::Unknown",
                      "30::Item 30 (2000)::Unknown", "40::Item 40 (2000)::Unknown",
                      "50::Item 50 (2000)::Unknown"]
    # the reference reads the year as title[-5:-1] and the title as title[:-7]
    title = movies[0].split("::")[1]
    assert title[-5:-1] == "2000" and title[:-7] == "Item 10"


def test_num_items_makes_the_corpus_every_id(tmp_path):
    t = _tool()
    _, movies = t.side_file_lines(t.read_ratings(_write(tmp_path)), num_items=52)
    assert [int(m.split("::")[0]) for m in movies] == list(range(1, 53))
    with pytest.raises(ValueError, match=r"num_items: must be >= the largest item id .*\(50\)"):
        t.side_file_lines(t.read_ratings(_write(tmp_path)), num_items=49)


def test_user_sequences_match_the_hand_oracle(tmp_path):
    t = _tool()
    assert t.user_sequences(t.read_ratings(_write(tmp_path))) == SEQUENCES


def _row(u, items, stars, times):
    return {"user_id": str(u), "sequence_item_ids": items, "sequence_ratings": stars,
            "sequence_timestamps": times}


def test_parse_sasrec_rows_and_its_checks():
    t = _tool()
    rows = [_row(2, "50,10,30", "5,2,4", "400,400,500"), _row(3, "20", "4", "700"),
            _row(1, "20,40,10", "3,1,5", "100,200,300")]
    assert t.parse_sasrec_rows(iter(rows)) == SEQUENCES  # equal timestamps in either order
    with pytest.raises(ValueError, match="user 1: timestamps not in time order"):
        t.parse_sasrec_rows(iter([_row(1, "20,40", "3,1", "200,100")]))
    with pytest.raises(ValueError, match="user 1: lists of different lengths"):
        t.parse_sasrec_rows(iter([_row(1, "20,40", "3", "100,200")]))
    with pytest.raises(ValueError, match="user 1 appears twice"):
        t.parse_sasrec_rows(iter([_row(1, "20", "3", "100"), _row(1, "40", "1", "200")]))


def test_check_sasrec_file_catches_a_changed_event(tmp_path):
    t = _tool()
    ratings = t.read_ratings(_write(tmp_path))
    path = tmp_path / "sasrec_format.csv"

    def write(rows):
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["index", "user_id", "sequence_item_ids",
                                              "sequence_ratings", "sequence_timestamps"])
            w.writeheader()
            for i, r in enumerate(rows):
                w.writerow({"index": i, **r})

    good = [_row(1, "20,40,10", "3,1,5", "100,200,300"), _row(2, "10,50,30", "2,5,4",
                                                              "400,400,500"),
            _row(3, "20", "4", "700")]
    write(good)
    assert t.check_sasrec_file(str(path), ratings) == 3
    write(good[:2] + [_row(3, "20", "5", "700")])  # a rating changed
    with pytest.raises(ValueError, match="user 3's events differ"):
        t.check_sasrec_file(str(path), ratings)
    write(good[:2])
    with pytest.raises(ValueError, match="users differ"):
        t.check_sasrec_file(str(path), ratings)


def test_cpu_rank_is_a_cpu_device_equal_to_rank_0():
    t = _tool()
    r = t.CpuRank("cpu")
    assert r == 0 and not (r != 0) and r == "cpu" and r != 1
    assert torch.zeros(2).to(r).device.type == "cpu"
    assert torch.zeros(2, device=r).device.type == "cpu"


def test_clock_counts_tokens_and_excludes_evaluation_time():
    t = _tool()
    clock = t.Clock()
    lengths = [torch.tensor([3, 5]), torch.tensor([1])]  # tokens: (4 + 6) + 2 = 12
    loader = [{"history_lengths": x} for x in lengths]
    ev = clock.timed_eval(lambda out: out, collect=True)
    for _row in t._TimedLoader(loader, clock):
        ev({"mrr": torch.tensor([1.0])})  # inside a step: timed, not collected
    # the epoch-end evaluation: collected (two batches of users), then the next epoch starts
    ev({"mrr": torch.tensor([1.0, 0.5]), "hr@10": torch.tensor([True, False])})
    ev({"mrr": torch.tensor([0.25]), "hr@10": torch.tensor([True])})
    for _row in t._TimedLoader(loader[:1], clock):
        pass
    clock.finish_epoch()
    first, second = clock.epochs
    assert (first["tokens"], first["steps"], second["tokens"], second["steps"]) == (12, 2, 10, 1)
    assert first["users"] == 3
    assert first["metrics"]["mrr"] == pytest.approx((1.0 + 0.5 + 0.25) / 3)
    assert first["metrics"]["hr@10"] == pytest.approx(2 / 3)
    assert "metrics" not in second  # no epoch-end evaluation was collected for it
    assert first["train_s"] >= 0 and first["eval_s"] >= 0


@pytest.mark.skipif(not os.path.isdir(os.path.join(REFERENCE, "generative_recommenders")),
                    reason=f"no generative-recommenders checkout at {REFERENCE} "
                           "($GR_REFERENCE_DIR)")
def test_reference_preprocessor_on_a_hand_made_file(tmp_path, monkeypatch):
    pytest.importorskip("pandas")
    t = _tool()
    monkeypatch.syspath_prepend(REFERENCE)
    from generative_recommenders.research.data import preprocessor

    work = tmp_path / "work"
    work.mkdir()
    dp = t.prepare_data(preprocessor.MovielensDataProcessor, _write(tmp_path), str(work), 0)
    assert dp.expected_num_unique_items() == 5 and dp.expected_max_item_id() == 50
    with open(work / dp.output_format_csv(), newline="") as f:
        got = t.parse_sasrec_rows(csv.DictReader(f))
    assert got == SEQUENCES
    with open(work / dp.processed_item_csv(), newline="") as f:
        assert sorted(int(r["movie_id"]) for r in csv.DictReader(f)) == [10, 20, 30, 40, 50]
