"""The backend table as rows and as printed text."""

from __future__ import annotations

import sys
from typing import List, Sequence, Tuple

from .spec import DEVICES
from .state import STATE

__all__ = ["describe", "describe_rows"]


def describe_rows(devices: Sequence[str] = DEVICES) -> List[Tuple[str, str, str, str]]:
    """(op, device, backend, why) for every registered op and device; ``why`` names the cases a
    partial backend covers (the other calls go to the next backend) and the spec's ``detail``
    (what the backend runs inside, e.g. the HSTU attention's csrc engines)."""
    rows = []
    for s in STATE.all_specs():
        for dev in devices:
            backend, why = STATE.choose(s.name, dev)
            note = s.detail(dev, backend) if s.detail is not None else ""
            rows.append((s.name, dev, backend, "; ".join(x for x in (why, note) if x)))
    return rows


def describe(devices: Sequence[str] = DEVICES, file=None) -> List[Tuple[str, str, str, str]]:
    """Print the backend table (op, device, backend, why) and return its rows."""
    rows = describe_rows(devices)
    header = ("op", "device", "backend", "why")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(3)]
    out = file or sys.stdout
    line = "  ".join(h.ljust(w) for h, w in zip(header[:3], widths)) + "  " + header[3]
    print(line, file=out)
    print("-" * len(line), file=out)
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3], file=out)
    return rows
