"""Byte layout of one all_to_all carrying tensors of any dtypes and trailing shapes.

Per peer, the buffer holds each field's rows for that peer back to back, every segment padded to
:data:`ALIGN` bytes, so the receiver views each segment back in its dtype without a copy.  The
sender and the receiver derive the same layout from the row counts per (field, peer).
"""

from __future__ import annotations

import dataclasses
import math
from typing import List, Sequence, Tuple

import numpy as np
import torch

from ...ops.extension import kernel

__all__ = ["ALIGN", "Field", "pack", "pack_batch", "unpack", "scatter_rows", "to_bytes", "token_index"]

ALIGN = 16  # bytes; covers every dtype's alignment (complex128 included)


def _pad(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclasses.dataclass(frozen=True)
class Field:
    """One tensor of a batch: sample-level (``group=-1``) or tokens of jagged group ``group``;
    ``trailing`` is its shape after the first dimension."""

    name: str
    group: int
    dtype: torch.dtype
    trailing: Tuple[int, ...]
    row_bytes: int = dataclasses.field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "row_bytes", self.dtype.itemsize * math.prod(self.trailing))


def to_bytes(t: torch.Tensor) -> torch.Tensor:
    """``t`` as 1-D ``uint8`` (its rows back to back)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def peer_bytes(fields: Sequence[Field], per_peer: Sequence[Sequence[int]], world: int) -> List[int]:
    """Bytes of every peer's chunk for ``per_peer[f][p]`` rows of field ``f`` to peer ``p``."""
    return [sum(_pad(per_peer[f][p] * fld.row_bytes) for f, fld in enumerate(fields)) for p in range(world)]


def pack(rows: Sequence[torch.Tensor], fields: Sequence[Field], per_peer: Sequence[Sequence[int]],
         world: int, device: torch.device) -> Tuple[torch.Tensor, List[int]]:
    """Byte buffer with, per peer ``p``, each field's next ``per_peer[f][p]`` rows of ``rows[f]``
    (rows already grouped by peer); returns the buffer and the bytes per peer."""
    sizes = peer_bytes(fields, per_peer, world)
    buf = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
    pos = 0
    src = [0] * len(fields)
    flat = [to_bytes(r) for r in rows]
    for p in range(world):
        for f, fld in enumerate(fields):
            nb = per_peer[f][p] * fld.row_bytes
            if nb:
                buf[pos:pos + nb].copy_(flat[f][src[f]:src[f] + nb])
            src[f] += nb
            pos += _pad(nb)
    return buf, sizes


def pack_batch(tensors: Sequence[torch.Tensor], fields: Sequence[Field], order: np.ndarray,
               lengths: np.ndarray, dest: np.ndarray, per_peer: Sequence[Sequence[int]], world: int,
               device: torch.device) -> Tuple[torch.Tensor, List[int]]:
    """The send buffer of a local batch: ``tensors[f]`` is field ``f``'s local tensor (sample
    rows, or token rows of jagged group ``fields[f].group`` with ``lengths [B, G]``); samples go in
    ``order`` (local indices grouped by ascending destination ``dest [B]``), ``per_peer[f][p]`` rows
    of field ``f`` to peer ``p``.  Returns the buffer and the bytes per peer (as :func:`pack`)."""
    fn = kernel("lb_pack") if device.type == "cpu" else None
    if fn is not None:
        buf, sizes = fn(list(tensors), [f.group for f in fields], [f.row_bytes for f in fields],
                        torch.from_numpy(order), torch.from_numpy(lengths), torch.from_numpy(dest),
                        world, ALIGN)
        return buf, sizes.tolist()
    send_order = torch.from_numpy(order).to(device)
    tok = {g: torch.from_numpy(token_index(lengths[:, g], order)).to(device)
           for g in sorted({f.group for f in fields if f.group >= 0})}
    rows = [t.index_select(0, send_order if f.group < 0 else tok[f.group]) for t, f in zip(tensors, fields)]
    return pack(rows, fields, per_peer, world, device)


def unpack(buf: torch.Tensor, fields: Sequence[Field], per_peer: Sequence[Sequence[int]],
           world: int) -> List[torch.Tensor]:
    """Inverse of :func:`pack` on the receiving side: one tensor per field, peers in order."""
    fn = kernel("lb_unpack") if buf.device.type == "cpu" else None
    if fn is None:
        return _unpack_reference(buf, fields, per_peer, world)
    parts = fn(buf, [f.row_bytes for f in fields], torch.tensor(per_peer, dtype=torch.int64).reshape(-1, world),
               ALIGN)
    return [p.view(f.dtype).reshape((sum(n),) + f.trailing) for p, f, n in zip(parts, fields, per_peer)]


def _unpack_reference(buf: torch.Tensor, fields: Sequence[Field], per_peer: Sequence[Sequence[int]],
                      world: int) -> List[torch.Tensor]:
    """:func:`unpack` with torch views and ``cat`` (without the extension, or off the CPU)."""
    parts: List[List[torch.Tensor]] = [[] for _ in fields]
    pos = 0
    for p in range(world):
        for f, fld in enumerate(fields):
            n = per_peer[f][p]
            nb = n * fld.row_bytes
            if n:
                parts[f].append(buf[pos:pos + nb].view(fld.dtype).reshape((n,) + fld.trailing))
            pos += _pad(nb)
    out = []
    for f, fld in enumerate(fields):
        if not parts[f]:
            out.append(torch.empty((0,) + fld.trailing, dtype=fld.dtype, device=buf.device))
        else:
            out.append(parts[f][0] if len(parts[f]) == 1 else torch.cat(parts[f]))
    return out


def token_index(lengths: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Token rows (int64) of samples ``order``, in that order, of a jagged batch with ``lengths``."""
    starts = np.cumsum(lengths) - lengths
    ln = lengths[order]
    shift = starts[order] - (np.cumsum(ln) - ln)
    return np.repeat(shift, ln) + np.arange(int(ln.sum()), dtype=np.int64)


def scatter_rows(buf: torch.Tensor, order: torch.Tensor, dtype: torch.dtype, trailing: Tuple[int, ...]) -> torch.Tensor:
    """``out[order[i]] = row i`` of ``buf`` (1-D ``uint8``, ``len(order)`` rows of ``dtype`` and
    shape ``trailing``): the inverse permutation of a gather by ``order``."""
    n = int(order.numel())
    fld = Field("", -1, dtype, tuple(trailing))
    fn = kernel("lb_scatter_rows") if buf.device.type == "cpu" and order.device.type == "cpu" else None
    if fn is not None and fld.row_bytes:
        return fn(buf, order, fld.row_bytes).view(dtype).reshape((n,) + fld.trailing)
    rows = buf.view(dtype).reshape((n,) + fld.trailing) if fld.row_bytes else \
        torch.empty((n,) + fld.trailing, dtype=dtype, device=buf.device)
    out = torch.empty_like(rows)
    out.index_copy_(0, order.to(rows.device), rows)
    return out
