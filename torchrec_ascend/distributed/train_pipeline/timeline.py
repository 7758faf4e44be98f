"""``pipeline.png``: one lane per stage, a few steps, from a pipeline's recorded spans."""

from __future__ import annotations

from typing import Optional, Sequence

from .stages import COMPUTE_STAGES, STAGES, Span

__all__ = ["draw_timeline"]


def draw_timeline(spans: Sequence[Span], path: str, steps: Optional[Sequence[int]] = None,
                  title: str = "") -> str:
    """Draw a Gantt chart of ``spans`` at ``path`` (returns ``path``): the window runs from the
    first to the last compute-thread span of ``steps`` (all steps when None), and every span
    inside it is drawn, other threads' (step -1, grey) included."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    main = [s for s in spans if s.step >= 0 and (steps is None or s.step in steps)]
    if not main:
        raise ValueError("spans: none to draw (for the requested steps)")
    t0 = min(s.start for s in main)
    t1 = max(s.end for s in main)
    chosen = [s for s in spans if s.end > t0 and s.start < t1]
    lanes = [st for st in STAGES if any(s.stage == st for s in chosen)]
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(lanes) + 1.2))
    cmap = plt.get_cmap("tab10")
    palette = [cmap(i) for i in range(10) if i != 7]  # tab10's 7 is grey: other threads
    for s in chosen:
        y = lanes.index(s.stage)
        color = palette[s.step % len(palette)] if s.step >= 0 else "grey"
        ax.broken_barh([((s.start - t0) * 1e3, max((s.end - s.start) * 1e3, 1e-3))],
                       (y - 0.4, 0.8), facecolors=color,
                       edgecolors="black" if s.stage in COMPUTE_STAGES else "none",
                       linewidth=0.3)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(lanes)
    ax.invert_yaxis()
    ax.set_xlabel("ms (colour = pipeline step, grey = other threads; outlined = compute stage)")
    ax.set_title(title or "train pipeline stages")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
