"""Training throughput of the library's trainer: tokens/s, MFU and where a step's time goes, for
HSTU (fp32 and bf16 mixed precision) and SASRec on CPU, at a small and at the paper's scale.

Configs (``--config small|paper|both``):

* ``small``: the demo-sized model (D 64, 2 layers, 2 heads, attention/linear dim 32, max length
  128), batch 32, 256 negatives; contenders HSTU fp32, HSTU bf16, SASRec fp32;
* ``paper``: HSTU at the paper's scale (D 512, 8 layers, 8 heads, attention/linear dim 64, max
  length 1024), batch 8 (~2k tokens a step: a 2-core CPU step of several seconds), 512 negatives;
  contenders HSTU fp32 and HSTU bf16.

Every contender is built by ``torchrec_ascend.training.Trainer`` exactly as a training run builds
it (TorchRec ``EmbeddingCollection`` sharded by the planner under ``DistributedModelParallel``,
one process; fused row-wise Adagrad for the table, AdamW for dense; ``train.precision`` fp32 or
bf16), on a synthetic split (heavy-tailed KuaiRand-like lengths from
``benchmarks.common.heavy_tailed_lengths``, uniform item ids, fixed seeds), driven by the
``semi_async`` pipeline at staleness 0 (synchronous; it times lookup and sparse backward as stages
of their own).  The contenders of a config are timed **alternately, round by round** (HSTU fp32
round r, HSTU bf16 round r, ...) so machine noise hits all alike.

MFU = model FLOPs per second / peak; model FLOPs = forward + backward (3x forward) of the
encoder's matmuls plus the sampled-softmax scoring (torchrec_ascend/metrics/flops.py,
torchrec_ascend/modules/hstu.py).  Peaks: 2048^3 GEMMs in fp32 and bf16 (``torch.mm``,
``torchrec_ascend.device.measure_gemm_gflops``), measured before and after the steps in this run;
a row's peak is the higher of the two for its compute dtype (``mfu``), and ``mfu_fp32_peak``
divides by the fp32 one.  ``breakdown_ms``: benchmarks/train_breakdown.py.

    python benchmarks/train.py --quick     # < 2 min; writes benchmarks/results/train_<cpu kind>.json
    python benchmarks/train.py             # both configs (~5 min idle)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Dict, List, Tuple

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.common import cpu_kind, heavy_tailed_lengths, print_table, write_json  # noqa: E402
from benchmarks.train_breakdown import OffsetsRecorder, StageTimes, breakdown  # noqa: E402
from torchrec_ascend.datasets import Sequences  # noqa: E402
from torchrec_ascend.device import dtype_name, measure_gemm_gflops  # noqa: E402
from torchrec_ascend.ops.hstu_engines import cpu_engine  # noqa: E402
from torchrec_ascend.training import RetrievalTask, Trainer, config_from_dict, leave_two_out  # noqa: E402
from torchrec_ascend.training.console import Console  # noqa: E402
from torchrec_ascend.training.process_group import init_distributed  # noqa: E402

_TRAIN = {"lr": 1e-3, "sparse_lr": 0.05, "temperature": 0.05, "sharding": "row_wise",
          "planner": "torchrec", "pipeline": "semi_async", "staleness": 0, "seed": 0,
          "steps": 100000}
CONFIGS: Dict[str, Dict[str, Any]] = {
    "small": {
        "model": {"embedding_dim": 64, "num_layers": 2, "num_heads": 2, "attention_dim": 32,
                  "linear_dim": 32, "max_seq_len": 128, "dropout": 0.2,
                  "normalization": "max_len", "use_time_bias": True, "use_actions": True,
                  "sasrec_ffn_dim": 128},
        "train": dict(_TRAIN, batch_size=32, num_negatives=256),
        "num_items": 20_000, "num_users": 4_000,
        "contenders": [("hstu", "fp32"), ("hstu", "bf16"), ("sasrec", "fp32")],
        # (warm-up steps, alternating rounds, steps per round): full run, --quick
        "protocol": {False: (5, 5, 8), True: (3, 2, 4)},
    },
    "paper": {
        "model": {"embedding_dim": 512, "num_layers": 8, "num_heads": 8, "attention_dim": 64,
                  "linear_dim": 64, "max_seq_len": 1024, "dropout": 0.2,
                  "normalization": "max_len", "use_time_bias": True, "use_actions": True},
        "train": dict(_TRAIN, batch_size=8, num_negatives=512),
        "num_items": 20_000, "num_users": 2_000,
        "contenders": [("hstu", "fp32"), ("hstu", "bf16")],
        # 40 warm-up steps: in bf16 the CPU's GEMM primitives are built once per 64-row bucket
        # of the batch's token count (modules/row_padding.py, device.GEMM_ROW_MULTIPLE); a long
        # run meets each bucket again.  Batches of 8 heavy-tailed sequences (~30 buckets) met
        # new buckets until step ~30 (minor page faults of the JIT code, per step: 9,000 at
        # steps 0-9, ~5,000 at 10-29, ~100 later; 2026-12-07, 2-core Xeon with AMX)
        "protocol": {False: (40, 3, 4), True: (1, 2, 1)},
    },
}
PEAK_N = 2048
# a dtype whose GEMM rate is below this fraction of fp32's is emulated here (bf16 on an AVX2-only
# CPU, ~100x slower): its peak is the 256^3 probe's and its contenders are not timed
EMULATED_FRACTION = 0.25


def emulated(rate: float, fp32_rate: float) -> bool:
    """True where a GEMM ``rate`` is under ``EMULATED_FRACTION`` of the fp32 one."""
    return rate < EMULATED_FRACTION * fp32_rate


def synthetic_split(max_seq_len: int, num_users: int, num_items: int, seed: int = 0):
    """Heavy-tailed sequences (+2 held-out items each) over ``num_items`` uniform items."""
    g = torch.Generator().manual_seed(seed)
    lens = heavy_tailed_lengths(num_users, max_seq_len, generator=g).clamp(min=2) + 2
    lens = lens.numpy().astype(np.int64)
    rng = np.random.default_rng(seed)
    off = np.zeros(num_users + 1, dtype=np.int64)
    np.cumsum(lens, out=off[1:])
    items = rng.integers(0, num_items, off[-1])
    times = np.concatenate([np.cumsum(rng.integers(1, 3600, n)) for n in lens]) * 1000
    actions = (rng.random((off[-1], 8)) < 0.2).astype(np.uint8)
    bits = (actions << np.arange(8, dtype=np.uint8)).sum(1).astype(np.uint8)
    return leave_two_out(Sequences(items, times, bits, off, np.arange(num_users), num_items))


def peaks() -> Dict[torch.dtype, float]:
    """GFLOP/s of a ``PEAK_N``^3 GEMM in fp32 and bf16, interleaved, now.

    A 256^3 probe first: a dtype below a quarter of fp32's rate there (bf16 on an AVX2-only CPU,
    ~0.5 GFLOP/s: one 2048^3 call would take half a minute) keeps its probe rate as its peak.
    """
    dtypes = (torch.float32, torch.bfloat16)
    probe = measure_gemm_gflops("cpu", dtypes, n=256, min_run_time=0.05, rounds=1)
    fast = [dt for dt in dtypes if not emulated(probe[dt], probe[torch.float32])]
    rates = measure_gemm_gflops("cpu", fast, n=PEAK_N, min_run_time=0.3, rounds=2)
    return {dt: rates.get(dt, probe[dt]) for dt in dtypes}


def runnable_contenders(contenders: List[Tuple[str, str]], peak: Dict[torch.dtype, float]
                        ) -> Tuple[List[Tuple[str, str]], Dict[str, str]]:
    """The contenders worth timing here, and why the others are not.

    A bf16 contender is skipped where this run's bf16 GEMM peak is below a quarter of the fp32
    one (an AVX2-only CPU: bf16 GEMMs are emulated, ~100x slower): ``train.precision = "auto"``
    trains in fp32 there, so a bf16 row would time a configuration no run uses, for minutes.
    """
    keep: List[Tuple[str, str]] = []
    skipped: Dict[str, str] = {}
    slow = emulated(peak[torch.bfloat16], peak[torch.float32])
    for kind, precision in contenders:
        if precision == "bf16" and slow:
            skipped[f"{kind}/{precision}"] = (
                f"bf16 GEMM peak {peak[torch.bfloat16]:.2f} GFLOP/s < 1/4 of fp32's "
                f"{peak[torch.float32]:.1f}: precision=auto trains in fp32 on this CPU")
        else:
            keep.append((kind, precision))
    return keep, skipped


def run_config(name: str, env, quick: bool) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """Train every contender of config ``name`` alternately; one row per contender."""
    spec = CONFIGS[name]
    warmup, rounds, per_round = spec["protocol"][quick]
    split = synthetic_split(spec["model"]["max_seq_len"], spec["num_users"], spec["num_items"])
    peak_before = peaks()
    contenders, skipped = runnable_contenders(spec["contenders"], peak_before)
    trainers: Dict[str, Trainer] = {}
    for kind, precision in contenders:
        cfg = config_from_dict({"data": {"source": "table", "files": ["synthetic"]},
                                "model": spec["model"],
                                "train": dict(spec["train"], precision=precision),
                                "models": [kind]})
        trainers[f"{kind}/{precision}"] = Trainer(cfg, RetrievalTask(cfg, split), env, os.devnull,
                                                  kind, 1e9, progress=False,
                                                  console=Console(False))
    acc = {k: {"tokens": 0.0, "flops": 0.0, "seconds": 0.0, "steps": 0, "loss": float("nan"),
               "stages": StageTimes(), "warmup_tokens": 0.0, "warmup_seconds": 0.0}
           for k in trainers}
    steps = {k: 0 for k in trainers}
    recorders = {k: OffsetsRecorder(t.model.head) for k, t in trainers.items()}

    def run(key: str, n: int, record: bool) -> None:
        a, tr = acc[key], trainers[key]

        def on_step(step: int, loss: float, stats: torch.Tensor, secs: float) -> None:
            a["loss"] = loss
            if not record:  # warm-up steps: their rate is reported beside the timed one
                a["warmup_tokens"] += float(stats[1])
                a["warmup_seconds"] += secs
            else:
                a["tokens"] += float(stats[1])
                a["flops"] += float(stats[2])
                a["seconds"] += secs
                a["steps"] += 1
                a["stages"].record(tr.pipeline)

        steps[key] = tr.train_segment(steps[key], steps[key] + n, on_step)

    t0 = time.perf_counter()
    for key in trainers:
        run(key, warmup, record=False)
    for r in range(rounds):  # alternate round by round (order reversed every other round)
        for key in (list(trainers) if r % 2 == 0 else list(trainers)[::-1]):
            run(key, per_round, record=True)
    wall = time.perf_counter() - t0
    peak_after = peaks()
    peak = {dt: max(peak_before[dt], peak_after[dt]) for dt in peak_before}
    rows: List[Dict[str, Any]] = []
    for key, a in acc.items():
        tr = trainers[key]
        kind, _ = key.split("/")
        dtype = tr.compute_dtype
        stage_ms = a["stages"].means()
        step_ms = 1e3 * a["seconds"] / a["steps"]
        parts = breakdown(step_ms, stage_ms, tr.model.head, recorders[key].offsets, dtype,
                          tr.cfg.train.num_negatives, split.num_items,
                          min_run_time=0.1 if quick else 0.3)
        recorders[key].close()
        rate = a["flops"] / a["seconds"]
        rows.append({"config": name, "model": kind, "dtype": dtype_name(dtype),
                     "steps": int(a["steps"]), "tokens": int(a["tokens"]),
                     "tokens_per_step": a["tokens"] / a["steps"], "seconds": a["seconds"],
                     "tokens_per_s": a["tokens"] / a["seconds"],
                     "warmup_tokens_per_s": a["warmup_tokens"] / max(a["warmup_seconds"], 1e-9),
                     "model_gflops_per_s": rate / 1e9,
                     "mfu": rate / (peak[dtype] * 1e9),
                     "mfu_fp32_peak": rate / (peak[torch.float32] * 1e9),
                     "peak_gemm_gflops": {dtype_name(d): v for d, v in peak.items()},
                     "breakdown_ms": parts, "stage_ms": stage_ms, "final_loss": a["loss"]})
        tr.batches.close()
        close = getattr(tr.pipeline, "close", None)
        if close is not None:
            close()
    info = {"protocol": {"warmup_steps": warmup, "rounds": rounds, "steps_per_round": per_round,
                         "alternating": True, "pipeline": "semi_async", "staleness": 0},
            "peak_gemm_gflops_before": {dtype_name(d): v for d, v in peak_before.items()},
            "peak_gemm_gflops_after": {dtype_name(d): v for d, v in peak_after.items()},
            "skipped": skipped, "wall_s": wall, "model": spec["model"], "train": spec["train"],
            "num_items": spec["num_items"], "num_users": spec["num_users"]}
    for key, why in skipped.items():
        print(f"[{name}] {key} not timed: {why}")
    print(f"[{name}] peak GEMM GFLOP/s before {info['peak_gemm_gflops_before']}, after "
          f"{info['peak_gemm_gflops_after']} ({torch.get_num_threads()} thread(s)); {rounds} "
          f"alternating rounds of {per_round} steps after {warmup} warm-up steps each, {wall:.1f}s")
    return rows, info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few steps")
    ap.add_argument("--config", choices=("small", "paper", "both"), default="both")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (default 1; 0 = torch's default)")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    env = init_distributed("cpu")
    names = ["small", "paper"] if args.config == "both" else [args.config]
    rows: List[Dict[str, Any]] = []
    configs: Dict[str, Any] = {}
    for name in names:
        r, info = run_config(name, env, args.quick)
        rows += r
        configs[name] = info
    flat = [{k: v for k, v in r.items() if k not in ("peak_gemm_gflops", "breakdown_ms",
                                                      "stage_ms")} for r in rows]
    for r, f in zip(rows, flat):
        f["mfu_pct"] = 100 * r["mfu"]
        f["mfu_fp32_peak_pct"] = 100 * r["mfu_fp32_peak"]
    print_table(flat, ["config", "model", "dtype", "tokens_per_step", "tokens_per_s",
                       "model_gflops_per_s", "mfu_pct", "mfu_fp32_peak_pct", "final_loss"])
    print_table([{"config": r["config"], "model": r["model"], "dtype": r["dtype"],
                  **{k: round(v, 1) for k, v in r["breakdown_ms"].items()}} for r in rows])
    path = write_json(f"train_{cpu_kind()}", {"quick": args.quick, "threads": torch.get_num_threads(),
                                "hstu_cpu_engines": {"float32": cpu_engine(torch.float32),
                                                     "bfloat16": cpu_engine(torch.bfloat16)},
                                "configs": configs,
                                "rows": rows})
    print(f"wrote {path}")
    if env.created:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
