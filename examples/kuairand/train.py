#!/usr/bin/env python
"""Train HSTU on KuaiRand -- retrieval (with the SASRec baseline) or the multi-task ranker (with
TorchRec's DLRM baseline): a thin CLI over ``torchrec_ascend.training``.

    python examples/kuairand/train.py --config demo
    python examples/kuairand/train.py --config sample --models hstu,sasrec --epochs 20
    torchrun --nproc_per_node=2 examples/kuairand/train.py --config sample

``--config`` is a name in ``examples/kuairand/configs/`` or a JSON / YAML path (``ranking_*``
configs train the multi-task ranker, docs/ranking.md).  Data file paths may use
``{sample_dir}`` (``$KUAIRAND_SAMPLE_DIR``, default ``../shared/data/kuairand-27k-sample`` from
the repository), ``{pure_slice_dir}`` (``$KUAIRAND_PURE_SLICE_DIR``, default
``../shared/data/kuairand-pure-slice``) and ``{kuairand_dir}`` (``$KUAIRAND_DIR``, default
``data_cache/KuaiRand``: the official CSVs); relative paths are relative to the repository.  Outputs under ``--out`` (default
``outputs/kuairand-<config>``): ``results.json``, ``training.png``, ``<model>/log.jsonl``,
``tb/``, ``<model>/checkpoints/`` (``--resume`` continues exactly).  docs/kuairand.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from torchrec_ascend.training.cli import add_common_arguments, common_overrides, run_cli  # noqa: E402
from torchrec_ascend.training.config import ExperimentConfig, load_config  # noqa: E402

CONFIG_DIR = os.path.join(HERE, "configs")
ENV_SAMPLE = "KUAIRAND_SAMPLE_DIR"
ENV_PURE_SLICE = "KUAIRAND_PURE_SLICE_DIR"
ENV_KUAIRAND = "KUAIRAND_DIR"
SHARED = os.path.join(REPO, "..", "shared", "data")


def resolve_path(p: str) -> str:
    """Expand ``{sample_dir}`` / ``{pure_slice_dir}`` / ``{kuairand_dir}``; relative paths are
    relative to the repo."""
    p = p.format(
        sample_dir=os.environ.get(ENV_SAMPLE, os.path.join(SHARED, "kuairand-27k-sample")),
        pure_slice_dir=os.environ.get(ENV_PURE_SLICE, os.path.join(SHARED, "kuairand-pure-slice")),
        kuairand_dir=os.environ.get(ENV_KUAIRAND, os.path.join(REPO, "data_cache", "KuaiRand")))
    return p if os.path.isabs(p) else os.path.normpath(os.path.join(REPO, p))


def build_config(name: str, sets: List[str]) -> ExperimentConfig:
    cfg, _ = load_config(name, sets, [CONFIG_DIR])
    cfg.data.files = [resolve_path(f) for f in cfg.data.files]
    cfg.data.cache_dir = resolve_path(cfg.data.cache_dir)
    for key in ("user_features", "item_features"):
        if getattr(cfg.data, key):
            setattr(cfg.data, key, resolve_path(getattr(cfg.data, key)))
    return cfg


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="demo", help="config name in configs/ or a path")
    ap.add_argument("--out", default=None, help="output folder (default outputs/kuairand-<config>)")
    add_common_arguments(ap)
    args = ap.parse_args(argv)
    sets = common_overrides(args)

    def out(cfg: ExperimentConfig) -> str:
        return resolve_path(args.out or os.path.join("outputs", f"kuairand-{cfg.name}"))

    return run_cli(lambda: build_config(args.config, sets), out, args)


if __name__ == "__main__":
    sys.exit(main())
