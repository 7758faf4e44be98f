"""``pipeline.png``: one lane per stage, a few steps, from a pipeline's recorded spans."""

from __future__ import annotations

from typing import Optional, Sequence

from .stages import COMPUTE_STAGES, STAGES, Span

__all__ = ["draw_timeline"]


def draw_timeline(spans: Sequence[Span], path: str, steps: Optional[Sequence[int]] = None,
                  title: str = "") -> str:
    """Draw ``spans`` (only those of ``steps`` when given; spans of step -1 are kept if they
    fall inside the drawn window) as a Gantt chart at ``path``; returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = [s for s in spans if steps is None or s.step in steps]
    if not chosen:
        raise ValueError("spans: none to draw (for the requested steps)")
    t0 = min(s.start for s in chosen)
    t1 = max(s.end for s in chosen)
    chosen += [s for s in spans if s.step == -1 and s.start >= t0 and s.end <= t1]
    lanes = [st for st in STAGES if any(s.stage == st for s in chosen)]
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(lanes) + 1.2))
    cmap = plt.get_cmap("tab10")
    for s in chosen:
        y = lanes.index(s.stage)
        color = cmap(s.step % 10) if s.step >= 0 else "grey"
        ax.broken_barh([((s.start - t0) * 1e3, max((s.end - s.start) * 1e3, 1e-3))],
                       (y - 0.4, 0.8), facecolors=color,
                       edgecolors="black" if s.stage in COMPUTE_STAGES else "none",
                       linewidth=0.3)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(lanes)
    ax.invert_yaxis()
    ax.set_xlabel("ms (colour = batch index; outlined = compute stage)")
    ax.set_title(title or "train pipeline stages")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
