#!/usr/bin/env python
"""Train an HSTU generative-retrieval model on KuaiRand with TorchRec (one process or torchrun).

    python examples/kuairand/train.py --config demo
    torchrun --nproc_per_node=2 examples/kuairand/train.py --config sample --models hstu,sasrec

Pipeline: KuaiRand CSVs (or the built-in generator) -> cached per-user positive sequences ->
leave-one-out split -> item ids in a TorchRec ``EmbeddingCollection`` sharded by a planner under
``DistributedModelParallel`` (gloo on CPU; a size-1 group for one process), fused row-wise Adagrad
for the table, AdamW for dense -> HSTU (or the SASRec baseline) + shared-pool negative sampling +
sampled softmax -> full-corpus HR/NDCG@{10,50,200} and MRR with history filtering, next to the
most-popular baseline on the same split.  Outputs under ``--out`` (default
``outputs/kuairand-<config>``): ``log.jsonl``, TensorBoard scalars (``tb/``), ``training.png``,
``results.json``, ``<model>/checkpoints/`` (atomic; ``--resume`` continues the same data order).
See docs/kuairand.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from torchrec_ascend.datasets import (  # noqa: E402
    KuaiRandDataError,
    PositiveRule,
    SyntheticConfig,
    generate,
    load_kuairand,
)
from torchrec_ascend.metrics import (  # noqa: E402
    RetrievalMetrics,
    device_peak_flops,
    filter_history,
    target_ranks,
)
from torchrec_ascend.sampling import make_sampler  # noqa: E402

import kuairand_ckpt as ckpt  # noqa: E402
from kuairand_data import (  # noqa: E402
    BatchOrder,
    Split,
    eval_batches,
    gather_batch,
    history_of,
    leave_one_out,
    make_kjt,
    training_inputs,
)
from kuairand_model import GRModel  # noqa: E402

CONFIG_DIR = os.path.join(HERE, "configs")
ENV_SAMPLE = "KUAIRAND_SAMPLE_DIR"   # default ../shared/data/kuairand-27k-sample (from the repo)
ENV_KUAIRAND = "KUAIRAND_DIR"        # folder with the official KuaiRand CSVs


# ---------------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------------
def load_config(name_or_path: str) -> Dict[str, Any]:
    """A config by name (``configs/<name>.json``) or path."""
    path = name_or_path if os.path.isfile(name_or_path) else os.path.join(CONFIG_DIR, f"{name_or_path}.json")
    if not os.path.isfile(path):
        names = sorted(f[:-5] for f in os.listdir(CONFIG_DIR) if f.endswith(".json"))
        raise ValueError(f"--config: {name_or_path!r} is neither a file nor one of {names}")
    with open(path) as f:
        cfg = json.load(f)
    cfg.setdefault("name", os.path.splitext(os.path.basename(path))[0])
    return cfg


def apply_overrides(cfg: Dict[str, Any], sets: List[str]) -> None:
    """``--set train.steps=10`` style overrides (values parsed as JSON when they parse)."""
    for s in sets:
        key, _, val = s.partition("=")
        if not _:
            raise ValueError(f"--set: expected key.path=value, got {s!r}")
        node = cfg
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        try:
            node[parts[-1]] = json.loads(val)
        except json.JSONDecodeError:
            node[parts[-1]] = val


def resolve_path(p: str) -> str:
    """Expand ``{sample_dir}`` / ``{kuairand_dir}``; relative paths are relative to the repo."""
    sample = os.environ.get(ENV_SAMPLE, os.path.join(REPO, "..", "shared", "data", "kuairand-27k-sample"))
    kr = os.environ.get(ENV_KUAIRAND, os.path.join(REPO, "data_cache", "KuaiRand"))
    p = p.format(sample_dir=sample, kuairand_dir=kr)
    return p if os.path.isabs(p) else os.path.normpath(os.path.join(REPO, p))


# ---------------------------------------------------------------------------------------------
# distributed set-up
# ---------------------------------------------------------------------------------------------
def init_distributed() -> tuple:
    """gloo group from torchrun's environment, or a size-1 group for a plain ``python`` run."""
    if not dist.is_initialized():
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group("gloo")
        else:
            fd, store = tempfile.mkstemp(prefix="kuairand-pg-")
            os.close(fd)
            os.remove(store)
            dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    return dist.get_rank(), dist.get_world_size()


