"""Byte layout of one all_to_all carrying tensors of any dtypes and trailing shapes.

Per peer, the buffer holds each field's rows for that peer back to back, every segment padded to
:data:`ALIGN` bytes, so the receiver views each segment back in its dtype without a copy.  The
sender and the receiver derive the same layout from the row counts per (field, peer).

:func:`plan_pack` also works out the exchange itself from the global plan (who sends which rows
to whom, who receives what), in one csrc call (``lb_exchange_pack``) where the extension is built,
else with the numpy/torch reference :func:`_plan_pack_reference` (the same result).
"""

from __future__ import annotations

import dataclasses
import math
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from ...ops.extension import kernel

__all__ = ["ALIGN", "ExchangePlan", "Field", "pack", "plan_pack", "unpack", "scatter_rows", "to_bytes",
           "token_index"]

ALIGN = 16  # bytes; covers every dtype's alignment (complex128 included)


def _pad(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclasses.dataclass(frozen=True)
class Field:
    """One tensor of a batch: sample-level (``group=-1``) or tokens of jagged group ``group``;
    ``trailing`` is its shape after the first dimension.  ``kind`` is its row of an
    :class:`ExchangePlan`'s table (1: samples, ``2 + g``: tokens of group ``g``); ``like`` an empty
    ``[0, *trailing]`` CPU tensor of its dtype (what the csrc kernels shape their output after)."""

    name: str
    group: int
    dtype: torch.dtype
    trailing: Tuple[int, ...]
    row_bytes: int = dataclasses.field(init=False, compare=False)
    like: torch.Tensor = dataclasses.field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "row_bytes", self.dtype.itemsize * math.prod(self.trailing))
        object.__setattr__(self, "like", torch.empty((0,) + tuple(self.trailing), dtype=self.dtype))

    @property
    def kind(self) -> int:
        return 2 + self.group


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


def _ints(a: np.ndarray) -> List[int]:
    return [int(x) for x in a.tolist()]


@dataclasses.dataclass
class ExchangePlan:
    """One rank's view of an exchange (from :func:`plan_pack`).

    ``table`` int64 ``[2, 2 + G, world]``: (send, recv) x (bytes, samples, tokens of jagged group
    ``0 .. G-1``) per peer; ``order [B]`` the local samples grouped by destination (ascending,
    stable), ``recv_global [B']`` the global indices received (ascending), ``recv_lengths [G, B']``
    their token counts (CPU int64)."""

    counts: List[int]                # local batch size of every rank
    bins: np.ndarray                 # [N] destination rank of every global sample
    rank: int
    start: int                       # global index of this rank's first sample
    table: torch.Tensor
    order: np.ndarray
    recv_global: np.ndarray
    recv_lengths: torch.Tensor
    send_order: torch.Tensor = dataclasses.field(init=False, repr=False)  # ``order`` as a CPU tensor
    lists: List[List[List[int]]] = dataclasses.field(init=False, repr=False)  # ``table.tolist()``

    def __post_init__(self) -> None:
        self.send_order = torch.from_numpy(self.order)
        self.lists = self.table.tolist()

    @property
    def send_bytes(self) -> List[int]:
        return self.lists[0][0]

    @property
    def recv_bytes(self) -> List[int]:
        return self.lists[1][0]

    @property
    def send_counts(self) -> List[int]:
        return self.lists[0][1]

    @property
    def recv_counts(self) -> List[int]:
        return self.lists[1][1]

    def send_tokens(self, g: int) -> List[int]:
        return self.lists[0][2 + g]

    def recv_tokens(self, g: int) -> List[int]:
        return self.lists[1][2 + g]

    @property
    def recv_rows(self) -> torch.Tensor:
        """``[2 + G, world]`` the recv half of ``table``: bytes, then rows received per kind
        (samples, tokens of each group; :attr:`Field.kind`) and peer."""
        return self.table[1]


