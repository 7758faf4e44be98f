"""Config loading and validation: every bad value is a ConfigError naming the key and rule."""

from __future__ import annotations

import json

import pytest

from torchrec_ascend.training.config import (ConfigError, apply_overrides, config_from_dict,
                                             load_config)

BASE = {"data": {"source": "table", "files": ["e.csv"]}}


def make(**sections):
    raw = json.loads(json.dumps(BASE))
    for name, values in sections.items():
        if isinstance(values, dict):
            raw.setdefault(name, {}).update(values)
        else:
            raw[name] = values
    return config_from_dict(raw)


def test_defaults_are_valid_and_dims_pad_to_4():
    cfg = make(model={"embedding_dim": 50})
    assert cfg.model.table_dim == 52 and cfg.model.embedding_dim == 50
    assert make(model={"embedding_dim": 64}).model.table_dim == 64
    assert cfg.train.pipeline == "sparse_dist" and cfg.train.balance == "none"
    assert cfg.train.precision == "fp32" and cfg.train.negatives == "shared"
    assert make(train={"precision": "auto"}).train.precision == "auto"


@pytest.mark.parametrize("section,values,message", [
    ("model", {"embedding_dim": 0}, "model.embedding_dim: 0 is not an integer >= 1"),
    ("model", {"embedding_dim": 2.5}, "model.embedding_dim: 2.5 is not an integer"),
    ("model", {"dropout": 1.0}, "model.dropout: 1.0 is not in [0, 1)"),
    ("model", {"normalization": "x"}, "model.normalization: 'x' is not one of ['max_len', 'seq_len']"),
    ("model", {"max_seq_len": 1}, "model.max_seq_len: 1 is not an integer >= 2"),
    ("train", {"batch_size": True}, "train.batch_size: True is not an integer"),
    ("train", {"steps": 5, "epochs": 2}, "train.steps: 5 given together with train.epochs=2.0"),
    ("train", {"lr": 0}, "train.lr: 0.0 is not > 0"),
    ("train", {"planner": "magic"}, "train.planner: 'magic' is not one of ['torchrec', 'hierarchical', 'hierarchical_2d']"),
    ("train", {"negatives": "pool"}, "train.negatives: 'pool' is not one of ['shared', 'per_position']"),
    ("train", {"balance": "x"}, "train.balance: 'x' is not one of ['none', 'collator', 'all_to_all']"),
    ("train", {"balance_ahead": True}, "train.balance_ahead: needs train.balance='all_to_all' (got 'none')"),
    ("train", {"pipeline": "x"}, "train.pipeline: 'x' is not one of ['sync', 'sparse_dist', "
                                 "'semi_async']"),
    ("train", {"pipeline": "base"}, "train.pipeline: 'base' is not one of"),
    ("train", {"staleness": 1}, "train.staleness: 1 needs train.pipeline='semi_async' "
                                "(pipeline 'sparse_dist' is synchronous: 0 only)"),
    ("train", {"pipeline": "sync", "staleness": 2}, "train.staleness: 2 needs train.pipeline="),
    ("train", {"pipeline": "semi_async", "staleness": -1},
     "train.staleness: -1 is not an integer >= 0"),
    ("train", {"staleness": 1.5}, "train.staleness: 1.5 is not an integer"),
    ("train", {"pipeline": "semi_async", "sync_warmup_steps": 10},
     "train.sync_warmup_steps: 10 needs train.staleness >= 1"),
    ("train", {"pipeline": "semi_async", "staleness": 1, "sync_warmup_steps": -2},
     "train.sync_warmup_steps: -2 is not an integer >= 0"),
    ("train", {"step_timeout_s": 0}, "train.step_timeout_s: 0.0 is not > 0"),
    ("train", {"early_stopping_patience": 2}, "train.early_stopping_patience: needs train.eval_every"),
    ("train", {"unknown": 1}, "train.unknown: unknown key"),
    ("train", {"precision": "fp16"}, "train.precision: 'fp16' is not one of ['auto', 'fp32', 'bf16']"),
    ("train", {"precision": 16}, "train.precision: 16 is not a string"),
    ("eval", {"metric": "ndcg@7"}, "eval.metric: 'ndcg@7' is not one of"),
    ("eval", {"holdout": "last"}, "eval.holdout: 'last' is not one of ['leave_two_out', "
                                  "'leave_one_out']"),
    ("eval", {"holdout": "leave_one_out", "restore_best": True},
     "eval.restore_best: needs train.eval_every > 0"),
    ("data", {"files": []}, "data.files: source 'table' needs at least one file"),
    ("data", {"min_len": 2}, "data.min_len: 2 is not an integer >= 3"),
    ("data", {"positive": {"any_of": ["click"]}}, "data.positive: a positive rule needs data.action_cols"),
    ("models", ["hstu", "bert4rec"], "models[1]: 'bert4rec' is not one of ['hstu', 'sasrec']"),
])
def test_bad_values_name_key_and_rule(section, values, message):
    with pytest.raises(ConfigError) as e:
        make(**{section: values})
    assert str(e.value).startswith(message), str(e.value)


def test_overrides_json_values_and_sections():
    raw = apply_overrides({}, ["train.lr=0.01", "model.use_actions=false", "name=x",
                               "data.files=[\"a.csv\",\"b.csv\"]", "data.sep=;"])
    assert raw == {"train": {"lr": 0.01}, "model": {"use_actions": False}, "name": "x",
                   "data": {"files": ["a.csv", "b.csv"], "sep": ";"}}
    with pytest.raises(ConfigError, match="--set: expected key.path=value"):
        apply_overrides({}, ["train.lr"])
    with pytest.raises(ConfigError, match="^name: is a value, not a section"):
        apply_overrides({"name": "x"}, ["name.y=1"])


def test_yaml_and_json_files_load_the_same(tmp_path):
    doc = {"model": {"embedding_dim": 48}, "train": {"epochs": 3}}
    (tmp_path / "c.json").write_text(json.dumps(doc))
    (tmp_path / "c.yaml").write_text("model:\n  embedding_dim: 48\ntrain:\n  epochs: 3\n")
    a, _ = load_config(str(tmp_path / "c.json"), ["data.files=[\"e.csv\"]"])
    b, _ = load_config(str(tmp_path / "c.yaml"), ["data.files=[\"e.csv\"]"])
    assert a.model == b.model and a.train == b.train and a.train.epochs == 3.0
    with pytest.raises(ConfigError, match="^--config: 'nope' is neither a file nor one of"):
        load_config("nope")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ConfigError, match="does not parse"):
        load_config(str(tmp_path / "broken.json"))


def test_named_reference_config():
    cfg, _ = load_config("reference", ["data.files=[\"e.csv\"]"])
    assert (cfg.model.embedding_dim, cfg.model.table_dim, cfg.model.num_heads,
            cfg.model.max_seq_len, cfg.train.batch_size, cfg.train.negatives,
            cfg.train.num_negatives) == (50, 52, 1, 200, 128, "per_position", 128)
