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
from typing import Any, Dict, List, Optional, Sequence

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


def _lookup(metrics: Dict[str, Any], key: str) -> Optional[float]:
    """``metrics[key]``, ``<a>.<b>`` reading a nested value; None where absent or null."""
    value: Any = metrics
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return float(value) if isinstance(value, (int, float)) else None


def plot(out: str, histories: Dict[str, Dict[str, List[Any]]],
         baselines: Dict[str, Dict[str, Any]], keys: Sequence[str] = ("ndcg@10",),
         loss: str = "training loss") -> str:
    """``<out>/training.png``: the training loss per step, and one panel per validation metric
    of ``keys`` (``<a>.<b>`` for a nested one, e.g. ``is_click.auc``) per evaluation for each
    model, baselines as dashed lines; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(len(keys) + 1, 4)
    rows = -(-(len(keys) + 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    panels = list(axes.ravel())
    a1 = panels[0]
    for kind, h in histories.items():
        if h.get("loss"):
            s, v = zip(*h["loss"])
            a1.plot(s, v, label=kind)
    a1.set(title=loss, xlabel="step")
    for key, ax in zip(keys, panels[1:]):
        for kind, h in histories.items():
            pts = [(e["step"], _lookup(e, key)) for e in h.get("eval", [])]
            pts = [(st, v) for st, v in pts if v is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=kind)
        for name, met in baselines.items():
            v = _lookup(met, key)
            if v is not None:
                ax.axhline(v, linestyle="--", color="gray")
                ax.annotate(name, (0, v), textcoords="offset points", xytext=(2, 2), fontsize=8)
        ax.set(title=f"validation {key}", xlabel="step")
    for ax in panels[len(keys) + 1:]:
        ax.axis("off")
    for ax in panels:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, "training.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