def make_planner(world_size: int, cfg: Dict[str, Any]):
    """The sharding planner.  Hook: ``train.planner = "hierarchical"`` uses
    ``torchrec_ascend.distributed.planner.HierarchicalShardingPlanner`` when that package is
    present; the default is TorchRec's ``EmbeddingShardingPlanner`` with the table constrained to
    ``train.sharding`` (row_wise / table_wise: data-parallel sequence tables do not run on CPU
    with fbgemm-cpu 1.8)."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints

    t = cfg["train"]
    constraints = {"item_table": ParameterConstraints(sharding_types=[t.get("sharding", "row_wise")])}
    topology = Topology(world_size=world_size, compute_device="cpu")
    if t.get("planner", "torchrec") == "hierarchical":
        from torchrec_ascend.distributed.planner import HierarchicalShardingPlanner  # type: ignore

        return HierarchicalShardingPlanner(topology=topology, constraints=constraints)
    return EmbeddingShardingPlanner(topology=topology, constraints=constraints)


def build_model(num_items: int, kind: str, cfg: Dict[str, Any], world_size: int):
    """GRModel under DistributedModelParallel, fused sparse optimizer, AdamW for dense."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    t = cfg["train"]
    torch.manual_seed(int(t.get("seed", 0)))
    model = GRModel(num_items, kind, cfg["model"], float(t.get("temperature", 0.05)))
    apply_optimizer_in_backward(RowWiseAdagrad, model.ec.parameters(),
                                {"lr": float(t.get("sparse_lr", 0.05)), "eps": 1e-8})
    sharders = [EmbeddingCollectionSharder()]
    plan = make_planner(world_size, cfg).collective_plan(model, sharders, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    dense = [p for n, p in dmp.named_parameters() if not n.startswith("ec.") and p.requires_grad]
    opt = torch.optim.AdamW(dense, lr=float(t.get("lr", 1e-3)),
                            weight_decay=float(t.get("weight_decay", 0.0)), betas=(0.9, 0.98))
    return dmp, opt, plan


# ---------------------------------------------------------------------------------------------
# evaluation
# ---------------------------------------------------------------------------------------------
@torch.no_grad()
def all_item_embeddings(dmp, num_items: int, chunk: int = 1 << 16) -> torch.Tensor:
    """The whole item table, looked up through the sharded EmbeddingCollection (collective)."""
    ec = dmp.module.ec
    parts = []
    for s in range(0, num_items, chunk):
        ids = torch.arange(s, min(s + chunk, num_items))
        kjt = make_kjt(ids, 1, torch.zeros(0, dtype=torch.int64), torch.tensor([ids.numel()]))
        parts.append(ec(kjt)["item"].values())
    return torch.cat(parts)


def shard_users(n: int, rank: int, world: int, limit: Optional[int] = None) -> np.ndarray:
    users = np.arange(n)
    if limit is not None and limit < n:
        users = np.random.default_rng(12345).choice(n, limit, replace=False)
        users.sort()
    return users[rank::world]


@torch.no_grad()
def evaluate_model(dmp, split: Split, users: np.ndarray, cfg: Dict[str, Any]) -> Dict[str, float]:
    """Full-corpus ranking of each user's held-out item (history filtered); all ranks call."""
    model = dmp.module
    was = model.training
    model.eval()
    table = all_item_embeddings(dmp, split.num_items)
    cand = torch.nn.functional.normalize(table, dim=-1)
    m = RetrievalMetrics(cfg["eval"].get("ks", (10, 50, 200)))
    L = int(cfg["model"]["max_seq_len"])
    for b in eval_batches(split, users, int(cfg["eval"].get("batch_size", 256)), L):
        seq = model.encode(table[b.items], b.offsets, b.timestamps, b.action_bits)
        q = seq[b.offsets[1:] - 1]
        scores = q @ cand.t()
        hist, hoff = history_of(split, b.users)
        tgt = torch.from_numpy(split.targets[b.users])
        m.update(target_ranks(filter_history(scores, hist, hoff, tgt), tgt))
    m.all_reduce()
    model.train(was)
    return m.compute()


@torch.no_grad()
def evaluate_most_popular(split: Split, users: np.ndarray, cfg: Dict[str, Any]) -> Dict[str, float]:
    """Most-popular baseline: score = training-prefix count, same filtering and ranking."""
    counts = torch.from_numpy(split.item_counts()).to(torch.float32)
    m = RetrievalMetrics(cfg["eval"].get("ks", (10, 50, 200)))
    bs = int(cfg["eval"].get("batch_size", 256))
    for i in range(0, len(users), bs):
        u = users[i:i + bs]
        scores = counts.expand(len(u), -1)
        hist, hoff = history_of(split, u)
        tgt = torch.from_numpy(split.targets[u])
        m.update(target_ranks(filter_history(scores, hist, hoff, tgt), tgt))
    m.all_reduce()
    return m.compute()


# ---------------------------------------------------------------------------------------------
# output: log, TensorBoard, plot
# ---------------------------------------------------------------------------------------------
class Recorder:
    """rank 0 only: log.jsonl lines, TensorBoard scalars, history for the plot."""

    def __init__(self, out: str, kind: str, enabled: bool, history: Optional[Dict[str, list]] = None) -> None:
        self.enabled, self.kind = enabled, kind
        self.history = history or {"loss": [], "eval": []}
        self.tb = None
        self.log_path = os.path.join(out, kind, "log.jsonl")
        if enabled:
            os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(os.path.join(out, "tb", kind))

    def scalar(self, tag: str, value: float, step: int) -> None:
        if self.tb is not None:
            self.tb.add_scalar(f"{self.kind}/{tag}", value, step)

    def log(self, rec: Dict[str, Any]) -> None:
        if self.enabled:
            with open(self.log_path, "a") as f:
                f.write(json.dumps(rec) + "\n")

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def plot(out: str, histories: Dict[str, Dict[str, list]], baselines: Dict[str, Dict[str, float]],
         key: str = "ndcg@10") -> str:
    """``training.png``: training loss and ``key`` over steps per model, baselines as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for kind, h in histories.items():
        if h["loss"]:
            s, l = zip(*h["loss"])
            a1.plot(s, l, label=kind)
        if h["eval"]:
            s, v = zip(*[(e["step"], e[key]) for e in h["eval"]])
            a2.plot(s, v, marker="o", label=kind)
    for name, met in baselines.items():
        a2.axhline(met[key], linestyle="--", color="gray")
        a2.annotate(name, (0, met[key]), textcoords="offset points", xytext=(2, 2), fontsize=8)
    a1.set(title="training loss (sampled softmax)", xlabel="step")
    a2.set(title=f"{key} (eval users, full corpus)", xlabel="step")
    a1.legend()
    a2.legend()
    fig.tight_layout()
    path = os.path.join(out, "training.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------
def train_one(kind: str, split: Split, cfg: Dict[str, Any], out: str, resume: bool,
              rank: int, world: int, peak: float, baselines: Dict[str, Dict[str, float]],
              histories: Dict[str, Dict[str, list]], progress: bool) -> Dict[str, Any]:
    t, e = cfg["train"], cfg["eval"]
    seed = int(t.get("seed", 0))
    steps = int(t["steps"])
    bs = int(t["batch_size"])
    L = int(cfg["model"]["max_seq_len"])
    R = int(t.get("num_negatives", 256))
    dmp, opt, plan = build_model(split.num_items, kind, cfg, world)
    if rank == 0:
        n_dense = sum(p.numel() for n, p in dmp.named_parameters() if not n.startswith("ec."))
        print(f"[{kind}] parameters: {split.num_items * int(cfg['model']['embedding_dim']):,} "
              f"embedding + {n_dense:,} dense; plan: {plan.plan['ec']['item_table'].sharding_type} "
              f"on {world} rank(s)", flush=True)
    counts = torch.from_numpy(split.item_counts()).to(torch.float32)
    sampler = make_sampler(t.get("sampler", "uniform"), split.num_items,
                           counts=counts if t.get("sampler", "uniform") != "uniform" else None)
    order = BatchOrder(split, bs, world, rank, seed)
    mdir = os.path.join(out, kind)
    start, history = 0, {"loss": [], "eval": []}
    if resume:
        last = ckpt.latest(mdir)
        if last is not None:
            st = ckpt.load(last, dmp, opt)
            start, history = int(st["step"]), st.get("history", history)
            if rank == 0:
                print(f"[{kind}] resumed from {last} at step {start}", flush=True)
    histories[kind] = history
    rec = Recorder(out, kind, rank == 0, history)
    if rank == 0 and start == 0 and os.path.exists(rec.log_path):
        os.remove(rec.log_path)
    eval_users = shard_users(split.num_users, rank, world, e.get("eval_users"))
    log_every, eval_every = int(t.get("log_every", 50)), int(t.get("eval_every", 0))
    ck_every = int(t.get("checkpoint_every", 0))
    bar = None
    if progress and rank == 0:
        from tqdm import tqdm

        bar = tqdm(total=steps, initial=start, desc=f"train {kind}", mininterval=1.0,
                   dynamic_ncols=True, file=sys.stderr)
    model = dmp.module
    dense_params = [p for g in opt.param_groups for p in g["params"]]
    win_tokens, win_flops, win_time = 0.0, 0.0, 0.0
    for step in range(start, steps):
        tic = time.perf_counter()
        torch.manual_seed(seed * 7919 + step)  # dropout: a function of the step (exact resume)
        batch = order.users_at(step)
        b = gather_batch(split, batch, L)
        kjt, neg_log_q, pos_log_q = training_inputs(b, sampler, R, seed, step, rank)
        loss = dmp(kjt, b.offsets, b.timestamps, b.action_bits, b.query_idx, neg_log_q, pos_log_q)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # the fused optimizer updates the table here
        if t.get("clip_grad_norm"):
            torch.nn.utils.clip_grad_norm_(dense_params, float(t["clip_grad_norm"]))
        opt.step()
        win_time += time.perf_counter() - tic
        win_tokens += b.num_tokens
        win_flops += model.step_flops(b.offsets, int(b.query_idx.numel()), R)
        lv = float(loss.detach())
        history["loss"].append((step + 1, lv))
        rec.log({"step": step + 1, "loss": lv})
        rec.scalar("train/loss", lv, step + 1)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{lv:.3f}", refresh=False)
        if (step + 1) % log_every == 0 or step + 1 == steps:
            w = torch.tensor([win_tokens, win_flops, win_time], dtype=torch.float64)
            dist.all_reduce(w)
            tok_s = w[0].item() / (w[2].item() / world)
            mfu = w[1].item() / (w[2].item() / world) / (peak * world)
            msg = (f"[{kind}] step {step + 1}/{steps} loss {lv:.4f} tokens/s {tok_s:,.0f} "
                   f"MFU {100 * mfu:.2f}%")
            rec.scalar("perf/tokens_per_s", tok_s, step + 1)
            rec.scalar("perf/mfu", mfu, step + 1)
            rec.log({"step": step + 1, "tokens_per_s": tok_s, "mfu": mfu})
            history.setdefault("perf", []).append({"step": step + 1, "tokens_per_s": tok_s, "mfu": mfu})
            if rank == 0:
                (bar.write if bar is not None else print)(msg)
            win_tokens, win_flops, win_time = 0.0, 0.0, 0.0
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            met = evaluate_model(dmp, split, eval_users, cfg)
            history["eval"].append({"step": step + 1, **met})
            for k, v in met.items():
                rec.scalar(f"eval/{k}", v, step + 1)
            if rank == 0:
                (bar.write if bar is not None else print)(
                    f"[{kind}] step {step + 1} eval " + " ".join(f"{k} {v:.4f}" for k, v in met.items()))
                plot(out, histories, baselines)
        if ck_every and (step + 1) % ck_every == 0:
            ckpt.save(mdir, step + 1, dmp, opt, {"history": history, "kind": kind},
                      keep=int(t.get("keep_checkpoints", 2)))
    if bar is not None:
        bar.close()
    final = evaluate_model(dmp, split, shard_users(split.num_users, rank, world), cfg)
    history["eval"].append({"step": steps, **final})
    for k, v in final.items():
        rec.scalar(f"final/{k}", v, steps)
    rec.close()
    perf = history.get("perf", [])
    return {"metrics": final, "tokens_per_s": perf[-1]["tokens_per_s"] if perf else None,
            "mfu": perf[-1]["mfu"] if perf else None, "evals": history["eval"]}


def prepare_data(cfg: Dict[str, Any], rank: int) -> Split:
    """Files (generated for the synthetic config) -> cached sequences -> leave-one-out split."""
    d = cfg["data"]
    cache_root = resolve_path(d.get("cache_dir", "data_cache/kuairand"))
    if d.get("source") == "synthetic":
        syn = SyntheticConfig(**d.get("synthetic", {}))
        folder = os.path.join(cache_root, "synthetic-" + _stable_key(d.get("synthetic", {})))
        files = [os.path.join(folder, f"log_standard_{syn.tag}.csv")]
        if rank == 0 and not os.path.isfile(files[0]):
            generate(folder, syn)
    else:
        files = [resolve_path(p) for p in d["files"]]
    rule = PositiveRule.from_config(d.get("positive", {"any_of": ["click"]}))
    min_len, buckets = int(d.get("min_len", 3)), int(d.get("num_buckets", 32))
    # rank 0 builds the cache; a data error there is raised on every rank (no rank hangs)
    failure: List[Any] = [None]
    if rank == 0:
        try:
            seqs = load_kuairand(files, cache_root, rule, min_len, num_buckets=buckets)
        except KuaiRandDataError as e:
            failure[0] = (e.path, e.row, e.column, e.problem)
    dist.broadcast_object_list(failure, src=0)
    if failure[0] is not None:
        raise KuaiRandDataError(*failure[0])
    if rank != 0:
        seqs = load_kuairand(files, cache_root, rule, min_len, num_buckets=buckets)
    return leave_one_out(seqs)


def _stable_key(obj: Any) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="demo", help="config name in configs/ or a JSON path")
    ap.add_argument("--models", default=None, help="comma list of encoders: hstu,sasrec")
    ap.add_argument("--out", default=None, help="output folder (default outputs/kuairand-<config>)")
    ap.add_argument("--steps", type=int, default=None, help="override train.steps")
    ap.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    ap.add_argument("--set", action="append", default=[], help="override: key.path=json_value")
    ap.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    ap.add_argument("--threads", type=int, default=None,
                    help="intra-op CPU threads per process (default: train.threads, 0 = torch's)")
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    apply_overrides(cfg, args.set)
    if args.steps is not None:
        cfg["train"]["steps"] = args.steps
    cfg.setdefault("eval", {})
    threads = args.threads if args.threads is not None else int(cfg["train"].get("threads", 0))
    if threads > 0:
        torch.set_num_threads(threads)
    models = (args.models.split(",") if args.models else cfg.get("models", ["hstu"]))
    out = resolve_path(args.out or os.path.join("outputs", f"kuairand-{cfg['name']}"))
    rank, world = init_distributed()
    if rank == 0:
        os.makedirs(out, exist_ok=True)
    t0 = time.perf_counter()
    split = prepare_data(cfg, rank)
    if rank == 0:
        lens = np.diff(split.offsets)
        print(f"data: {split.num_users:,} users, {split.num_items:,} items, "
              f"{len(split.items):,} training events (prefix length mean {lens.mean():.1f}, "
              f"max {lens.max()}), {time.perf_counter() - t0:.1f}s", flush=True)
    peak_local = device_peak_flops("cpu", gemm_size=int(cfg["train"].get("peak_gemm_size", 2048)))
    pk = torch.tensor([peak_local], dtype=torch.float64)
    dist.all_reduce(pk)
    peak = pk.item() / world
    if rank == 0:
        print(f"device peak (measured fp32 GEMM): {peak / 1e9:.1f} GFLOP/s per rank", flush=True)
    all_users = shard_users(split.num_users, rank, world)
    baselines = {"most_popular": evaluate_most_popular(split, all_users, cfg)}
    histories: Dict[str, Dict[str, list]] = {}
    results: Dict[str, Any] = {}
    for kind in models:
        results[kind] = train_one(kind, split, cfg, out, args.resume, rank, world, peak,
                                  baselines, histories, progress=not args.no_progress)
    summary = {"config": cfg["name"], "world_size": world, "peak_gflops": peak / 1e9,
               "models": results, "baselines": baselines,
               "seconds": time.perf_counter() - t0}
    if rank == 0:
        summary["plot"] = plot(out, histories, baselines)
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump(summary, f, indent=1)
        print_summary(summary)
    dist.barrier()
    return summary


def print_summary(s: Dict[str, Any]) -> None:
    keys = list(next(iter(s["baselines"].values())).keys())
    rows = [(k, r["metrics"]) for k, r in s["models"].items()] + list(s["baselines"].items())
    print(f"\n== final metrics ({s['config']}, leave-one-out, full corpus, history filtered) ==")
    print(f"{'model':<14}" + "".join(f"{k:>10}" for k in keys))
    for name, met in rows:
        print(f"{name:<14}" + "".join(f"{met[k]:>10.4f}" for k in keys))
    for k, r in s["models"].items():
        if r.get("tokens_per_s"):
            print(f"{k}: {r['tokens_per_s']:,.0f} tokens/s, MFU {100 * r['mfu']:.2f}% "
                  f"(peak {s['peak_gflops']:.1f} GFLOP/s per rank)")
    print(f"plot: {s['plot']}")
    print(f"total time: {s['seconds']:.1f}s")


def cli() -> int:
    """``main`` with bad input reported as one line naming what is wrong (exit status 2)."""
    try:
        main()
        return 0
    except KuaiRandDataError as e:  # names the file, the row and the column
        print(f"error: bad KuaiRand data: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(cli())
