#!/usr/bin/env python
"""Meta's reference HSTU (generative-recommenders' research stack) on CPU, on a local ML-1M file.

    python tools/reference_hstu_cpu.py --reference /path/to/generative-recommenders \\
        --ratings ratings.dat --epochs 20 --out runs/reference-e20

Run it with a Python that has the reference's dependencies (``gin-config``, ``pandas``, torch,
``fbgemm_gpu`` (the CPU build), ``absl-py``, ``tensorboard``).  The reference is imported from
``--reference``; nothing of it is copied here and its files are not modified.  What ties its
``train_fn`` to CUDA or to the network is replaced, in memory, for the length of the run:

- the process group is ``gloo`` (the reference: ``nccl``), world size 1;
- the device is the CPU: ``train_fn`` receives as ``rank`` a string ``"cpu"`` that compares equal
  to 0 (so its rank-0 branches still run: TensorBoard writer, final checkpoint) and the
  ``DistributedSampler`` receives the integer 0;
- ``DistributedDataParallel`` is built without ``device_ids`` (CPU DDP does not take them);
- no download: ``ml-1m``'s ``DataProcessor`` is the reference's own ``MovielensDataProcessor``
  with its ``download`` a no-op, run on ``--ratings`` plus two placeholder side files (below),
  its expected item count / largest item id those of ``--ratings`` (its hard-coded 3,706 / 3,952
  are the full ML-1M's);
- ``torch.autograd.set_detect_anomaly(True)``, which ``train_fn`` calls before training, is a
  no-op unless ``--keep-detect-anomaly`` (a debugging aid that makes every step slower and
  changes no number);
- the gin config's ``create_data_loader.num_workers = 8`` / ``prefetch_factor = 128`` become 0 /
  None (``--num-workers``): worker processes would use cores the 1-thread comparison does not
  give either side;
- ``train_fn.num_epochs`` = ``--epochs`` (the config's 101).

``enable_tf32`` sets CUDA-only flags, which do nothing on CPU.  Model, loss, negatives sampler,
optimizer, learning rate, batch size, evaluation and its cadence are the gin config's
(``configs/ml-1m/hstu-sampled-softmax-n128-final.gin`` unless ``--gin``).

Side files.  The reference's ML-1M preprocessor also reads ``users.dat`` (joined into its
sequence file, not read by its data set or model) and ``movies.dat`` (titles and genres become
item features its HSTU does not use; its movie ids are the **corpus** the evaluation ranks
against and the uniform negatives are drawn from).  Only ``ratings.dat`` is at hand, so
``users.dat`` gets one placeholder row per user and ``movies.dat`` one row per movie *rated in
the file*: the corpus is the rated movies, the same corpus our trainer ranks against (the
full ML-1M's ``movies.dat`` also lists 177 movies nobody rated).

Measured, on top of the reference's own log lines and TensorBoard files:

- per epoch, the reference's own end-of-epoch evaluation (every user's last item ranked against
  the corpus, history filtered, ranks above 2,500 capped at 2,501), every metric it computes
  averaged over the users;
- **tokens/s** = training tokens / training seconds, where a step's tokens are the non-padding
  ids of the sequence it trains on (``history_lengths + 1`` per row: the history plus the target
  the training loop scatters into it; our trainer's ``SequenceBatch.num_tokens``, every id of
  the jagged window, counts the same way) and its seconds run from asking the data loader for
  the batch to asking it for the next one (data loading, forward, loss, backward, optimizer,
  logging), minus the time of the reference's evaluations inside that interval
  (``eval_interval``'s evaluation on the training batch).  The epoch-end evaluation is not
  training time.

Writes ``<out>/results.json`` (the shape ``tools/results_table.py`` reads: ``models.hstu.test``
is the last epoch's evaluation, ``evals`` every epoch's) and runs the reference in ``<out>/work``
(``tmp/`` data files, ``exps/`` TensorBoard, ``ckpts/``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

GIN_CONFIG = "configs/ml-1m/hstu-sampled-softmax-n128-final.gin"
METRICS = ("hr@10", "hr@50", "hr@200", "ndcg@10", "ndcg@50", "ndcg@200", "mrr")

Rating = Tuple[int, int, int, int]  # user, movie, rating, timestamp


# --------------------------------------------------------------------------- data files

def read_ratings(path: str) -> List[Rating]:
    """``UserID::MovieID::Rating::Timestamp`` lines -> tuples; a bad line is a ``ValueError``
    naming the file and line."""
    out: List[Rating] = []
    with open(path, encoding="iso-8859-1") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line:
                continue
            parts = line.split("::")
            if len(parts) != 4:
                raise ValueError(f"{path}:{n}: expected 4 '::'-separated fields, got {len(parts)}")
            try:
                out.append((int(parts[0]), int(parts[1]), int(parts[2]), int(parts[3])))
            except ValueError:
                raise ValueError(f"{path}:{n}: fields must be integers, got {line!r}") from None
    if not out:
        raise ValueError(f"{path}: no ratings")
    return out


def side_file_lines(ratings: Sequence[Rating], num_items: Optional[int] = None,
                    ) -> Tuple[List[str], List[str]]:
    """Placeholder ``users.dat`` and ``movies.dat`` lines for the reference's ML-1M preprocessor:
    one user row per user id (``uid::M::1::0::00000``) and one movie row per *rated* movie id
    (``mid::Item mid (2000)::Unknown``), both in increasing id order.  The movie ids are the
    reference's corpus; the titles, genres and user fields are placeholders its HSTU never reads.
    ``num_items``: the corpus is every id ``1..num_items`` instead (items nobody rated included),
    which must hold every rated id."""
    users = sorted({r[0] for r in ratings})
    movies = sorted({r[1] for r in ratings})
    if num_items is not None:
        if num_items < 1 or movies[-1] > num_items:
            raise ValueError(f"num_items: must be >= the largest item id of the ratings "
                             f"({movies[-1]}), got {num_items}")
        movies = list(range(1, num_items + 1))
    return ([f"{u}::M::1::0::00000" for u in users],
            [f"{m}::Item {m} (2000)::Unknown" for m in movies])


def user_sequences(ratings: Sequence[Rating]) -> Dict[int, List[Tuple[int, int, int]]]:
    """Each user's ``(timestamp, movie, rating)`` events sorted by timestamp, ties by movie then
    rating: the canonical form both the reference's file and this check are reduced to (the
    reference sorts with pandas' unstable ``sort_values``, so its order among equal timestamps
    is not defined)."""
    seqs: Dict[int, List[Tuple[int, int, int]]] = {}
    for u, m, r, t in ratings:
        seqs.setdefault(u, []).append((t, m, r))
    for events in seqs.values():
        events.sort()
    return seqs


def parse_sasrec_rows(rows: Iterator[Dict[str, str]]) -> Dict[int, List[Tuple[int, int, int]]]:
    """The reference's ``sasrec_format.csv`` rows (``user_id``, ``sequence_item_ids``,
    ``sequence_ratings``, ``sequence_timestamps``: comma-joined lists) -> the canonical form of
    :func:`user_sequences`; raises ``ValueError`` if a row's timestamps decrease or its three
    lists differ in length."""
    out: Dict[int, List[Tuple[int, int, int]]] = {}
    for row in rows:
        u = int(row["user_id"])
        items = [int(x) for x in row["sequence_item_ids"].split(",")]
        stars = [int(x) for x in row["sequence_ratings"].split(",")]
        times = [int(x) for x in row["sequence_timestamps"].split(",")]
        if not len(items) == len(stars) == len(times):
            raise ValueError(f"sasrec_format.csv: user {u}: lists of different lengths")
        if any(b < a for a, b in zip(times, times[1:])):
            raise ValueError(f"sasrec_format.csv: user {u}: timestamps not in time order")
        if u in out:
            raise ValueError(f"sasrec_format.csv: user {u} appears twice")
        out[u] = sorted(zip(times, items, stars))
    return out


def check_sasrec_file(csv_path: str, ratings: Sequence[Rating]) -> int:
    """Check the reference's sequence file against ``ratings`` (same users, each user's events
    the same and in time order); returns the number of users."""
    import csv

    with open(csv_path, newline="") as f:
        got = parse_sasrec_rows(csv.DictReader(f))
    want = user_sequences(ratings)
    if got.keys() != want.keys():
        raise ValueError(f"{csv_path}: users differ from the ratings file's "
                         f"({len(got)} vs {len(want)})")
    for u, events in want.items():
        if got[u] != events:
            raise ValueError(f"{csv_path}: user {u}'s events differ from the ratings file's")
    return len(want)


def prepare_data(processor_cls: Any, ratings_path: str, workdir: str, seed: int,
                 num_items: Optional[int] = None) -> Any:
    """Run the reference's own ML-1M preprocessor (``processor_cls``, its
    ``MovielensDataProcessor``) on ``ratings_path`` inside ``workdir`` (it writes relative
    ``tmp/`` paths), without downloading; check its ``sasrec_format.csv``; return the processor.
    ``num_items``: the corpus (:func:`side_file_lines`)."""
    import numpy as np

    ratings = read_ratings(ratings_path)
    users, movies = side_file_lines(ratings, num_items)
    folder = os.path.join(workdir, "tmp", "ml-1m")
    os.makedirs(folder, exist_ok=True)
    shutil.copyfile(ratings_path, os.path.join(folder, "ratings.dat"))
    for name, lines in (("users.dat", users), ("movies.dat", movies)):
        with open(os.path.join(folder, name), "w", encoding="iso-8859-1") as f:
            f.write("\n".join(lines) + "\n")
    dp = processor_cls(f"local file {ratings_path}", "tmp/ml-1m/ratings.dat", prefix="ml-1m",
                       convert_timestamp=False,
                       expected_num_unique_items=len({r[1] for r in ratings}),
                       expected_max_item_id=int(movies[-1].split("::", 1)[0]))  # ids ascend
    dp.download = lambda: None  # the files are in place; no network
    np.random.seed(seed)  # its output files are shuffled with numpy's global generator
    with _cwd(workdir):
        dp.preprocess_rating()
        check_sasrec_file(dp.output_format_csv(), ratings)
    return dp


@contextlib.contextmanager
def _cwd(path: str) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


# --------------------------------------------------------------------------- measurement

class CpuRank(str):
    """``"cpu"`` as a device for ``.to()`` / ``device=``, equal to 0 for ``rank == 0`` tests."""

    def __eq__(self, other: object) -> bool:
        return other == 0 or (isinstance(other, str) and str.__eq__(self, other))

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__


class Clock:
    """Training tokens and seconds per epoch, evaluation seconds, epoch-end metrics."""

    def __init__(self, on_epoch: Optional[Callable[["Clock"], None]] = None) -> None:
        self.on_epoch = on_epoch  # called after each epoch (e.g. to write partial results)
        self.epochs: List[Dict[str, Any]] = []
        self.eval_s = 0.0  # all evaluation time so far
        self.in_epoch_eval = False
        self._collected: List[Dict[str, Any]] = []
        self._epoch: Optional[Dict[str, Any]] = None
        self._t0 = time.perf_counter()

    def timed_eval(self, fn: Callable[..., Any], collect: bool) -> Callable[..., Any]:
        """``fn`` with its time added to ``eval_s``; with ``collect``, its per-user metric
        tensors are kept while the epoch-end evaluation runs."""
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            tic = time.perf_counter()
            out = fn(*args, **kwargs)
            self.eval_s += time.perf_counter() - tic
            if collect and self.in_epoch_eval:
                self._collected.append({k: v.detach().float().reshape(-1).cpu()
                                        for k, v in out.items()})
            return out
        return wrapper

    def train_rows(self, loader: Any) -> Iterator[Any]:
        """Iterate ``loader`` (one epoch of training), timing each step from one request for a
        batch to the next, minus the evaluation time in between."""
        self.finish_epoch()
        self._epoch = {"epoch": len(self.epochs), "tokens": 0, "train_s": 0.0, "steps": 0}
        self.in_epoch_eval = False
        it = iter(loader)
        while True:
            tic, eval_before = time.perf_counter(), self.eval_s
            try:
                row = next(it)
            except StopIteration:
                break
            # the step runs between this yield and the next request
            tokens = int((row["history_lengths"] + 1).sum())
            yield row
            self._epoch["train_s"] += time.perf_counter() - tic - (self.eval_s - eval_before)
            self._epoch["tokens"] += tokens
            self._epoch["steps"] += 1
        self.in_epoch_eval = True
        self._epoch["eval_start_s"] = self.eval_s

    def finish_epoch(self) -> None:
        """Close the running epoch: its epoch-end metrics (mean over users) and seconds."""
        if self._epoch is None:
            return
        import torch

        ep = self._epoch
        if self._collected:
            keys = self._collected[0].keys()
            cat = {k: torch.cat([c[k] for c in self._collected]) for k in keys}
            ep["metrics"] = {k: float(v.mean()) for k, v in cat.items() if v.numel()}
            ep["users"] = int(sum(c["mrr"].numel() for c in self._collected))
        ep["eval_s"] = self.eval_s - ep.pop("eval_start_s", self.eval_s)
        ep["tokens_per_s"] = ep["tokens"] / ep["train_s"] if ep["train_s"] > 0 else None
        ep["wall_s"] = time.perf_counter() - self._t0
        self.epochs.append(ep)
        self._collected, self._epoch, self.in_epoch_eval = [], None, False
        m = ep.get("metrics", {})
        print(f"[reference_hstu_cpu] epoch {ep['epoch']}: {ep['steps']} steps, "
              f"{ep['tokens']:,} tokens in {ep['train_s']:.1f} s = {ep['tokens_per_s'] or 0:,.0f} "
              f"tokens/s; " + " ".join(f"{k} {m[k]:.4f}" for k in METRICS if k in m), flush=True)
        if self.on_epoch is not None:
            self.on_epoch(self)


class _TimedLoader:
    """A training ``DataLoader`` whose iteration goes through ``Clock.train_rows``."""

    def __init__(self, loader: Any, clock: Clock) -> None:
        self._loader, self._clock = loader, clock

    def __iter__(self) -> Iterator[Any]:
        return self._clock.train_rows(self._loader)

    def __len__(self) -> int:
        return len(self._loader)


@contextlib.contextmanager
def _patched(changes: Sequence[Tuple[Any, str, Any]]) -> Iterator[None]:
    old = [(obj, name, getattr(obj, name)) for obj, name, _ in changes]
    for obj, name, value in changes:
        setattr(obj, name, value)
    try:
        yield
    finally:
        for obj, name, value in reversed(old):
            setattr(obj, name, value)


# --------------------------------------------------------------------------- the run

def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Import the reference from ``args.reference``, train it on CPU, return the results."""
    import torch

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)  # train_fn seeds only Python's `random`
    sys.path.insert(0, os.path.abspath(args.reference))
    import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm; the reference's main.py does too)
    import gin
    import torch.distributed as dist
    from generative_recommenders.research.data import preprocessor, reco_dataset
    from generative_recommenders.research.trainer import train as ref_train
    from torch.nn.parallel import DistributedDataParallel

    workdir = os.path.join(os.path.abspath(args.out), "work")
    os.makedirs(workdir, exist_ok=True)
    dp = prepare_data(preprocessor.MovielensDataProcessor, args.ratings, workdir, args.seed,
                      args.num_items)

    start = time.perf_counter()
    datasets: Dict[str, Any] = {}

    def write_partial(c: Clock) -> None:  # results so far, in case the run is cut short
        if "metrics" in c.epochs[-1]:
            write_results(args.out, results(args, c, time.perf_counter() - start,
                                            datasets["reco"], bindings, partial=True))

    clock = Clock(write_partial)
    orig_get_dataset, orig_loader = ref_train.get_reco_dataset, ref_train.create_data_loader

    def get_dataset(*a: Any, **kw: Any) -> Any:
        datasets["reco"] = orig_get_dataset(*a, **kw)
        return datasets["reco"]

    def create_loader(dataset: Any, batch_size: int, world_size: int, rank: Any,
                      shuffle: bool, **kw: Any) -> Any:
        sampler, loader = orig_loader(dataset, batch_size=batch_size, world_size=world_size,
                                      rank=0, shuffle=shuffle, **kw)
        if dataset is datasets["reco"].train_dataset:
            loader = _TimedLoader(loader, clock)
        return sampler, loader

    def setup(rank: Any, world_size: int, master_port: int) -> None:
        os.environ["MASTER_ADDR"] = "localhost"
        os.environ["MASTER_PORT"] = str(master_port)
        dist.init_process_group("gloo", rank=0, world_size=world_size)

    def ddp(model: Any, device_ids: Any = None, **kw: Any) -> Any:
        return DistributedDataParallel(model, **kw)

    changes = [
        (reco_dataset, "get_common_preprocessors", lambda: {"ml-1m": dp}),
        (ref_train, "get_reco_dataset", get_dataset),
        (ref_train, "create_data_loader", create_loader),
        (ref_train, "setup", setup),
        (ref_train, "DDP", ddp),
        (ref_train, "get_eval_state", clock.timed_eval(ref_train.get_eval_state, False)),
        (ref_train, "eval_metrics_v2_from_tensors",
         clock.timed_eval(ref_train.eval_metrics_v2_from_tensors, True)),
    ]
    if not args.keep_detect_anomaly:
        changes.append((torch.autograd, "set_detect_anomaly", lambda mode, check_nan=True: None))
    gin_file = os.path.join(os.path.abspath(args.reference), args.gin)
    bindings = [f"train_fn.num_epochs = {args.epochs}",
                f"create_data_loader.num_workers = {args.num_workers}",
                "create_data_loader.prefetch_factor = "
                + ("None" if args.num_workers == 0 else "128")]
    gin.parse_config_files_and_bindings([gin_file], bindings)
    with _patched(changes), _cwd(workdir):
        ref_train.train_fn(CpuRank("cpu"), 1, args.master_port)
        clock.on_epoch = None
        clock.finish_epoch()
    return results(args, clock, time.perf_counter() - start, datasets["reco"], bindings)


