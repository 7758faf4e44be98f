#!/usr/bin/env python
"""docs/results/movielens-1m-reference-cpu.json from the side-by-side runs of
docs/movielens_reference_cpu.md (one-off assembly, kept so the file's derived numbers have a
command behind them).

    python tools/reference_cpu_results.py RUNS_DIR "machine description" 3,5 OUT.json

RUNS_DIR holds ``ref-e10/results.json`` (tools/reference_hstu_cpu.py), ``ref-e10.times`` (UTC
time at which each reference epoch line was logged: ``HH:MM:SS epochs_logged=N``),
``ours-{defaults,reference}-e{N}/`` (our trainer's ``--out``) and ``ours_loop.times`` (``HH:MM:SS
start|end NAME``, the wall window of each of our runs, ``timing-*`` runs included).
"""
import json, sys, datetime as dt
from reference_comparison import run_tokens_per_s  # tools/ is sys.path[0] when run as a script
R = sys.argv[1]
EP = [int(x) for x in sys.argv[3].split(",")]  # epochs compared, e.g. 3,5
REF = "reference HSTU (generative-recommenders, run here)"

def load(p):
    with open(p) as f:
        return json.load(f)

def hms(s):
    return dt.datetime.strptime(s, "%H:%M:%S")

# the reference run: per-epoch records + when each epoch's line was logged (UTC)
ref = load(f"{R}/ref-e10/results.json")
ends = {}
for line in open(f"{R}/ref-e10.times"):
    t, n = line.split()[0], int(line.split("epochs_logged=")[1].split()[0])
    ends.setdefault(n, t)
ref_epochs = []
for e in ref["models"]["hstu"]["evals"]:
    ref_epochs.append({"epoch": e["epoch"], "logged_utc": ends.get(e["epoch"]),
                       "train_s": round(e["train_s"], 1), "tokens_per_s": round(e["tokens_per_s"], 1),
                       "hr@10": e["hr@10"], "ndcg@10": e["ndcg@10"], "hr@200": e["hr@200"], "mrr": e["mrr"]})

def ref_at(epoch):
    """The reference's results as if run for `epoch` epochs (its epoch-`epoch` evaluation; the
    first `epoch` epochs of a longer run are the same computation: seeded, num_epochs only
    bounds the loop)."""
    r = json.loads(json.dumps(ref))
    h = r["models"]["hstu"]
    evs = h["evals"][:epoch]
    last = evs[-1]
    h["test"] = {k: last[k] for k in h["test"]}
    h["tokens_per_s"] = last["tokens_per_s"]
    h["tokens_per_s_mean"] = sum(e["tokens_per_s"] * e["train_s"] for e in evs) / sum(e["train_s"] for e in evs)
    h["train_s"] = sum(e["train_s"] for e in evs)
    h["steps"] = 24 * epoch
    h["evals"] = evs
    r["config_values"] = {"train": {"epochs": float(epoch)}}
    r["epochs_done"] = epoch
    r["partial"] = False
    r["note"] = (f"the first {epoch} epochs of the run below (`--epochs 10`, stopped after "
                 f"{ref['epochs_done']} epochs); its epoch-{epoch} evaluation")
    return r

# ours: runs and their windows
times = {}
for line in open(f"{R}/ours_loop.times"):
    t, what, name = line.split()[:3]
    times.setdefault(name, {})[what] = t
# name in RUNS_DIR -> (config, extra arguments, label).  "reference" ran before --config reference
# switched to per-position negatives: its command names the shared pool it used.
OURS = {"defaults": ("examples/movielens/configs/ml-1m.json", "", "ours, defaults (ml-1m.json)"),
        "reference": ("reference", " --threads 1 --set train.negatives=shared",
                      "ours, reference settings, a shared pool of 128 negatives"),
        "refpp": ("reference", " --threads 1",
                  "ours, reference settings, 128 per-position negatives (--config reference)")}
runs = {}
for ep in EP:
    runs[f"{REF}, {ep} epochs"] = {
        "command": "python tools/reference_hstu_cpu.py --reference generative-recommenders "
                   "--ratings ratings.dat --epochs 10 --out runs/reference-e10",
        "results": ref_at(ep)}
    for kind, (cfg, extra, label) in OURS.items():
        name = f"ours-{kind}-e{ep}"
        runs[f"{label}, {ep} epochs"] = {
            "command": f"python -m torchrec_ascend.training --data ratings.csv --config {cfg} "
                       f"--epochs {ep}{extra} --no-progress --out runs/{name}",
            "results": load(f"{R}/{name}/results.json")}

timing = []
for name in sorted(times, key=lambda n: times[n]["start"]):
    if "end" not in times[name] or not name.split("-")[0] in ("ours", "timing"):
        continue
    res = load(f"{R}/{name}/results.json")["models"]["hstu"]
    a, b = hms(times[name]["start"]), hms(times[name]["end"])
    # the reference's tokens/s over the same wall window: its epochs weighted by overlap
    tok = sec = 0.0
    prev_end = None
    for e in ref_epochs:
        if e["logged_utc"] is None:
            continue
        end = hms(e["logged_utc"])
        start = prev_end if prev_end is not None else end - dt.timedelta(seconds=e["train_s"])
        prev_end = end
        ov = (min(b, end) - max(a, start)).total_seconds()
        if ov > 0:
            w = ov / max((end - start).total_seconds(), 1e-9)
            tok += w * e["tokens_per_s"] * e["train_s"]; sec += w * e["train_s"]
    timing.append({"run": name, "start_utc": times[name]["start"], "end_utc": times[name]["end"],
                   "tokens_per_s": round(res["tokens_per_s"], 1),
                   "tokens_per_s_mean": round(run_tokens_per_s(f"{R}/{name}"), 1),
                   "reference_tokens_per_s_same_window": round(tok / sec, 1) if sec else None})
doc = {
 "data": {
  "name": "ML-1M (users 1-2,999)",
  "file": "the first 487,650 lines of ML-1M's ratings.dat (public repository dev-sumanta/dsmlai, ratings.dat.gz; decompressed md5 aa653a502e6beda9559796cebccf36dd); ours reads it converted by: python examples/movielens/prepare.py ratings.dat ratings.csv; the reference reads ratings.dat through tools/reference_hstu_cpu.py",
  "protocol": "test = each user's last rating ranked against the 3,615 rated movies, history filtered, for both. Ours: leave-two-out (training never sees the last two), pessimistic ties, exact ranks. Reference: leave-one-out (trains on all but the last item; no validation split), ranks above 2,500 capped at 2,501 (its eval.py)."
 },
 "machine": sys.argv[2],
 "compare_to": [f"{REF}, {ep} epochs" for ep in EP],
 "runs": runs,
 "reference_epochs": ref_epochs,
 "timing": {"definition": "tokens/s = training tokens / training seconds, tokens = every id of a step's training windows (ours: SequenceBatch.num_tokens; reference: history_lengths + 1 per row). tokens_per_s: ours' last logging window (50 steps), the reference's last epoch. tokens_per_s_mean: ours' logging windows weighted by their seconds. reference_tokens_per_s_same_window: the reference's per-epoch tokens/s weighted by how much of each epoch overlapped the run's wall-clock window (the runs ran side by side, 1 thread each).",
            "runs": timing},
}
with open(sys.argv[4], "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
print("ok", ref["epochs_done"], len(timing))
