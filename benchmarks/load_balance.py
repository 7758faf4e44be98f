"""Load balancing of jagged HSTU batches across ranks: cost imbalance, measured step imbalance and
the balancer's overhead.

1. **Cost imbalance** (``max rank cost / mean rank cost - 1``) at 2, 8, 16 and 64 ranks (simulated:
   plans only), median over global batches of ``--batch-per-rank`` sequences per rank:
   ``random`` = a random permutation cut into equal counts (what a DistributedSampler gives),
   ``ours`` = :func:`plan_assignment` (count limit 2x the per-rank batch).  Costs: the HSTU cost
   model calibrated on this machine (one thread, the encoder below).  Lengths: KuaiRand-like
   (``benchmarks.common.heavy_tailed_lengths``, mean max_len / 4) and the real lengths of the
   shared KuaiRand-27K sample (liked videos, min length 3; truncated to max_len as training does;
   global batches drawn with replacement from its 664 users).
2. **Measured step imbalance on 2 gloo ranks** (one thread each): every step both ranks draw the
   same global batch; each runs the real HSTU encoder forward + backward (plus an item embedding)
   on its share, timed between barriers; imbalance = max / mean - 1 of the two compute times.
   Modes alternate step by step in one run: ``random`` (equal counts), ``ours``
   (:class:`AllToAllBalancer` moves the samples), and ``same`` (both ranks run the identical batch:
   the noise floor of this shared machine).  Medians over steps.
3. **Overhead**: the balancer's wall time per step (``balance`` = 2 all_gathers + plan + one
   all_to_all of ids/timestamps/action bits/user ids, plus one ``restore`` of a per-sample tensor),
   the slower rank's, as a share of the ``ours`` step (compute + balancer).

    python benchmarks/load_balance.py            # full: more batches and steps
    python benchmarks/load_balance.py --quick    # < 60 s
Writes benchmarks/results/load_balance.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Dict, List, Optional

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.common import heavy_tailed_lengths, print_table, write_json  # noqa: E402
from torchrec_ascend.distributed.load_balance import (  # noqa: E402
    AllToAllBalancer, CollatorBalancer, HSTUCostModel, default_cache_dir, imbalance, plan_assignment)
from torchrec_ascend.modules.hstu import HSTUEncoder  # noqa: E402
from torchrec_ascend.testing.multiprocess import run_multiprocess  # noqa: E402

WORLDS = (2, 8, 16, 64)
ENCODER = {"num_items_embedding_dim": 64, "num_layers": 2, "num_heads": 2, "attention_dim": 32,
           "linear_dim": 32, "max_seq_len": 256}
SAMPLE = "/work/shared/data/kuairand-27k-sample/processed_standard_kcore_15.tsv"
NUM_ITEMS = 10_000


def _median(xs: List[float]) -> float:
    return float(statistics.median(xs))


def real_lengths(path: str, max_len: int) -> Optional[torch.Tensor]:
    """Positive-sequence lengths of the shared KuaiRand sample (truncated to ``max_len``), or None."""
    if not os.path.exists(path):
        return None
    from torchrec_ascend.datasets import PositiveRule, load_kuairand

    seqs = load_kuairand([path], os.path.join(default_cache_dir(), "kuairand-sample"),
                         PositiveRule(any_of=("like",)), min_len=3)
    return torch.as_tensor(seqs.lengths, dtype=torch.int64).clamp(max=max_len)


def _random_equal_counts(n: int, world: int, g: torch.Generator) -> torch.Tensor:
    perm = torch.randperm(n, generator=g)
    bins = torch.empty(n, dtype=torch.int64)
    bins[perm] = torch.arange(world).repeat_interleave(n // world)
    return bins


def simulate(model: HSTUCostModel, draw, batch_per_rank: int, batches: int) -> Dict[str, object]:
    """Median cost imbalance (random vs ours) per world size; ``draw(n, g)`` gives lengths."""
    out: Dict[str, Dict[str, float]] = {"random": {}, "ours": {}}
    plan_ms: Dict[str, float] = {}
    for world in WORLDS:
        rnd, ours, ms = [], [], []
        for b in range(batches):
            g = torch.Generator().manual_seed(1000 * world + b)
            costs = model.cost(draw(world * batch_per_rank, g))
            rnd.append(imbalance(costs, _random_equal_counts(costs.numel(), world, g), world))
            t0 = time.perf_counter()
            bins = plan_assignment(costs, world, 2 * batch_per_rank)
            ms.append((time.perf_counter() - t0) * 1e3)
            ours.append(imbalance(costs, bins, world))
        out["random"][str(world)] = _median(rnd)
        out["ours"][str(world)] = _median(ours)
        plan_ms[str(world)] = _median(ms)
    return {**out, "plan_ms": plan_ms}


# ---------------------------------------------------------------------- 2 real ranks
def _global_batch(step: int, batch: int, max_len: int):
    g = torch.Generator().manual_seed(10_000 + step)
    lengths = heavy_tailed_lengths(batch, max_len, generator=g)
    T = int(lengths.sum())
    return (lengths, torch.randint(0, NUM_ITEMS, (T,), generator=g),
            torch.cumsum(torch.randint(1, 100_000, (T,), generator=g), 0),
            torch.randint(0, 2, (T, 8), generator=g, dtype=torch.uint8),
            torch.randint(0, 1000, (batch,), generator=g), g)


def _take(batch, idx: torch.Tensor):
    lengths, ids, ts, act, users, _ = batch
    off = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    tok = torch.cat([torch.arange(int(off[i]), int(off[i + 1])) for i in idx.tolist()]) if idx.numel() \
        else torch.zeros(0, dtype=torch.int64)
    return lengths[idx], ids[tok], ts[tok], act[tok], users[idx]


def _measure_worker(rank: int, world: int, a: float, b: float, batch_per_rank: int, steps: int,
                    reps: int, max_len: int) -> Dict[str, object]:
    import torch.distributed as dist

    torch.manual_seed(0)
    enc = HSTUEncoder(**ENCODER)
    emb = torch.nn.Embedding(NUM_ITEMS, ENCODER["num_items_embedding_dim"])
    params = list(enc.parameters()) + list(emb.parameters())
    model = HSTUCostModel(a, b)
    bal, collator = AllToAllBalancer(model, max_per_rank=2 * batch_per_rank), CollatorBalancer(model)

    def timed(fn):
        """(wall s, thread CPU s) of fn(), started together on both ranks."""
        dist.barrier()
        t0, c0 = time.perf_counter(), time.thread_time()
        out = fn()
        return time.perf_counter() - t0, time.thread_time() - c0, out

    def compute(lengths, ids, ts):
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])

        def run():
            enc(emb(ids), offsets, ts).sum().backward()
            for p in params:
                p.grad = None
        return [timed(run)[:2] for _ in range(reps)]

    modes = ("random", "ours", "same")
    rows = []
    for step in range(steps + 1):  # step 0 warms up
        batch = _global_batch(step, world * batch_per_rank, max_len)
        split = _random_equal_counts(batch[0].numel(), world, batch[5])
        for mode in modes[step % 3:] + modes[:step % 3]:  # rotate the order: no mode always first
            mine = torch.nonzero(split == (0 if mode == "same" else rank)).flatten()
            lengths, ids, ts, act, users = _take(batch, mine)
            row = {"step": step, "mode": mode}
            if mode == "ours":
                row["balance_s"], row["balance_cpu_s"], bb = timed(lambda: bal.balance(
                    lengths, {"ids": ids, "ts": ts, "act": act}, {"users": users}))
                lengths, ids, ts = bb.lengths, bb.token_fields["ids"], bb.token_fields["ts"]
            runs = compute(lengths, ids, ts)
            if mode == "ours":  # timed after a barrier: it must not wait for the slower rank's compute
                row["restore_s"], row["restore_cpu_s"], _ = timed(
                    lambda: bb.restore(torch.zeros(bb.lengths.numel(), 8)))
                row["select_s"] = timed(lambda: collator.select(batch[0], rank, world))[0]
            row.update({"wall_first_s": runs[0][0], "wall_min_s": min(r[0] for r in runs),
                        "cpu_min_s": min(r[1] for r in runs), "tokens": int(lengths.sum()),
                        "predicted": float(model.cost(lengths).sum())})
            if step:
                rows.append(row)
    return {"rank": rank, "rows": rows}


def _imbalance(xs: List[float]) -> float:
    return max(xs) / (sum(xs) / len(xs)) - 1


def _p90(xs: List[float]) -> float:
    return sorted(xs)[int(0.9 * (len(xs) - 1))]


def measured(model: HSTUCostModel, batch_per_rank: int, steps: int, reps: int,
             max_len: int) -> Dict[str, object]:
    per_rank = run_multiprocess(_measure_worker, 2, (model.a, model.b, batch_per_rank, steps, reps, max_len))
    by: Dict[tuple, list] = {}
    for res in per_rank:
        for r in res["rows"]:
            by.setdefault((r["step"], r["mode"]), []).append(r)
    modes = ("random", "ours", "same")
    clocks = ("cpu_min_s", "wall_min_s", "wall_first_s", "predicted")
    imb = {c: {m: [] for m in modes} for c in clocks}
    ratio = []  # CPU seconds per unit of predicted cost, per rank-step: the cost model's accuracy
    over = {k: [] for k in ("balance_cpu_s", "restore_cpu_s", "balance_s", "restore_s", "select_s",
                            "step_cpu_s", "step_s")}
    for (step, mode), rs in sorted(by.items()):
        for c in clocks:
            imb[c][mode].append(_imbalance([r[c] for r in rs]))
        ratio += [r["cpu_min_s"] / r["predicted"] for r in rs if mode != "same"]
        if mode == "ours":  # per step: the slower rank's balancer and compute
            for k in ("balance_cpu_s", "restore_cpu_s", "balance_s", "restore_s", "select_s"):
                over[k].append(max(r[k] for r in rs))
            over["step_cpu_s"].append(max(r["cpu_min_s"] for r in rs) + over["balance_cpu_s"][-1]
                                      + over["restore_cpu_s"][-1])
            over["step_s"].append(max(r["wall_min_s"] for r in rs) + over["balance_s"][-1]
                                  + over["restore_s"][-1])
    med = {k: _median(v) for k, v in over.items()}
    ratio_t = torch.tensor(ratio, dtype=torch.float64)
    cpu_share = (med["balance_cpu_s"] + med["restore_cpu_s"]) / med["step_cpu_s"]
    return {
        "measured_step_imbalance_2ranks": _median(imb["cpu_min_s"]["ours"]),
        "overhead_fraction": cpu_share,
        "details": {
            "definition": ("step time of a rank = thread CPU time of its forward + backward (one "
                           f"thread per rank), the fastest of {reps} repeats; imbalance per step = "
                           "max / mean - 1 over the 2 ranks, median over steps; 'same' = both ranks run "
                           "the identical batch (the measurement's noise floor); wall-clock variants "
                           "alongside (the machine is shared, so wall time includes other jobs' time)"),
            "steps_per_mode": len(imb["cpu_min_s"]["ours"]), "repeats": reps,
            "imbalance_median": {c: {m: _median(v) for m, v in imb[c].items()} for c in clocks},
            "imbalance_p90": {c: {m: _p90(v) for m, v in imb[c].items()} for c in clocks},
            "cost_model_cpu_s_per_cost": {"median": _median(ratio),
                                          "cv": float(ratio_t.std() / ratio_t.mean())},
            "medians_s": med,
            "overhead_fraction_cpu_time": cpu_share,
            "overhead_fraction_cpu_time_balance_only": med["balance_cpu_s"] / med["step_cpu_s"],
            "overhead_fraction_wall": (med["balance_s"] + med["restore_s"]) / med["step_s"],
            "collator_overhead_fraction_wall": med["select_s"] / med["step_s"],
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer batches and steps (< 60 s)")
    ap.add_argument("--batch-per-rank", type=int, default=64)
    ap.add_argument("--measure-batch-per-rank", type=int, default=0,
                    help="sequences per rank in the 2-rank run (default 64; 32 with --quick)")
    ap.add_argument("--max-len", type=int, default=ENCODER["max_seq_len"])
    ap.add_argument("--recalibrate", action="store_true", help="measure the cost model again (and cache it)")
    args = ap.parse_args()
    t_start = time.perf_counter()
    batches, steps, reps = (4, 4, 2) if args.quick else (25, 30, 3)
    measure_batch = args.measure_batch_per_rank or (32 if args.quick else 64)

    torch.set_num_threads(1)  # as each rank below runs
    torch.manual_seed(0)
    model = HSTUCostModel.calibrate(HSTUEncoder(**ENCODER), "cpu", args.max_len, refresh=args.recalibrate)
    t_cal = time.perf_counter()
    synth = simulate(model, lambda n, g: heavy_tailed_lengths(n, args.max_len, generator=g),
                     args.batch_per_rank, batches)
    real = real_lengths(SAMPLE, args.max_len)
    if real is not None:
        real_sim = simulate(model, lambda n, g: real[torch.randint(real.numel(), (n,), generator=g)],
                            args.batch_per_rank, batches)
        real_note = (f"{SAMPLE}: {real.numel()} users, mean length {float(real.double().mean()):.1f}, "
                     f"max {int(real.max())} (truncated to {args.max_len}); batches drawn with replacement")
    else:
        real_sim = {"random": {str(w): None for w in WORLDS}, "ours": {str(w): None for w in WORLDS}}
        real_note = f"skipped: {SAMPLE} is absent"
    t_sim = time.perf_counter()
    meas = measured(model, measure_batch, steps, reps, args.max_len)

    rows = []
    for w in WORLDS:
        k = str(w)
        rows.append({"ranks": w, "random": synth["random"][k], "ours": synth["ours"][k],
                     "real random": real_sim["random"][k] if real is not None else "-",
                     "real ours": real_sim["ours"][k] if real is not None else "-",
                     "plan ms": synth["plan_ms"][k]})
    print(f"cost model: a={model.a:.4g} b={model.b:.4g} ({model.source})")
    print("cost imbalance (max / mean - 1), median over batches:")
    print_table(rows)
    d = meas["details"]
    print("measured step imbalance on 2 gloo ranks (max / mean - 1, median over steps; "
          "'same' = identical batches = noise floor):")
    clocks = ("cpu_min_s", "wall_min_s", "wall_first_s", "predicted")
    print_table([{"mode": m, **{c: d["imbalance_median"][c][m] for c in clocks},
                  "cpu p90": d["imbalance_p90"]["cpu_min_s"][m]} for m in ("random", "ours", "same")])
    med = d["medians_s"]
    print(f"balancer overhead (CPU time): balance {med['balance_cpu_s'] * 1e3:.2f} ms + restore "
          f"{med['restore_cpu_s'] * 1e3:.2f} ms of a {med['step_cpu_s'] * 1e3:.1f} ms step = "
          f"{meas['overhead_fraction']:.4f}; wall {d['overhead_fraction_wall']:.4f} "
          f"({(med['balance_s'] + med['restore_s']) * 1e3:.1f} of {med['step_s'] * 1e3:.1f} ms); "
          f"collator select {med['select_s'] * 1e3:.2f} ms")
    path = write_json("load_balance", {
        "imbalance": {"random": synth["random"], "ours": synth["ours"]},
        "real_lengths": {"random": real_sim["random"], "ours": real_sim["ours"]},
        "measured_step_imbalance_2ranks": meas["measured_step_imbalance_2ranks"],
        "overhead_fraction": meas["overhead_fraction"],
        "goals": {"ours_16_ranks": 0.01, "measured_step_imbalance_2ranks": 0.05, "overhead_fraction": 0.02},
        "config": {"quick": args.quick, "batch_per_rank": args.batch_per_rank, "batches": batches,
                   "measure_batch_per_rank": measure_batch, "steps": steps, "repeats": reps,
                   "max_len": args.max_len, "encoder": ENCODER, "max_per_rank": "2 x batch_per_rank",
                   "threads_per_rank": 1},
        "cost_model": {"a": model.a, "b": model.b, "source": model.source,
                       "c0": (model.fit or {}).get("c0"), "rel_rms": (model.fit or {}).get("rel_rms")},
        "plan_ms": synth["plan_ms"], "real_lengths_note": real_note, "measured": d,
        "wall_s": {"calibration": t_cal - t_start, "simulation": t_sim - t_cal,
                   "measured": time.perf_counter() - t_sim},
    })
    print(f"wrote {path} in {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
