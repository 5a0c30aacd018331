"""Passes that turn one program into another (the input is never changed)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

import numpy as np

from commflow.collectives import Collective
from commflow.errors import ProgramError
from commflow.ir.build import make_program
from commflow.ir.program import Program, StepTable
from commflow.ir.step import Buffer, Op

_BLOCKED = {
    Collective.ALLGATHER: (Buffer.OUTPUT,),
    Collective.GATHER: (Buffer.OUTPUT,),
    Collective.REDUCESCATTER: (Buffer.INPUT,),
    Collective.SCATTER: (Buffer.INPUT,),
    Collective.ALLTOALL: (Buffer.INPUT, Buffer.OUTPUT),
}
"""Buffers holding one block per rank, in rank order."""


def relabel(program: Program, order: Sequence[int]) -> Program:
    """The same algorithm with rank ``order[i]`` playing the part of rank ``i``.

    Collectives are symmetric under renaming ranks when per-rank blocks are renamed with them,
    so the result implements the same collective: participants, peers and the root are mapped
    through ``order``, and the blocks of per-rank buffers (allgather's output, alltoall's
    buffers, ...) move to their new owner's position. Use it to lay a ring along a
    topology's fast links. Raises ``ProgramError`` when ``order`` is not a permutation of the
    ranks, or when a step moves several blocks that the new order no longer keeps contiguous.
    """
    n = program.nranks
    perm = np.asarray(order, dtype=np.int64)
    if perm.shape != (n,) or not np.array_equal(np.sort(perm), np.arange(n)):
        raise ProgramError(f"{program.name}: order must be a permutation of 0..{n - 1}, got "
                           f"{list(order)}")
    t = program.table
    nparts = len(program.participants)
    mapping = np.concatenate((perm, np.arange(n, nparts))).astype(np.int64)
    part = mapping[t.part]
    peer = np.where(t.peer >= 0, mapping[np.maximum(t.peer, 0)], -1)
    cf = program.chunk_factor
    columns = {"chan": t.chan, "op": t.op, "count": t.count, "src_buf": t.src_buf,
               "dst_buf": t.dst_buf, "part": part, "peer": peer}
    for side in ("src", "dst"):
        buf, off = getattr(t, f"{side}_buf"), getattr(t, f"{side}_off").astype(np.int64)
        moved = np.isin(buf, _BLOCKED.get(program.collective, ())) & (part < n)
        first = np.clip(off // cf, 0, n - 1)
        last = np.clip((off + t.count - 1) // cf, 0, n - 1)
        breaks = np.concatenate(([0], np.cumsum(perm[1:] != perm[:-1] + 1)))
        split = moved & (breaks[last] != breaks[first])
        if split.any():
            i = int(np.flatnonzero(split)[0])
            raise ProgramError(f"{program.name}: step {program.where(i)} moves blocks that "
                               f"order {list(order)} does not keep contiguous; relabel a "
                               f"program that moves one block per step, or keep them in order")
        columns[f"{side}_off"] = np.where(moved, perm[first] * cf + off % cf, off)
    params = dict(program.params)
    params["order"] = tuple(int(r) for r in perm)
    return reorder(program, np.lexsort((np.arange(len(t)), t.chan, part)), columns,
                   root=None if program.root is None else int(perm[program.root]),
                   params=params)


_COLUMNS = ("part", "chan", "op", "peer", "count", "src_buf", "src_off", "dst_buf", "dst_off")


def reorder(program: Program, order: np.ndarray, columns: dict[str, np.ndarray] | None = None,
            *, root: int | None = None, params: dict[str, object] | None = None) -> Program:
    """``program``'s steps in ``order`` (step indices), with ``columns`` (by step, in the
    current order) replacing its own, dependencies following their steps; ``root`` and
    ``params`` replace the program's when given. The result must be sorted by ``(part,
    chan)``, each channel's steps in the order they run (``ProgramError`` otherwise)."""
    t = program.table
    merged = {name: getattr(t, name) for name in _COLUMNS} | (columns or {})
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(t))
    counts = np.diff(t.dep_ptr)
    dep_ptr = np.concatenate(([0], np.cumsum(counts[order])))
    owner = inverse[np.repeat(np.arange(len(t)), counts)]
    dep_idx = inverse[t.dep_idx][np.argsort(owner, kind="stable")]
    return make_program(
        program.name, program.collective, program.nranks, chunk_factor=program.chunk_factor,
        columns={k: np.asarray(v)[order] for k, v in merged.items()},
        root=program.root if root is None else root, dep_ptr=dep_ptr, dep_idx=dep_idx,
        switches=len(program.participants) - program.nranks,
        params=dict(program.params) if params is None else params)


