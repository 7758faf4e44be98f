"""``python -m torchrec_ascend.training``: train HSTU on any user / item / timestamp table.

    python -m torchrec_ascend.training --data events.csv --out runs/events
    python -m torchrec_ascend.training --task ranking --data log.csv --label-cols click,like \
        --context-cols page --out runs/rank
    python -m torchrec_ascend.training --data ratings.parquet --user-col uid --item-col iid \\
        --time-col ts --config reference --set train.batch_size=64 --epochs 10 --out runs/r
    torchrun --nproc_per_node=2 -m torchrec_ascend.training --data events.csv --out runs/e

Writes ``<out>/results.json`` (see :mod:`.experiment`), ``<out>/training.png``,
``<out>/<model>/log.jsonl``, ``<out>/tb/``, ``<out>/<model>/checkpoints/``, ``<out>/run.json``.
Bad data, a bad config value or path, a folder that holds another run, a diverging training or
a lost peer rank: one line ``error: ...`` naming the file / row / column, the key and the rule,
or the step / rank, exit status 2 (on every rank), nothing written into an existing output
folder before the run starts (docs/training.md, "What happens when things go wrong").

:func:`add_common_arguments` and :func:`run_cli` are shared with the KuaiRand example's CLI.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch.distributed as dist

from ..datasets import DataError
from ..distributed.train_pipeline import PeerFailureError
from ..distributed.train_pipeline.faults import is_peer_failure
from ..metrics import NonFiniteScoreError
from .config import CONFIG_DIR, ConfigError, ExperimentConfig, load_config
from .task import TASK_KINDS

RANKING_PRESET = "ranking"
"""The packaged config ``--task ranking`` starts from when no ``--config`` is given."""
from .trainer import NonFiniteTrainingError

__all__ = ["main", "add_common_arguments", "common_overrides", "run_cli", "CONFIG_DIR"]



def add_common_arguments(ap: argparse.ArgumentParser) -> None:
    """Options every trainer CLI has."""
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config value, e.g. --set train.batch_size=64 (JSON values)")
    ap.add_argument("--steps", type=int, default=None, help="train.steps")
    ap.add_argument("--epochs", type=float, default=None,
                    help="train.epochs (instead of steps: passes over the trainable users)")
    ap.add_argument("--models", default=None,
                    help="comma list of models: hstu,sasrec (retrieval; default hstu) or "
                         "hstu,dlrm (ranking; default both)")
    ap.add_argument("--resume", action="store_true",
                    help="continue the run in --out from its newest intact checkpoint")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace the run that --out holds (its run files are removed when the "
                         "new run starts)")
    ap.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    ap.add_argument("--threads", type=int, default=None, help="train.threads")


def common_overrides(args: argparse.Namespace) -> List[str]:
    """``--set`` overrides for the common options (appended after the user's ``--set``)."""
    sets = list(args.set)
    if args.steps is not None:
        sets += [f"train.steps={args.steps}", "train.epochs=null"]
    if args.epochs is not None:
        sets += [f"train.epochs={args.epochs}", "train.steps=null"]
    if args.models:
        sets.append("models=" + json.dumps(args.models.split(",")))
    if args.threads is not None:
        sets.append(f"train.threads={args.threads}")
    return sets


def _rank() -> int:
    if dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def run_cli(build: Callable[[], ExperimentConfig], out: Callable[[ExperimentConfig], str],
            args: argparse.Namespace) -> int:
    """Build the config (validated), run it; bad input -> one line on stderr, exit 2."""
    from .experiment import run_experiment

    try:
        try:
            cfg = build()
            run_experiment(cfg, out(cfg), resume=args.resume, progress=not args.no_progress,
                           overwrite=args.overwrite)
            return 0
        except ConfigError as e:
            msg = f"error: bad config: {e}"
        except DataError as e:
            msg = f"error: bad data: {e}"
        except (NonFiniteScoreError, NonFiniteTrainingError) as e:
            msg = f"error: {e}"
        except Exception as e:  # a lost peer: every surviving rank says so, in one line
            if not isinstance(e, PeerFailureError):
                if not is_peer_failure(e):  # (a lost peer outside the step's own collectives:
                    raise                   # metrics, evaluation, checkpoints)
                e = PeerFailureError.of(e, f"rank {_rank()}")
            print("error: " + " ".join(str(e).split()), file=sys.stderr, flush=True)
            return 2
        if _rank() == 0:
            print(msg, file=sys.stderr, flush=True)
        return 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m torchrec_ascend.training",
                                 description="Train HSTU on a table of user / item / timestamp "
                                             "interactions: next-item retrieval (and the SASRec "
                                             "baseline), or a multi-task ranker of label "
                                             "columns (and TorchRec's DLRM baseline).")
    ap.add_argument("--data", nargs="+", required=True, metavar="FILE",
                    help="CSV / TSV / Parquet file(s) or glob(s)")
    ap.add_argument("--user-col", default=None, help="user id column (default user_id)")
    ap.add_argument("--item-col", default=None, help="item id column (default item_id)")
    ap.add_argument("--time-col", default=None, help="timestamp column (default timestamp)")
    ap.add_argument("--sep", default=None, help="CSV / TSV delimiter (default: detected)")
    ap.add_argument("--task", default=None, choices=TASK_KINDS,
                    help="retrieval (default: next item, HR / NDCG) or ranking (per-task "
                         "labels, AUC / GAUC / NE; needs --label-cols)")
    ap.add_argument("--label-cols", default=None, metavar="A,B,...",
                    help="ranking: the 0/1 label columns (data.action_cols), one task each")
    ap.add_argument("--context-cols", default=None, metavar="A,B,...",
                    help="ranking: integer columns known when an impression was served (e.g. "
                         "its page): candidate features (data.context_cols)")
    ap.add_argument("--user-features", default=None, metavar="FILE",
                    help="ranking: a CSV of user side features (data.user_features)")
    ap.add_argument("--item-features", default=None, metavar="FILE",
                    help="ranking: a CSV of item side features (data.item_features)")
    ap.add_argument("--config", default=None,
                    help=f"config name in {CONFIG_DIR} or a JSON / YAML path (default: the "
                         f"built-in defaults; with --task ranking the {RANKING_PRESET!r} config)")
    ap.add_argument("--out", required=True, help="output folder")
    add_common_arguments(ap)
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    base: Dict[str, Any] = {"data": {"source": "table", "files": list(args.data)}}
    for flag, key in (("user_col", "user_col"), ("item_col", "item_col"),
                      ("time_col", "time_col"), ("sep", "sep"), ("user_features", "user_features"),
                      ("item_features", "item_features")):
        v = getattr(args, flag)
        if v is not None:
            base["data"][key] = v
    for flag, key in (("label_cols", "action_cols"), ("context_cols", "context_cols")):
        v = getattr(args, flag)
        if v is not None:
            base["data"][key] = [c.strip() for c in v.split(",") if c.strip()]
    if args.task is not None:
        base["task"] = args.task
    sets = common_overrides(args)
    sets.append("data.source=table")

    def build() -> ExperimentConfig:
        for path in args.data:
            if os.path.isdir(path):
                raise ConfigError("--data", f"{path!r} is a folder: name the data files (CSV, "
                                            "TSV or Parquet) or a glob such as "
                                            f"'{os.path.join(path, '*.csv')}'")
        preset = args.config or (RANKING_PRESET if args.task == "ranking" else None)
        cfg, _ = load_config(preset, sets, [CONFIG_DIR], base=base)
        # the command line's data wins over a config file's
        cfg.data.files = list(args.data)
        return cfg

    return run_cli(build, lambda cfg: args.out, args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
