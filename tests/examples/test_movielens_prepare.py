"""examples/movielens/prepare.py: a ratings.dat becomes the table reader's CSV; bad data exits 2."""

from __future__ import annotations

import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREPARE = os.path.join(REPO, "examples", "movielens", "prepare.py")


def _main():
    spec = importlib.util.spec_from_file_location("movielens_prepare", PREPARE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


def test_converts_and_reports_rows(tmp_path, capsys):
    src, dst = tmp_path / "ratings.dat", tmp_path / "ratings.csv"
    src.write_text("1::1193::5::978300760\n1::661::3::978302109\n2::1357::5::978298709\n")
    assert _main()([str(src), str(dst)]) == 0
    assert dst.read_text().splitlines() == ["user_id,item_id,rating,timestamp",
                                            "1,1193,5,978300760", "1,661,3,978302109",
                                            "2,1357,5,978298709"]
    assert capsys.readouterr().out.strip() == f"3 ratings -> {dst}"


def test_bad_line_is_one_error_line_and_exit_2(tmp_path, capsys):
    src, dst = tmp_path / "ratings.dat", tmp_path / "ratings.csv"
    src.write_text("1::1193::5::978300760\n1,661,3,978302109\n")
    assert _main()([str(src), str(dst)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: bad data: {src}: row 2 (file line 2): expected 4 '::'-separated "
                   "fields (UserID::MovieID::Rating::Timestamp), got 1: '1,661,3,978302109'"]
    assert not dst.exists()