def repeat(program: Program, loops: int) -> Program:
    """``program`` run ``loops`` times in a row by every channel, on consecutive slices of the
    buffers: how MSCCL's kernel handles a buffer larger than one loop (each threadblock runs
    all its steps on one slice of every chunk, then on the next; a step of loop ``l`` depends
    on loop ``l`` of its dependencies; connections stay first in, first out across loops).

    Loop ``l`` of chunk ``c`` of a buffer of ``k`` chunks is chunk ``l * k + c`` here, a
    loop-major layout: data sits elsewhere than in the collective's layout, so the result is
    for timing (:func:`commflow.sim.simulate` at ``loops`` times the chunk count), not for
    verification or execution. Raises ``ProgramError`` when ``loops`` < 1.
    """
    if loops < 1:
        raise ProgramError(f"{program.name}: loops must be >= 1, got {loops}")
    if loops == 1:
        return program
    t = program.table
    starts, sizes = t.channel_starts[:-1], np.diff(t.channel_starts)
    group_of = np.repeat(np.arange(len(sizes)), sizes)
    group = np.repeat(np.arange(len(sizes)), sizes * loops)
    offset = np.arange(len(t) * loops) - starts[group] * loops
    loop, step = offset // sizes[group], starts[group] + offset % sizes[group]
    chunks = np.array([[p.input_chunks, p.output_chunks, p.scratch_chunks]
                       for p in program.participants], dtype=np.int64)
    columns = {name: getattr(t, name)[step] for name in ("part", "chan", "op", "peer", "count",
                                                        "src_buf", "dst_buf")}
    for buf, off in (("src_buf", "src_off"), ("dst_buf", "dst_off")):
        used = columns[buf] >= 0
        columns[off] = getattr(t, off)[step].astype(np.int64)
        columns[off][used] += loop[used] * chunks[columns["part"][used], columns[buf][used]]
    ndeps = np.diff(t.dep_ptr)[step]
    dep_ptr = np.zeros(len(step) + 1, dtype=np.int64)
    np.cumsum(ndeps, out=dep_ptr[1:])
    within = np.arange(int(dep_ptr[-1])) - np.repeat(dep_ptr[:-1], ndeps)
    deps = t.dep_idx[np.repeat(t.dep_ptr[step], ndeps) + within]
    dep_group = group_of[deps]
    dep_idx = (starts[dep_group] * loops + np.repeat(loop, ndeps) * sizes[dep_group]
               + t.position[deps])
    return make_program(
        program.name, program.collective, program.nranks,
        chunk_factor=program.chunk_factor * loops, columns=columns, root=program.root,
        dep_ptr=dep_ptr, dep_idx=dep_idx,
        switches=len(program.participants) - program.nranks, params=dict(program.params),
    )


def repeated(program: Program, loops: int, steps: np.ndarray) -> np.ndarray:
    """The global indices in ``repeat(program, loops)`` of ``steps`` (global indices in
    ``program``), every loop's copy: ``loops`` times as many, sorted."""
    t = program.table
    steps = np.asarray(steps, dtype=np.int64)
    group = np.searchsorted(t.channel_starts, steps, side="right") - 1
    start, size = t.channel_starts[group], np.diff(t.channel_starts)[group]
    copies = start * loops + (steps - start) + np.arange(loops)[:, None] * size
    return np.sort(copies.ravel())