def write_results(out: str, res: Dict[str, Any]) -> str:
    """Write ``res`` to ``<out>/results.json`` (atomically); return the path."""
    path = os.path.join(out, "results.json")
    with open(path + ".tmp", "w") as f:
        json.dump(res, f, indent=1)
    os.replace(path + ".tmp", path)
    return path


def results(args: argparse.Namespace, clock: Clock, wall: float, reco: Any,
            bindings: List[str], partial: bool = False) -> Dict[str, Any]:
    """The run as a ``results.json`` that ``tools/results_table.py`` reads (``partial``: written
    after an epoch of a run still going; ``epochs_done`` says how many)."""
    import torch

    eps = clock.epochs
    last = eps[-1]
    tokens = sum(e["tokens"] for e in eps)
    train_s = sum(e["train_s"] for e in eps)
    evals = [{"epoch": e["epoch"] + 1, "split": "test", "tokens_per_s": e["tokens_per_s"],
              "train_s": e["train_s"], "eval_s": e["eval_s"], "wall_s": e["wall_s"],
              **{k: e["metrics"][k] for k in METRICS}} for e in eps]
    return {
        "config": f"reference HSTU ({args.gin})",
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "reference": os.path.abspath(args.reference),
        "gin_overrides": bindings,
        "cpu_overrides": ["process group gloo (was nccl)", "device cpu (was cuda:rank)",
                          "DDP without device_ids",
                          "no download: placeholder users.dat / movies.dat from the ratings",
                          "detect_anomaly " + ("kept" if args.keep_detect_anomaly else "off")],
        "threads": args.threads, "seed": args.seed,
        "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
        "data": {"users": last.get("users"), "items": len(reco.all_item_ids),
                 "max_item_id": reco.max_item_id, "train_tokens_per_epoch": last["tokens"]},
        "partial": partial, "epochs_done": len(eps),
        "config_values": {"train": {"epochs": float(len(eps))}},
        "models": {"hstu": {
            "test": {k: last["metrics"][k] for k in METRICS},
            "tokens_per_s": last["tokens_per_s"],
            "tokens_per_s_mean": tokens / train_s if train_s > 0 else None,
            "steps": sum(e["steps"] for e in eps),
            "train_s": train_s,
            "evals": evals,
        }},
        "seconds": wall,
    }


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", required=True,
                    help="checkout of facebookresearch/generative-recommenders")
    ap.add_argument("--ratings", required=True, help="ML-1M-format ratings.dat")
    ap.add_argument("--out", required=True, help="output folder (results.json, work/)")
    ap.add_argument("--epochs", type=int, required=True, help="train_fn.num_epochs")
    ap.add_argument("--gin", default=GIN_CONFIG, help="gin config, relative to --reference")
    ap.add_argument("--num-items", type=int, default=None,
                    help="corpus = item ids 1..N (default: the rated items)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--num-workers", type=int, default=0, help="create_data_loader.num_workers")
    ap.add_argument("--seed", type=int, default=42, help="torch and numpy seed")
    ap.add_argument("--master-port", type=int, default=29517, help="gloo rendezvous port")
    ap.add_argument("--keep-detect-anomaly", action="store_true",
                    help="let train_fn's torch.autograd.set_detect_anomaly(True) take effect")
    args = ap.parse_args(argv)
    if args.epochs < 1:
        ap.error(f"--epochs must be >= 1, got {args.epochs}")
    if args.threads < 1:
        ap.error(f"--threads must be >= 1, got {args.threads}")
    if not os.path.isfile(os.path.join(args.reference, args.gin)):
        ap.error(f"--reference: no {args.gin} under {args.reference}")
    # the reference runs inside <out>/work: paths given relative to the caller's directory
    args.out, args.ratings = os.path.abspath(args.out), os.path.abspath(args.ratings)
    args.reference = os.path.abspath(args.reference)
    import logging

    logging.basicConfig(stream=sys.stdout, level=logging.INFO)
    res = run(args)
    path = write_results(args.out, res)
    r = res["models"]["hstu"]
    print(f"[reference_hstu_cpu] wrote {path}: " +
          " ".join(f"{k} {r['test'][k]:.4f}" for k in METRICS) +
          f"; tokens/s {r['tokens_per_s']:,.0f} (last epoch), {r['tokens_per_s_mean']:,.0f} (all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
