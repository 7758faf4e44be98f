"""The CLI (``python -m torchrec_ascend.distributed.planner``): text and JSON for a table file
on a preset or a topology file, the picture, and clear errors (exit code 2)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torchrec")

from torchrec_ascend.distributed.planner.__main__ import main  # noqa: E402

TABLES = """batch_size: 32
tables:
  - {name: item, rows: 3000000, dim: 64, pooling: 200, pooled: false}
  - {name: user, rows: 27285, dim: 64}
  - {name: degree, rows: 8, dim: 16}
"""


def test_json_on_a_preset(tmp_path, capsys):
    path = tmp_path / "t.yaml"
    path.write_text(TABLES)
    png = tmp_path / "p.png"
    assert main(["--tables", str(path), "--hosts", "2", "--devices-per-host", "4",
                 "--preset", "h100", "--json", "--plot", str(png)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["batch_size"] == 32 and doc["topology"]["hosts"] == 2
    assert doc["topology"]["devices_per_host"] == 4 and doc["topology"]["name"] == "h100"
    assert len(doc["ranks"]) == 8
    assert {t["table"] for t in doc["tables"]} == {"ebc.user", "ebc.degree", "ec.item"}
    assert doc["totals"]["fits"] is True
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_text_on_a_topology_file_in_a_fresh_process(tmp_path):
    """As a user runs it: npu placements on a machine without an NPU."""
    (tmp_path / "t.yaml").write_text(TABLES)
    (tmp_path / "topo.json").write_text('{"preset": "ascend-a2", "hosts": 4}')
    out = subprocess.run(
        [sys.executable, "-m", "torchrec_ascend.distributed.planner", "--tables",
         str(tmp_path / "t.yaml"), "--topology", str(tmp_path / "topo.json"), "--hosts", "2",
         "--batch-size", "64"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "2 host(s) x 8 npu" in out.stdout and "per-rank batch 64" in out.stdout
    assert "ec.item" in out.stdout and "inter-host" in out.stdout


@pytest.mark.parametrize("content,match,name,args", [
    ("tables: []\n", "non-empty", "t.yaml", []),
    ("batch_size: 8\ntables:\n  - {name: a, rows: 10_000_000_000, dim: 512}\n", "needs",
     "t.yaml", []),
    ("tables:\n  - {name: a, rows: 10, dim: 8\n", "t.yaml' does not parse: ", "t.yaml", []),
    ('{"tables": [', "t.json' does not parse: Expecting value", "t.json", []),
    ("tables:\n  - {name: a, rows: 10, dim: 8, sharding_types: [bogus]}\n",
     "sharding_types ['bogus'] are not TorchRec's (known: data_parallel", "t.yaml", []),
    ("tables:\n  - {name: a, rows: 10, dim: 8}\n", "--hosts=0: must be an integer >= 1",
     "t.yaml", ["--hosts", "0"]),
    ("tables:\n  - {name: a, rows: 10, dim: 8}\n", "800000 ranks; the cost model prices "
     "every pair of ranks and plans at most 2048 ranks", "t.yaml", ["--hosts", "100000"]),
])
def test_errors_exit_2(tmp_path, capsys, content, match, name, args):
    path = tmp_path / name
    path.write_text(content)
    args = args or ["--hosts", "1"]
    assert main(["--tables", str(path), "--devices-per-host", "8" if "--hosts" in args and
                 args[1] != "1" else "2"] + args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and match in err[0], err


@pytest.mark.parametrize("mode", ["2d", "auto"])
def test_two_dim_and_auto_modes(tmp_path, capsys, mode):
    path = tmp_path / "t.yaml"
    path.write_text(TABLES)
    assert main(["--tables", str(path), "--hosts", "2", "--devices-per-host", "2",
                 "--preset", "h100", "--mode", mode, "--sync-every", "1000", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["mode"] in ("1d", "2d") and len(doc["ranks"]) == 4
    if mode == "2d":
        assert doc["mode"] == "2d" and doc["sync_every"] == 1000
        assert {t["mode"] for t in doc["tables"]} <= {"1d", "2d"}
        assert all(t["hosts"] == [0, 1] for t in doc["tables"])


def test_bad_sync_every_exits_2(tmp_path, capsys):
    path = tmp_path / "t.yaml"
    path.write_text(TABLES)
    assert main(["--tables", str(path), "--hosts", "2", "--devices-per-host", "2",
                 "--mode", "2d", "--sync-every", "0"]) == 2
    assert "sync_every" in capsys.readouterr().err
