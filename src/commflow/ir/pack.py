"""Threadblocks of a rank that run one after the other, joined: fewer threadblocks, same times.

RCCL runs at most 64 threadblocks per rank (:mod:`commflow.ir.target`), and a stream cut
into threadblocks of at most ``most`` messages (:func:`~commflow.ir.transform.split_channels`)
leaves a shorter last segment on every stream: MI250 x2's reduce-scatter (128 chunks per root,
merged, cut at 60 messages) needs 63-66 threadblocks per rank where its busiest rank's 3,620
messages would fill 61. An MSCCL threadblock has one send peer and one receive peer, so a
channel that only receives from one peer and one that only sends to one peer can share one,
and when the first's steps all finish before the second's begin (in a simulation of the
program) the shared threadblock runs them at the same times. :func:`pack_channels` joins such
pairs; :func:`~commflow.ir.transform.split_channels`'s ``early`` puts the shorter segment of
some streams first, so that short segments at the start of one stream meet short ones at
the end of another.

A connection's channel number is the same at both ends, so joining channels ``a`` (from ``p``)
and ``b`` (to ``q``) at rank ``v`` gives ``p``'s channel of ``a`` and ``q``'s of ``b`` the
joined number too: the joined numbers form chains of connections, and a join is made only
where the two chains meet at ``v`` alone (a chain never holds two channels of one rank).
"""

from __future__ import annotations

import numpy as np

from commflow.errors import ProgramError
from commflow.ir.program import Program
from commflow.ir.step import Op
from commflow.ir.transform import reorder


def pack_channels(program: Program, finish: np.ndarray, most: int) -> Program:
    """``program`` with pairs of channels of one rank joined into one, where one only
    receives from a single peer, the other only sends to a single peer, both hold at most
    ``most`` steps together, and one's steps all finish (``finish``: seconds per step, from a
    simulation of ``program``) before the other's first step could start (its first receive
    completes, or its first send's dependencies are met). The joined channel runs the earlier
    one's steps, then the other's. Ranks with the most channels pair theirs first, each
    channel (fewest steps first) with the smallest that fits. Raises ``ProgramError`` when
    ``finish`` does not give one time per step or ``most`` < 1.
    """
    t = program.table
    if len(finish) != len(t) or most < 1:
        raise ProgramError(f"{program.name}: pack_channels needs one finish time per step "
                           f"({len(t)}, got {len(finish)}) and most >= 1 (got {most})")
    starts = t.channel_starts
    first_step, last_step = starts[:-1], starts[1:] - 1
    sizes = np.diff(starts)
    channel = np.repeat(np.arange(len(sizes)), sizes)
    recvs = (t.op == Op.RECV) | (t.op == Op.RECV_REDUCE)
    sends = t.op == Op.SEND
    count = np.bincount(channel, minlength=len(sizes))
    direction = np.where(np.bincount(channel, weights=sends, minlength=len(sizes)) == count,
                         1, 0)
    direction[np.bincount(channel, weights=recvs, minlength=len(sizes)) == count] = -1
    low = np.full(len(sizes), np.iinfo(np.int64).max)
    high = np.full(len(sizes), np.iinfo(np.int64).min)
    np.minimum.at(low, channel, t.peer.astype(np.int64))
    np.maximum.at(high, channel, t.peer.astype(np.int64))
    direction[low != high] = 0
    begin = _first_start(program, finish, recvs)
    end = finish[last_step]
    joins, label = _pairs(t.part[first_step], t.chan[first_step], t.peer[first_step],
                          direction, sizes, begin, end, most, program.nranks)
    if not joins:
        return program
    new = np.array([_root(label, int(c)) for c in t.chan[first_step]], dtype=np.int64)
    order = np.lexsort((np.arange(len(t)), begin[channel], new[channel], t.part))
    params = dict(program.params)
    params["packed"] = joins
    return reorder(program, order, {"chan": new[channel]}, params=params)


def _first_start(program: Program, finish: np.ndarray, recvs: np.ndarray) -> np.ndarray:
    """Per channel, when its first step could start: a receive's (``recvs``: per step)
    completion, else the last of its dependencies (seconds)."""
    t = program.table
    first = t.channel_starts[:-1]
    begin = np.where(recvs[first], finish[first], 0.0)
    owner = np.repeat(np.arange(len(t)), np.diff(t.dep_ptr))
    ready = np.zeros(len(t))
    np.maximum.at(ready, owner, finish[t.dep_idx])
    return np.maximum(begin, ready[first])


def _root(label: dict[int, int], c: int) -> int:
    """The number channel ``c``'s chain goes by (union-find, halving paths)."""
    while label[c] != c:
        label[c] = label[label[c]]
        c = label[c]
    return c


def _pairs(part, chan, peer, direction, sizes, begin, end, most,
           nranks) -> tuple[int, dict[int, int]]:  # fmt: skip
    """How many pairs of channels (per channel: rank, number, peer, direction ``1`` sends,
    ``-1`` receives, ``0`` neither alone; steps, first start, last finish) to join, as
    :func:`pack_channels` chooses them, and the chains' union-find over channel numbers."""
    label: dict[int, int] = {}
    ranks: dict[int, set[int]] = {}
    for c, p, q, d in zip(chan.tolist(), part.tolist(), peer.tolist(), direction.tolist(),
                          strict=True):
        label.setdefault(c, c)
        ranks.setdefault(c, set()).update((p, q) if d else (p,))
    joins = 0
    for rank in np.argsort(-np.bincount(part, minlength=nranks), kind="stable").tolist():
        mine = np.flatnonzero((part == rank) & (direction != 0))
        mine = mine[np.argsort(sizes[mine], kind="stable")]
        used: set[int] = set()
        for a in mine.tolist():
            if a in used:
                continue
            for b in mine.tolist():
                if (b in used or b == a or direction[b] == direction[a]
                        or sizes[a] + sizes[b] > most
                        or not (end[a] <= begin[b] or end[b] <= begin[a])):
                    continue
                ra, rb = _root(label, int(chan[a])), _root(label, int(chan[b]))
                if ra == rb or ranks[ra] & ranks[rb] != {rank}:
                    continue
                label[rb] = ra
                ranks[ra] |= ranks.pop(rb)
                joins += 1
                used.update((a, b))
                break
    return joins, label
