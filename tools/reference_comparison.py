#!/usr/bin/env python
"""Our trainer next to Meta's reference HSTU on this CPU, over several seeds: quality at equal
epochs (mean and standard error over seeds) and throughput (alternating runs).

Three steps, each a subcommand:

    # 1. throughput: the commands run one after another, the order reversed every other round
    #    (the machine's speed drifts; alternating keeps the ratio honest); {out} is each run's
    #    output folder, made under --dir
    python tools/reference_comparison.py time --dir runs/timing --rounds 3 \\
        --cmd reference "/tmp/refvenv/bin/python tools/reference_hstu_cpu.py ... --out {out}" \\
        --cmd "ours, defaults" "python examples/kuairand/train.py ... --out {out}"
    # 2. the comparison file: finished runs (one folder per seed) + the timing file
    python tools/reference_comparison.py build --out docs/results/X.json --data "..." \\
        --machine "..." --compare-to reference --timing runs/timing/timing.json \\
        --group reference "COMMAND" runs/ref-s42 runs/ref-s43 \\
        --group "ours, defaults" "COMMAND" runs/ours-s0 runs/ours-s1
    # 3. the markdown tables of the docs, from the committed file
    python tools/reference_comparison.py table docs/results/X.json

A run folder holds a ``results.json`` of our trainer (``models.hstu.valid`` / ``test``) or of
``tools/reference_hstu_cpu.py`` (``models.hstu.test`` only: the reference has no validation
split); ``DIR@N`` reads a reference run at its epoch-``N`` evaluation (:func:`load_run`).
Tokens/s of a whole run (:func:`run_tokens_per_s`): the reference's
``tokens_per_s_mean`` (training tokens / training seconds over every epoch), ours' logging
windows (``hstu/log.jsonl``) weighted by their seconds (the sum of their steps' ``step_ms``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

METRICS = ("hr@10", "hr@50", "hr@200", "ndcg@10", "ndcg@50", "ndcg@200", "mrr")


def _load(path: str) -> Dict[str, Any]:
    with open(path) as f:
        return json.load(f)


def split_at(spec: str) -> Tuple[str, Optional[int]]:
    """``DIR`` -> ``(DIR, None)``; ``DIR@N`` -> ``(DIR, N)``: a reference run read as if it had
    run ``N`` epochs (its epoch-``N`` evaluation; the run is seeded and ``num_epochs`` only bounds
    its loop, so its first ``N`` epochs are an ``N``-epoch run)."""
    if "@" in spec:
        d, n = spec.rsplit("@", 1)
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"{spec!r}: expected DIR@N with N >= 1")
        return d, int(n)
    return spec, None


def load_run(spec: str) -> Dict[str, Any]:
    """A run folder's results.json; for ``DIR@N`` (a ``tools/reference_hstu_cpu.py`` run) its
    test metrics, tokens/s and epochs as of epoch ``N``."""
    d, n = split_at(spec)
    res = _load(os.path.join(d, "results.json"))
    if n is None:
        return res
    h = res["models"]["hstu"]
    evals = h.get("evals") or []
    if "tokens_per_s_mean" not in h or len(evals) < n:
        raise ValueError(f"{spec!r}: needs a reference run with >= {n} epoch evaluations "
                         f"(has {len(evals)})")
    first = evals[:n]
    h["test"] = {m: first[-1][m] for m in METRICS}
    h["tokens_per_s"] = first[-1]["tokens_per_s"]
    h["tokens_per_s_mean"] = (sum(e["tokens_per_s"] * e["train_s"] for e in first)
                              / sum(e["train_s"] for e in first))
    h["evals"] = first
    res["config_values"] = {"train": {"epochs": float(n)}}
    res["epochs_done"] = n
    return res


def run_tokens_per_s(run_dir: str) -> float:
    """Whole-run training tokens/s of one run folder (ours or the reference's; ``DIR@N``: the
    reference's first ``N`` epochs)."""
    res = load_run(run_dir)["models"]["hstu"]
    if "tokens_per_s_mean" in res:  # tools/reference_hstu_cpu.py
        return float(res["tokens_per_s_mean"])
    log = os.path.join(run_dir, "hstu", "log.jsonl")
    with open(log) as f:
        rows = [json.loads(line) for line in f]
    step_ms = {r["step"]: r["step_ms"] for r in rows if "step_ms" in r}
    tokens = seconds = 0.0
    prev = 0
    for r in rows:
        if "tokens_per_s" in r:
            s = sum(step_ms.get(k, 0.0) for k in range(prev + 1, r["step"] + 1)) / 1e3
            tokens += r["tokens_per_s"] * s
            seconds += s
            prev = r["step"]
    if seconds <= 0:
        raise ValueError(f"{log}: no logging window with step times")
    return tokens / seconds


# --------------------------------------------------------------------------- quality

def mean_se(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and its standard error (sample standard deviation / sqrt(n); 0 for one value)."""
    m = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return m, se


def relative_difference(a: Sequence[float], b: Sequence[float]) -> Tuple[float, float]:
    """``mean(a) / mean(b) - 1`` and its standard error by the delta method (independent
    samples: ``(m_a / m_b) * sqrt((se_a / m_a)^2 + (se_b / m_b)^2)``)."""
    ma, sa = mean_se(a)
    mb, sb = mean_se(b)
    if mb == 0:
        raise ValueError("relative_difference: the baseline's mean is 0")
    q = ma / mb
    rel_se = abs(q) * math.sqrt((sa / ma) ** 2 + (sb / mb) ** 2) if ma != 0 else sb / mb
    return q - 1.0, rel_se


def group_summary(command: str, dirs: Sequence[str]) -> Dict[str, Any]:
    """Per-seed metrics and tokens/s of one group of runs, and their means / standard errors."""
    runs = []
    for d in dirs:
        res = load_run(d)
        h = res["models"]["hstu"]
        seed = res["seed"] if "seed" in res else res["config_values"]["train"]["seed"]  # ref / ours
        epochs = res["config_values"]["train"].get("epochs")
        runs.append({"dir": os.path.basename(os.path.normpath(split_at(d)[0]))
                     + (f"@{split_at(d)[1]}" if split_at(d)[1] else ""), "seed": seed, "epochs": epochs,
                     "test": {m: h["test"][m] for m in METRICS},
                     "valid": {m: h["valid"][m] for m in METRICS} if h.get("valid") else None,
                     "tokens_per_s": round(run_tokens_per_s(d), 1)})
    epochs = {r["epochs"] for r in runs}
    if len(epochs) != 1:
        raise ValueError(f"{command!r}: runs of different epochs {sorted(epochs)}")
    out: Dict[str, Any] = {"command": command, "epochs": epochs.pop(), "runs": runs}
    for split in ("test", "valid"):
        if all(r[split] is not None for r in runs):
            stats = {m: mean_se([r[split][m] for r in runs]) for m in METRICS}
            out[f"{split}_mean"] = {m: mean for m, (mean, _) in stats.items()}
            out[f"{split}_se"] = {m: se for m, (_, se) in stats.items()}
    return out


def build(groups: Dict[str, Dict[str, Any]], compare_to: str, data: str, machine: str,
          timing: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The comparison document: groups, each group's test metrics relative to ``compare_to``."""
    if compare_to not in groups:
        raise ValueError(f"--compare-to: no group {compare_to!r} (groups: {list(groups)})")
    base = groups[compare_to]
    diffs = {}
    for label, g in groups.items():
        if label == compare_to:
            continue
        if g["epochs"] != base["epochs"]:
            raise ValueError(f"group {label!r}: {g['epochs']} epochs, {compare_to!r} "
                             f"{base['epochs']}: compare at equal epochs")
        diffs[label] = {}
        for m in METRICS:
            rel, se = relative_difference([r["test"][m] for r in g["runs"]],
                                          [r["test"][m] for r in base["runs"]])
            diffs[label][m] = {"rel": rel, "rel_se": se}
    return {"data": data, "machine": machine, "compare_to": compare_to, "groups": groups,
            "relative_to_compare_to": diffs, "timing": timing}


# --------------------------------------------------------------------------- throughput

def time_commands(cmds: Sequence[Tuple[str, str]], rounds: int, out_dir: str,
                  runner=subprocess.run) -> Dict[str, Any]:
    """Run every command once per round (order reversed in odd rounds), each with ``{out}``
    replaced by a fresh folder; returns each run's whole-run tokens/s and, for every command
    after the first, the median over rounds of its tokens/s over the first command's in the
    same round."""
    if rounds < 1:
        raise ValueError(f"--rounds: must be >= 1, got {rounds}")
    labels = [label for label, _ in cmds]
    if len(set(labels)) != len(labels):
        raise ValueError(f"--cmd: labels must be distinct, got {labels}")
    per_round: List[Dict[str, float]] = []
    log: List[Dict[str, Any]] = []
    for r in range(rounds):
        order = list(cmds) if r % 2 == 0 else list(cmds)[::-1]
        got: Dict[str, float] = {}
        for label, cmd in order:
            out = os.path.join(out_dir, f"r{r}-{_slug(label)}")
            line = cmd.replace("{out}", shlex.quote(out))
            start = time.strftime("%H:%M:%S", time.gmtime())
            t0 = time.perf_counter()
            with open(out + ".log", "w") as f:
                proc = runner(line, shell=True, stdout=f, stderr=subprocess.STDOUT)
            if proc.returncode != 0:
                raise RuntimeError(f"round {r}, {label!r}: exit status {proc.returncode} "
                                   f"(log: {out}.log)")
            got[label] = run_tokens_per_s(out)
            log.append({"round": r, "label": label, "start_utc": start,
                        "wall_s": round(time.perf_counter() - t0, 1),
                        "tokens_per_s": round(got[label], 1), "command": line})
            print(f"[time] round {r} {label}: {got[label]:,.0f} tokens/s", flush=True)
        per_round.append(got)
    first = labels[0]
    ratios = {label: statistics.median(g[label] / g[first] for g in per_round)
              for label in labels[1:]}
    return {"definition": "each command run once per round, one at a time, order reversed in "
                          "odd rounds; tokens/s = whole-run training tokens / training seconds "
                          "(tools/reference_comparison.py run_tokens_per_s); ratio = median over "
                          f"rounds of tokens/s / {first!r}'s tokens/s in the same round",
            "rounds": rounds, "runs": log,
            "tokens_per_s_median": {label: statistics.median(g[label] for g in per_round)
                                    for label in labels},
            "ratio_to_first": ratios, "first": first}


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in label).strip("-")


# --------------------------------------------------------------------------- tables

def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def tables(doc: Dict[str, Any]) -> List[str]:
    """Markdown: mean ± standard error per group and split (a single run: its value); each
    group relative to ``compare_to`` (± its standard error, in points); the throughput rounds."""
    head = ["run", "split", "seeds", "epochs"] + [m.upper() for m in METRICS]
    out = [_row(head), _row(["---"] * len(head))]
    for label, g in doc["groups"].items():
        for split in ("valid", "test"):
            if f"{split}_mean" not in g:
                continue
            mean, se = g[f"{split}_mean"], g[f"{split}_se"]
            n = len(g["runs"])  # one run has no standard error: its value alone
            out.append(_row([label, split, str(n), f"{g['epochs']:g}"]
                            + [f"{mean[m]:.4f}" + (f" ± {se[m]:.4f}" if n > 1 else "")
                               for m in METRICS]))
    out += ["", _row(["run", "vs"] + [m.upper() for m in METRICS]),
            _row(["---"] * (2 + len(METRICS)))]
    seeds = {label: len(g["runs"]) for label, g in doc["groups"].items()}
    for label, d in doc["relative_to_compare_to"].items():
        spread = max(seeds[label], seeds[doc["compare_to"]]) > 1
        out.append(_row([label, doc["compare_to"]]
                        + [f"{100 * d[m]['rel']:+.1f}%"
                           + (f" ± {100 * d[m]['rel_se']:.1f}" if spread else "")
                           for m in METRICS]))
    t = doc.get("timing")
    if t:
        labels = list(t["tokens_per_s_median"])
        out += ["", _row(["round"] + labels), _row(["---"] * (1 + len(labels)))]
        for r in range(t["rounds"]):
            got = {x["label"]: x["tokens_per_s"] for x in t["runs"] if x["round"] == r}
            out.append(_row([str(r)] + [f"{got[x]:,.0f}" for x in labels]))
        out.append(_row(["median"] + [f"{t['tokens_per_s_median'][x]:,.0f}" for x in labels]))
        out.append(_row([f"ratio to {t['first']} (median of rounds)", "1.00x"]
                        + [f"{t['ratio_to_first'][x]:.2f}x" for x in labels[1:]]))
    return out


# --------------------------------------------------------------------------- CLI

def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("time", help="alternating throughput runs")
    t.add_argument("--dir", required=True, help="folder for the runs and timing.json")
    t.add_argument("--rounds", type=int, default=3)
    t.add_argument("--cmd", nargs=2, action="append", required=True, metavar=("LABEL", "COMMAND"),
                   help="a labelled shell command with {out}; the first is the ratios' baseline")
    b = sub.add_parser("build", help="the comparison file from finished runs")
    b.add_argument("--out", required=True)
    b.add_argument("--data", required=True, help="what data, which split protocol")
    b.add_argument("--machine", required=True, help="the CPU, load, threads")
    b.add_argument("--compare-to", required=True, help="the baseline group's label")
    b.add_argument("--timing", default=None, help="timing.json of the time step")
    b.add_argument("--group", nargs="+", action="append", required=True,
                   metavar="LABEL COMMAND DIR", help="label, command, one run folder per seed")
    s = sub.add_parser("table", help="markdown tables of a comparison file")
    s.add_argument("file")
    args = ap.parse_args(argv)

    if args.what == "time":
        if "{out}" not in " ".join(c for _, c in args.cmd):
            ap.error("--cmd: every command needs {out}")
        os.makedirs(args.dir, exist_ok=True)
        res = time_commands(args.cmd, args.rounds, args.dir)
        res["machine"] = {"processor": platform.processor() or platform.machine(),
                          "cpus": os.cpu_count()}
        path = os.path.join(args.dir, "timing.json")
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {path}: " + ", ".join(f"{k} {v:.2f}x" for k, v in
                                          res["ratio_to_first"].items()))
    elif args.what == "build":
        groups = {}
        for g in args.group:
            if len(g) < 3:
                ap.error(f"--group {g[0]!r}: needs LABEL COMMAND DIR [DIR ...]")
            groups[g[0]] = group_summary(g[1], g[2:])
        timing = _load(args.timing) if args.timing else None
        doc = build(groups, args.compare_to, args.data, args.machine, timing)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        print(f"wrote {args.out}")
    else:
        print("\n".join(tables(_load(args.file))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
