"""KuaiRand-27K scale on one box: generate a 27K-shaped synthetic log and train the ``27k`` model
config on it with the library's trainer, measuring what it costs.

* **data**: :func:`torchrec_ascend.datasets.synthetic.chain_sequences` (the KuaiRand generator's
  structure: Zipf item popularity, interest-cluster chains, log-normal lengths) at KuaiRand-27K's
  shape, 27,285 users and 32,038,725 items, turned into the trainer's
  :class:`~torchrec_ascend.datasets.Sequences` in memory (positives = clicks; the other action
  bits drawn per event); the generation time is reported;
* **model / training**: ``examples/kuairand/configs/27k.json`` (HSTU, D 64, 8 layers, 4 heads,
  max length 1024, batch 32, 1024 negatives, row-wise Adagrad on the 32M x 64 table, AdamW on the
  dense part), built by :class:`torchrec_ascend.training.Trainer` exactly as a training run
  builds it, driven by the ``semi_async`` pipeline at staleness 0 (synchronous; it times the
  embedding lookup and the sparse backward, in which the fused row-wise Adagrad runs, as stages of
  their own); the step's split into its parts is ``benchmarks/train_breakdown.py``'s;
* **memory**: the table is ``rows x dim x 4`` bytes of fp32 weights + ``rows x 4`` of row-wise
  Adagrad state; before building it the script checks ``MemAvailable`` (``/proc/meminfo``) and
  refuses to start (exit 2, naming what does not fit) unless the table + state + a margin fit, so
  a shared machine is not pushed into swap or the OOM killer.  Peak RSS:
  :func:`torchrec_ascend.datasets.peak_rss_mb` (``VmHWM``); the RSS after each phase from
  ``/proc/self/statm``.

    python benchmarks/scale.py --quick     # 4M items; writes benchmarks/results/scale_quick.json
    python benchmarks/scale.py             # 32M items; writes benchmarks/results/scale.json
    python benchmarks/scale.py --doc       # rewrite docs/kuairand.md's section from the JSON
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.common import (RESULTS_DIR, doc_section, print_table,  # noqa: E402
                               replace_doc_section, write_json)
from benchmarks.train_breakdown import OffsetsRecorder, StageTimes, breakdown  # noqa: E402
from torchrec_ascend.datasets import Sequences, peak_rss_mb  # noqa: E402
from torchrec_ascend.datasets.schema import ACTION_BITS  # noqa: E402
from torchrec_ascend.datasets.synthetic import SyntheticConfig, chain_sequences  # noqa: E402
from torchrec_ascend.training import RetrievalTask, Trainer, config_from_dict, leave_two_out  # noqa: E402
from torchrec_ascend.training.console import Console  # noqa: E402
from torchrec_ascend.training.process_group import init_distributed  # noqa: E402

CONFIG = os.path.join(REPO, "examples", "kuairand", "configs", "27k.json")
DOC = os.path.join(REPO, "docs", "kuairand.md")
RESULTS = {"full": os.path.join(RESULTS_DIR, "scale.json"),
           "quick": os.path.join(RESULTS_DIR, "scale_quick.json")}
USERS_27K, ITEMS_27K = 27_285, 32_038_725
MARGIN_BYTES = 3 << 30  # what the rest of the run (data, dense model, batches) is given
# (items, users, mean clicked-sequence length, warm-up steps, timed steps) of each mode
MODES = {"quick": (4_000_000, 4_000, 60.0, 2, 8), "full": (ITEMS_27K, USERS_27K, 60.0, 3, 300)}
_T0_MS = 1649347200000  # 2022-04-08 00:00 +08:00 (KuaiRand's first day)


def synthetic_27k_sequences(num_users: int, num_items: int, mean_len: float, max_len: int,
                            seed: int = 0) -> Sequences:
    """Per-user click sequences of :func:`chain_sequences` over ``num_items`` items, as the
    trainer's :class:`Sequences`: item ids are the item indices (``num_items`` = the corpus),
    times strictly increasing per user (ms), actions = the click bit plus like / long_view
    bits drawn per event.  Lengths are log-normal with mean ``mean_len`` clipped to
    ``[4, max_len]``."""
    if max_len < 4:
        raise ValueError(f"max_len: must be >= 4, got {max_len}")
    cfg = SyntheticConfig(num_users=num_users, num_items=num_items,
                          num_clusters=max(2, min(num_items, num_items // 50)),
                          mean_len=mean_len, min_len=4, max_len=max_len, seed=seed)
    rng = np.random.default_rng(seed)
    _, _, seqs = chain_sequences(cfg, rng)
    lens = np.array([len(s) for s in seqs], dtype=np.int64)
    offsets = np.zeros(num_users + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    items = np.concatenate(seqs).astype(np.int64)
    gaps = rng.exponential(600_000.0, len(items)).astype(np.int64) + 1000
    times = np.cumsum(gaps)
    starts = np.repeat(times[offsets[:-1]] - gaps[offsets[:-1]], lens)  # restart per user
    user_t0 = np.repeat(rng.integers(0, 14 * 86400_000, num_users), lens)
    times = _T0_MS + user_t0 + times - starts
    r = rng.random((len(items), 2))
    actions = (ACTION_BITS["click"] + ACTION_BITS["like"] * (r[:, 0] < 0.15)
               + ACTION_BITS["long_view"] * (r[:, 1] < 0.4)).astype(np.uint8)
    return Sequences(items, times, actions, offsets, np.arange(num_users, dtype=np.int64),
                     int(num_items))


def table_bytes(num_items: int, dim: int) -> Dict[str, int]:
    """Bytes of the item table: fp32 weights, row-wise Adagrad state (one fp32 per row), and
    the weights in fp16 / bf16 storage (what would hold where fp32 does not)."""
    for name, v in (("num_items", num_items), ("dim", dim)):
        if v < 1:
            raise ValueError(f"{name}: must be >= 1, got {v}")
    return {"weights_fp32": num_items * dim * 4, "rowwise_adagrad_state": num_items * 4,
            "weights_fp16": num_items * dim * 2}


def mem_available_bytes() -> int:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo: no MemAvailable line")


def check_fits(need: Dict[str, int], available: int, margin: int = MARGIN_BYTES) -> None:
    """Raise ``MemoryError`` naming the sizes unless fp32 weights + Adagrad state + ``margin``
    fit in ``available`` bytes (and whether fp16 storage would)."""
    fp32 = need["weights_fp32"] + need["rowwise_adagrad_state"] + margin
    if fp32 <= available:
        return
    fp16 = need["weights_fp16"] + need["rowwise_adagrad_state"] + margin
    raise MemoryError(
        f"table: fp32 weights {need['weights_fp32'] / 2**30:.2f} GiB + row-wise Adagrad "
        f"{need['rowwise_adagrad_state'] / 2**30:.2f} GiB + margin {margin / 2**30:.1f} GiB = "
        f"{fp32 / 2**30:.2f} GiB > MemAvailable {available / 2**30:.2f} GiB; fp16 storage "
        f"would need {fp16 / 2**30:.2f} GiB ({'fits' if fp16 <= available else 'does not fit'})")


def rss_bytes() -> int:
    """Current resident set size of this process (``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def build_config(steps: int) -> Any:
    """The ``27k`` config, data replaced by the in-memory synthetic split, the ``semi_async``
    pipeline at staleness 0 (it times lookup and sparse backward), no eval / checkpoints."""
    with open(CONFIG) as f:
        raw = json.load(f)
    raw["data"] = {"source": "table", "files": ["synthetic"]}
    raw["train"].update(pipeline="semi_async", staleness=0, steps=steps, eval_every=0,
                        checkpoint_every=0)
    raw["models"] = ["hstu"]
    return config_from_dict(raw), raw


def run(mode: str, threads: int, steps_override: int = 0) -> Dict[str, Any]:
    """Generate, build, train; the result document (module docstring)."""
    num_items, num_users, mean_len, warmup, steps = MODES[mode]
    steps = steps_override or steps
    cfg, raw = build_config(warmup + steps)
    phases: Dict[str, Dict[str, float]] = {}
    load_before = os.getloadavg()
    avail_before = mem_available_bytes()

    t0, c0 = time.perf_counter(), time.process_time()
    seqs = synthetic_27k_sequences(num_users, num_items, mean_len, cfg.model.max_seq_len + 2)
    split = leave_two_out(seqs)
    gen_s = time.perf_counter() - t0
    phases["generate"] = {"seconds": gen_s, "cpu_s": time.process_time() - c0,
                          "rss_gib": rss_bytes() / 2**30}
    print(f"generated {num_users} users x {num_items} items, {len(seqs.items)} events in "
          f"{gen_s:.1f}s", flush=True)

    need = table_bytes(num_items, cfg.model.table_dim)
    check_fits(need, mem_available_bytes())
    env = init_distributed("cpu")
    t0, c0 = time.perf_counter(), time.process_time()
    tr = Trainer(cfg, RetrievalTask(cfg, split), env, os.devnull, "hstu", 1e9, progress=False,
                 console=Console(False))
    phases["build"] = {"seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                       "rss_gib": rss_bytes() / 2**30}
    print(f"built the trainer in {phases['build']['seconds']:.1f}s "
          f"(RSS {phases['build']['rss_gib']:.2f} GiB)", flush=True)
    rec = OffsetsRecorder(tr.model.head)
    acc: Dict[str, Any] = {"tokens": 0.0, "seconds": 0.0, "steps": 0, "loss": [],
                           "stages": StageTimes()}

    def on_step(step: int, loss: float, stats: torch.Tensor, secs: float) -> None:
        acc["loss"].append(loss)
        if step <= warmup:
            return
        acc["tokens"] += float(stats[1])
        acc["seconds"] += secs
        acc["steps"] += 1
        acc["stages"].record(tr.pipeline)

    t0, c0 = time.perf_counter(), time.process_time()
    tr.train_segment(0, warmup + steps, on_step)
    phases["train"] = {"seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                       "rss_gib": rss_bytes() / 2**30}
    load_after = os.getloadavg()
    stage_ms = acc["stages"].means()
    step_ms = 1e3 * acc["seconds"] / acc["steps"]
    parts = breakdown(step_ms, stage_ms, tr.model.head, rec.offsets, tr.compute_dtype,
                      cfg.train.num_negatives, split.num_items, min_run_time=0.2)
    rec.close()
    lookup_update = parts["embedding_lookup_update"]
    result = {
        "mode": mode, "threads": torch.get_num_threads(), "config": "27k",
        "num_items": num_items, "num_users": num_users, "events": int(len(seqs.items)),
        "mean_len": mean_len, "generation_s": gen_s,
        "table_bytes": need, "table_rows": num_items, "table_dim": cfg.model.table_dim,
        "table_storage": "fp32", "sharding": tr.sharding_type,
        "warmup_steps": warmup, "steps": acc["steps"],
        "tokens_per_step": acc["tokens"] / acc["steps"],
        "tokens_per_s": acc["tokens"] / acc["seconds"], "step_ms": step_ms,
        "lookup_update_ms": lookup_update, "dense_ms": step_ms - lookup_update,
        "breakdown_ms": parts, "stage_ms": stage_ms,
        "loss_first": acc["loss"][0], "loss_last": acc["loss"][-1],
        "peak_rss_gib": peak_rss_mb() / 1024, "phases": phases,
        "mem_available_gib_before": avail_before / 2**30,
        "loadavg_before": list(load_before), "loadavg_after": list(load_after),
        "model": raw["model"], "train": raw["train"],
    }
    tr.batches.close()
    close = getattr(tr.pipeline, "close", None)
    if close is not None:
        close()
    if env.created:
        torch.distributed.destroy_process_group()
    return result


def _cpu(res: Dict[str, Any], phase: str) -> str:
    """A phase's process CPU seconds, ``-`` in a result file written before they were kept."""
    cpu = res["phases"][phase].get("cpu_s")
    return "-" if cpu is None else f"{cpu:.1f}"


def markdown(docs: Dict[str, Dict[str, Any]]) -> str:
    """docs/kuairand.md's ``scale`` section: one column per result file (``full``, ``quick``)."""
    cols = [m for m in ("full", "quick") if m in docs]
    if not cols:
        raise ValueError("docs: no scale result (run benchmarks/scale.py first)")
    rows = [
        ("items (table rows) x dim", lambda r: f"{r['num_items']:,} x {r['table_dim']}"),
        ("users / events (clicks)", lambda r: f"{r['num_users']:,} / {r['events']:,}"),
        ("generation: wall / process CPU (s)",
         lambda r: f"{r['generation_s']:.1f} / {_cpu(r, 'generate')}"),
        ("table: fp32 weights + row-wise Adagrad (GB)", lambda r: (
            f"{r['table_bytes']['weights_fp32'] / 1e9:.2f} + "
            f"{r['table_bytes']['rowwise_adagrad_state'] / 1e9:.3f}")),
        ("trainer build (planner, shard, table init): wall / CPU (s)", lambda r: (
            f"{r['phases']['build']['seconds']:.1f} / {_cpu(r, 'build')}")),
        ("RSS after build (GiB)", lambda r: f"{r['phases']['build']['rss_gib']:.2f}"),
        ("peak RSS (GiB)", lambda r: f"{r['peak_rss_gib']:.2f}"),
        ("timed steps (after warm-up)", lambda r: f"{r['steps']} (+{r['warmup_steps']})"),
        ("tokens / step", lambda r: f"{r['tokens_per_step']:,.0f}"),
        ("tokens / s", lambda r: f"{r['tokens_per_s']:,.0f}"),
        ("ms / step", lambda r: f"{r['step_ms']:.1f}"),
        ("step: embedding lookup + update (ms)", lambda r: f"{r['lookup_update_ms']:.1f}"),
        ("step: dense, the rest (ms)", lambda r: f"{r['dense_ms']:.1f}"),
    ] + [(f"dense: {k} (ms)", (lambda k: lambda r: f"{r['breakdown_ms'][k]:.1f}")(k)) for k in
         ("attention", "projections", "sampled_softmax", "optimizer", "overhead")] + [
        ("loss: first -> last step", lambda r: f"{r['loss_first']:.2f} -> {r['loss_last']:.2f}"),
        ("MemAvailable before (GiB)", lambda r: f"{r['mem_available_gib_before']:.1f}"),
        ("load average before -> after (1 min)",
         lambda r: f"{r['loadavg_before'][0]:.1f} -> {r['loadavg_after'][0]:.1f}"),
        ("threads", lambda r: str(r["threads"])),
    ]
    names = {"full": "`scale.py` (27K shape)", "quick": "`scale.py --quick`"}
    out = ["| | " + " | ".join(names[c] for c in cols) + " |",
           "|---|" + "---|" * len(cols)]
    out += [f"| {label} | " + " | ".join(fn(docs[c]) for c in cols) + " |" for label, fn in rows]
    return "\n".join(out)


def load_results() -> Dict[str, Dict[str, Any]]:
    """The committed result files that exist, by mode."""
    out = {}
    for mode, path in RESULTS.items():
        if os.path.exists(path):
            with open(path) as f:
                out[mode] = json.load(f)
    return out


def documented(path: str = DOC) -> Any:
    """docs/kuairand.md's ``scale`` section as it is now (None without one)."""
    with open(path) as f:
        return doc_section(f.read(), "scale")


def update_doc(path: str = DOC) -> None:
    """Rewrite docs/kuairand.md's ``scale`` section from the result files."""
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(replace_doc_section(text, "scale", markdown(load_results())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="4M items, 8 timed steps (< 60 s idle)")
    ap.add_argument("--steps", type=int, default=0, help="timed steps (default: the mode's)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (default 1; 0 = torch's default)")
    ap.add_argument("--doc", action="store_true",
                    help="only rewrite docs/kuairand.md's section from the committed JSON")
    args = ap.parse_args()
    if args.doc:
        update_doc()
        print(f"updated {DOC}")
        return
    if args.steps < 0:
        ap.error(f"--steps: must be >= 0, got {args.steps}")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        res = run("quick" if args.quick else "full", args.threads, args.steps)
    except MemoryError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    rows: List[Dict[str, Any]] = [{k: res[k] for k in (
        "num_items", "events", "generation_s", "steps", "tokens_per_step", "tokens_per_s",
        "step_ms", "lookup_update_ms", "dense_ms", "peak_rss_gib")}]
    print_table(rows, list(rows[0]))
    print_table([{k: round(v, 1) for k, v in res["breakdown_ms"].items()}])
    path = write_json("scale_quick" if args.quick else "scale", res)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