def plan_pack(rows: np.ndarray, counts: np.ndarray, bins: np.ndarray, rank: int,
              tensors: Sequence[torch.Tensor], fields: Sequence[Field], device: torch.device,
              groups: Optional[List[int]] = None, row_bytes: Optional[List[int]] = None
              ) -> Tuple[ExchangePlan, torch.Tensor]:
    """The exchange of a planned global batch for ``rank`` and its send buffer (on ``device``).

    ``rows`` int64 ``[N, 1 + G]`` of the global batch (column 0 is not read, then the lengths of
    every jagged group), rank ``r``'s samples at ``sum(counts[:r]) ..``; ``bins [N]`` the rank of
    every sample; ``tensors[f]`` this rank's local tensor of ``fields[f]``.  The buffer holds, per
    peer, every field's rows for it (module docstring), samples in local index order.  ``groups``
    / ``row_bytes``: the fields' ``group`` / ``row_bytes`` lists, if the caller keeps them."""
    fn = kernel("lb_exchange_pack") if device.type == "cpu" else None
    if fn is None:
        buf, table, order, recv_global, recv_lengths = _plan_pack_reference(rows, counts, bins, rank, tensors,
                                                                            fields, device)
    else:
        buf, table, order, recv_global, recv_lengths = fn(
            torch.from_numpy(rows), torch.from_numpy(counts), torch.from_numpy(bins), rank, tensors,
            [f.group for f in fields] if groups is None else groups,
            [f.row_bytes for f in fields] if row_bytes is None else row_bytes, ALIGN)
        order, recv_global = order.numpy(), recv_global.numpy()
    c = counts.tolist()
    return ExchangePlan(c, bins, rank, sum(c[:rank]), table, order, recv_global, recv_lengths), buf


def _plan_pack_reference(rows: np.ndarray, counts: np.ndarray, bins: np.ndarray, rank: int,
                         tensors: Sequence[torch.Tensor], fields: Sequence[Field], device: torch.device):
    """:func:`plan_pack` with numpy and torch ops (without the extension, or off the CPU):
    ``(buffer, table, order, recv_global, recv_lengths)`` as ``lb_exchange_pack`` returns them."""
    world = len(counts)
    glengths = rows[:, 1:]
    G = glengths.shape[1]
    owner = np.repeat(np.arange(world, dtype=np.int64), counts)
    start = int(counts[:rank].sum())
    B = int(counts[rank])
    local, llen = bins[start:start + B], glengths[start:start + B]
    mine = bins == rank
    order = np.argsort(local, kind="stable")
    send = [_ints(np.bincount(local, minlength=world))] + [
        _ints(np.bincount(local, llen[:, g], world)) for g in range(G)]
    recv = [_ints(np.bincount(owner[mine], minlength=world))] + [
        _ints(np.bincount(owner[mine], glengths[mine, g], world)) for g in range(G)]
    send_per = [send[f.kind - 1] for f in fields]
    table = torch.tensor([[peer_bytes(fields, send_per, world)] + send,
                          [peer_bytes(fields, [recv[f.kind - 1] for f in fields], world)] + recv],
                         dtype=torch.int64).reshape(2, 2 + G, world)
    send_order = torch.from_numpy(order).to(device)
    tok = {g: torch.from_numpy(token_index(llen[:, g], order)).to(device)
           for g in sorted({f.group for f in fields if f.group >= 0})}
    picked = [t.index_select(0, send_order if f.group < 0 else tok[f.group]) for t, f in zip(tensors, fields)]
    buf, _ = pack(picked, fields, send_per, world, device)
    recv_global = np.flatnonzero(mine)
    return buf, table, order, recv_global, torch.from_numpy(np.ascontiguousarray(glengths[mine].T))


def unpack(buf: torch.Tensor, fields: Sequence[Field], rows: torch.Tensor) -> List[torch.Tensor]:
    """Inverse of :func:`pack` on the receiving side: one tensor per field, peers in order;
    ``rows`` int64 ``[K, world]`` rows per kind (row :attr:`Field.kind` for each field) and peer
    (:attr:`ExchangePlan.recv_rows`)."""
    fn = kernel("lb_unpack") if buf.device.type == "cpu" else None
    if fn is None:
        table = rows.tolist()
        return _unpack_reference(buf, fields, [table[f.kind] for f in fields], rows.shape[1])
    return fn(buf, [f.like for f in fields], [f.kind for f in fields], rows, ALIGN)


def _unpack_reference(buf: torch.Tensor, fields: Sequence[Field], per_peer: Sequence[Sequence[int]],
                      world: int) -> List[torch.Tensor]:
    """Inverse of :func:`pack` with torch views and ``cat`` (without the extension, or off the
    CPU): ``per_peer[f][p]`` rows of field ``f`` from peer ``p``."""
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


def scatter_rows(buf: torch.Tensor, order: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``out[order[i]] = row i`` of ``buf`` (1-D ``uint8``, ``len(order)`` rows of ``like``'s dtype
    and trailing shape): the inverse permutation of a gather by ``order``."""
    n = int(order.numel())
    trailing = tuple(like.shape[1:])
    fn = kernel("lb_scatter_rows") if buf.device.type == "cpu" and order.device.type == "cpu" else None
    if fn is not None:
        return fn(buf, order, like)
    rows = buf.view(like.dtype).reshape((n,) + trailing) if buf.numel() else \
        torch.empty((n,) + trailing, dtype=like.dtype, device=buf.device)
    out = torch.empty_like(rows)
    out.index_copy_(0, order.to(rows.device), rows)
    return out
