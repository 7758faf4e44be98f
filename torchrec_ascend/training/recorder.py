"""What a run leaves behind (rank 0 only): ``<out>/<model>/log.jsonl`` (one JSON object per
line: ``{"step", "loss"}`` every step, ``{"step", "tokens_per_s", "mfu"}`` every ``log_every``,
``{"step", "split": "valid", metrics...}`` per evaluation), TensorBoard scalars under
``<out>/tb/<model>/`` and ``<out>/training.png`` (:func:`plot`).

A run resumed from step ``s`` keeps the log's rows up to ``s`` and drops the later ones (the
steps between the checkpoint and the kill, trained again now), and TensorBoard purges its
events after ``s``: every step is in the log once."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List

__all__ = ["Recorder", "plot"]


class Recorder:
    """log.jsonl + TensorBoard for one model; a no-op on ranks other than 0."""

    def __init__(self, out: str, kind: str, enabled: bool, start_step: int = 0) -> None:
        self.enabled, self.kind = enabled, kind
        self.tb = None
        self.log_path = os.path.join(out, kind, "log.jsonl")
        if enabled:
            os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
            self._keep_until(start_step)
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(os.path.join(out, "tb", kind),
                                    purge_step=start_step + 1 if start_step else None)

    def _keep_until(self, step: int) -> None:
        """Drop the log's rows of steps after ``step`` and its final results (all of it at 0)."""
        if not os.path.exists(self.log_path):
            return
        if step == 0:
            os.remove(self.log_path)
            return
        with open(self.log_path) as f:
            rows = [line for line in f if line.strip()]
        kept = []
        for line in rows:
            try:
                rec = json.loads(line)
            except ValueError:  # a line cut by the kill
                continue
            if int(rec.get("step", 0)) <= step and rec.get("split") != "final":
                kept.append(line if line.endswith("\n") else line + "\n")
        tmp = self.log_path + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(kept)
        os.replace(tmp, self.log_path)

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
            self.tb = None


def plot(out: str, histories: Dict[str, Dict[str, List[Any]]],
         baselines: Dict[str, Dict[str, float]], key: str = "ndcg@10") -> str:
    """``<out>/training.png``: training loss per step and validation ``key`` per evaluation for
    each model, baselines as dashed lines; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for kind, h in histories.items():
        if h.get("loss"):
            s, v = zip(*h["loss"])
            a1.plot(s, v, label=kind)
        evals = [e for e in h.get("eval", []) if key in e]
        if evals:
            a2.plot([e["step"] for e in evals], [e[key] for e in evals], marker="o", label=kind)
    for name, met in baselines.items():
        if key in met:
            a2.axhline(met[key], linestyle="--", color="gray")
            a2.annotate(name, (0, met[key]), textcoords="offset points", xytext=(2, 2), fontsize=8)
    a1.set(title="training loss (sampled softmax)", xlabel="step")
    a2.set(title=f"validation {key} (full corpus)", xlabel="step")
    for a in (a1, a2):
        if a.get_legend_handles_labels()[0]:
            a.legend()
    fig.tight_layout()
    path = os.path.join(out, "training.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