def split_messages(program: Program, most: int,
                   fused: np.ndarray | None = None) -> tuple[Program, np.ndarray | None]:
    """``program`` with every step of more than ``most`` chunks cut into consecutive parts of
    ``most`` chunks (the last takes the rest), and ``fused`` mapped to the result.

    This is how MSCCL's kernel runs a step whose ``cnt`` exceeds ``mscclMaxAllowedCount``:
    one primitive, one message, per part. A send in ``fused`` (global indices of sends
    fused with the receive before them, ``rcs``/``rrcs``) alternates with that receive part
    by part, as the fused primitive forwards each part once it has it; the result's fused
    sends are all their parts. A step's dependencies stay on its first part; a step that
    waited for it waits for its last. Like :func:`repeat`, for timing. Raises
    ``ProgramError`` when ``most`` < 1.
    """
    if most < 1:
        raise ProgramError(f"{program.name}: most must be >= 1, got {most}")
    t = program.table
    parts = -(-t.count.astype(np.int64) // most)
    if not len(t) or parts.max() == 1:
        return program, fused
    none = fused is None
    fused = np.zeros(0, dtype=np.int64) if none else np.asarray(fused, dtype=np.int64)
    step = np.repeat(np.arange(len(t)), parts)
    piece = np.arange(len(step)) - np.repeat(np.cumsum(parts) - parts, parts)
    base = np.arange(len(t))
    base[fused] -= 1  # a fused send's parts take turns with its receive's
    forward = np.isin(step, fused)
    order = np.lexsort((forward, piece, base[step]))
    step, piece, forward = step[order], piece[order], forward[order]
    columns = {name: getattr(t, name)[step] for name in _COLUMNS}
    columns["count"] = np.minimum(most, columns["count"] - piece * most)
    for buf, off in (("src_buf", "src_off"), ("dst_buf", "dst_off")):
        columns[off] = columns[off].astype(np.int64) + np.where(columns[buf] >= 0,
                                                                piece * most, 0)
    last = np.zeros(len(t), dtype=np.int64)
    ends = piece == parts[step] - 1
    last[step[ends]] = np.flatnonzero(ends)
    ndeps = np.where(piece == 0, np.diff(t.dep_ptr)[step], 0)
    dep_ptr = np.zeros(len(step) + 1, dtype=np.int64)
    np.cumsum(ndeps, out=dep_ptr[1:])
    within = np.arange(int(dep_ptr[-1])) - np.repeat(dep_ptr[:-1], ndeps)
    dep_idx = last[t.dep_idx[np.repeat(t.dep_ptr[step], ndeps) + within]]
    return make_program(
        program.name, program.collective, program.nranks, chunk_factor=program.chunk_factor,
        columns=columns, root=program.root, dep_ptr=dep_ptr, dep_idx=dep_idx,
        switches=len(program.participants) - program.nranks, params=dict(program.params),
    ), None if none else np.flatnonzero(forward)


def stack(programs: Sequence[Program], *, name: str | None = None) -> Program:
    """One program running ``programs`` side by side, each on its own share of the data: the
    ``j``-th of ``k`` programs works on chunks ``j * cf .. (j+1) * cf - 1`` of every block of
    the result (``cf`` = their chunk factor; the result's is ``k * cf``), on channels of its
    own, with scratch of its own. NCCL's channels are this: one ring per channel, each over
    its own part of the buffer, each ring free to take its own rank order.

    Raises ``ProgramError`` when the programs differ in collective, rank count, chunk factor,
    root or participants, or a step moves chunks of several blocks at once.
    """
    if not programs:
        raise ProgramError("stack needs at least one program")
    first = programs[0]
    shape = (first.collective, first.nranks, first.chunk_factor, first.root,
             len(first.participants))
    for p in programs[1:]:
        if (p.collective, p.nranks, p.chunk_factor, p.root, len(p.participants)) != shape:
            raise ProgramError(f"stack: {p.name} differs from {first.name} in collective, rank "
                               "count, chunk factor, root or participants")
    k, cf = len(programs), first.chunk_factor
    scratch = max(part.scratch_chunks for p in programs for part in p.participants)
    names = ("part", "chan", "op", "peer", "count", "src_buf", "src_off", "dst_buf", "dst_off")
    parts: dict[str, list[np.ndarray]] = {c: [] for c in names}
    deps_ptr, deps_idx, base, chan_base = [np.zeros(1, dtype=np.int64)], [], 0, 0
    for j, p in enumerate(programs):
        t = p.table
        for side in ("src", "dst"):
            buf, off = getattr(t, f"{side}_buf"), getattr(t, f"{side}_off").astype(np.int64)
            blocked = np.isin(buf, _BLOCKED.get(p.collective, ()))
            block = off // cf
            if np.any(blocked & ((off + t.count - 1) // cf != block)):
                i = int(np.flatnonzero(blocked & ((off + t.count - 1) // cf != block))[0])
                raise ProgramError(f"stack: {p.name} step {p.where(i)} moves chunks of several "
                                   "blocks at once")
            new = np.where(blocked, block * k * cf + j * cf + off % cf, off + j * cf)
            new = np.where(buf == Buffer.SCRATCH, off + j * scratch, new)
            parts[f"{side}_off"].append(np.where(buf >= 0, new, off))
            parts[f"{side}_buf"].append(buf)
        for c in ("part", "op", "peer", "count"):
            parts[c].append(getattr(t, c))
        parts["chan"].append(t.chan.astype(np.int64) + chan_base)
        chan_base += int(t.chan.max()) + 1 if len(t) else 0
        deps_ptr.append(t.dep_ptr[1:] + deps_ptr[-1][-1])
        deps_idx.append(t.dep_idx + base)
        base += len(t)
    columns = {c: np.concatenate(v) for c, v in parts.items()}
    dep_ptr, dep_idx = np.concatenate(deps_ptr), np.concatenate(deps_idx)
    order = np.lexsort((np.arange(base), columns["chan"], columns["part"]))
    inverse = np.empty_like(order)
    inverse[order] = np.arange(base)
    counts = np.diff(dep_ptr)
    owner = inverse[np.repeat(np.arange(base), counts)]
    return make_program(
        name or first.name, first.collective, first.nranks, chunk_factor=k * cf,
        columns={c: v[order] for c, v in columns.items()}, root=first.root,
        dep_ptr=np.concatenate(([0], np.cumsum(counts[order]))),
        dep_idx=inverse[dep_idx][np.argsort(owner, kind="stable")],
        switches=len(first.participants) - first.nranks,
        params={**dict(first.params), "stacked": k},
    )


def split_channels(program: Program, most: int, *, early: Collection[int] = ()) -> Program:
    """``program`` with every channel of more than ``most`` messages cut into consecutive
    channels of at most ``most`` messages each. Segment ``s`` of a channel holds messages
    ``s * most ..`` of its connection at both ends (so sends and receives still pair up), or
    for the channel numbers in ``early`` (a connection's number at both ends) the shorter
    segment comes first: ``s * most - (-messages % most) ..``; a local step joins the
    segment of the message before it (a channel of local steps only is cut every ``most``
    steps); the first step of each segment waits for the last step of the segment before.
    The steps run in the same order, each segment on a connection of its own: MSCCL caps the
    steps of a threadblock (256, or 64), not how many threadblocks follow each other on one
    link.

    Raises ``ProgramError`` when ``most`` < 1 or a channel to cut talks to more than one peer
    or both sends and receives (its ends would cut at different messages).
    """
    if most < 1:
        raise ProgramError(f"{program.name}: most must be >= 1, got {most}")
    t = program.table
    if not len(t):
        return program
    starts = t.channel_starts
    sizes = np.diff(starts)
    channel = np.repeat(np.arange(len(sizes)), sizes)
    transfer = t.op != Op.COPY
    transfer &= t.op != Op.REDUCE
    sends = t.op == Op.SEND
    local = np.bincount(channel, weights=transfer, minlength=len(sizes)) == 0
    counted = transfer | local[channel]
    seen = np.cumsum(counted)
    before = seen[starts[:-1]] - counted[starts[:-1]]
    message = np.maximum(seen - 1 - before[channel], 0)
    total = np.bincount(channel, weights=counted, minlength=len(sizes)).astype(np.int64)
    long = total > most
    shift = np.where(np.isin(t.chan[starts[:-1]], np.fromiter(early, dtype=np.int64)),
                     -total % most, 0)
    for kind, values in (("peer", np.where(transfer, t.peer, -1)),
                         ("direction", np.where(transfer, sends, -1))):
        low = np.full(len(sizes), np.iinfo(np.int64).max)
        high = np.full(len(sizes), -1)
        np.minimum.at(low, channel[transfer], values[transfer])
        np.maximum.at(high, channel[transfer], values[transfer])
        mixed = long & (low != high) & (high >= 0)
        if mixed.any():
            i = int(starts[int(np.flatnonzero(mixed)[0])])
            raise ProgramError(
                f"{program.name}: channel {program.where(i)} has more than {most} messages "
                f"and more than one {kind}; cut only channels of one connection")
    segment = np.where(long[channel], (message + shift[channel]) // most, 0)
    segments = int(segment.max()) + 1
    if segments == 1:
        return program
    columns = {name: getattr(t, name) for name in ("part", "op", "peer", "count", "src_buf",
                                                   "src_off", "dst_buf", "dst_off")}
    columns["chan"] = t.chan.astype(np.int64) * segments + segment
    steps = np.arange(len(t))
    joins = np.flatnonzero((t.position > 0) & (segment != np.r_[-1, segment[:-1]]))
    owner = np.concatenate((np.repeat(steps, np.diff(t.dep_ptr)), joins))
    dep = np.concatenate((t.dep_idx, joins - 1))
    order = np.argsort(owner, kind="stable")
    dep_ptr = np.zeros(len(t) + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=len(t)), out=dep_ptr[1:])
    params = dict(program.params)
    params["split"] = most
    return make_program(
        program.name, program.collective, program.nranks, chunk_factor=program.chunk_factor,
        columns=columns, root=program.root, dep_ptr=dep_ptr, dep_idx=dep[order],
        switches=len(program.participants) - program.nranks, params=params,
    )


def with_deps(program: Program, owners: np.ndarray, deps: np.ndarray) -> Program:
    """``program`` with ``deps[k]`` added to the dependencies of step ``owners[k]`` (each
    step's dependencies sorted, duplicates dropped)."""
    t = program.table
    n = len(t)
    old_owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(t.dep_ptr))
    owner = np.concatenate((old_owner, owners.astype(np.int64)))
    dep = np.concatenate((t.dep_idx, deps.astype(np.int64)))
    order = np.lexsort((dep, owner))
    owner, dep = owner[order], dep[order]
    keep = np.r_[True, (owner[1:] != owner[:-1]) | (dep[1:] != dep[:-1])]
    owner, dep = owner[keep], dep[keep]
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=n), out=ptr[1:])
    columns = {c.name: getattr(t, c.name) for c in dataclasses.fields(StepTable)
               if c.name not in ("dep_ptr", "dep_idx")}
    table = StepTable.from_columns(columns, ptr, dep)
    return dataclasses.replace(program, table=table)
