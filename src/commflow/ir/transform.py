"""Passes that turn one program into another (the input is never changed)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from commflow.collectives import Collective
from commflow.errors import ProgramError
from commflow.ir.build import make_program
from commflow.ir.program import Program
from commflow.ir.step import Buffer

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
    order_rows = np.lexsort((np.arange(len(t)), t.chan, part))
    inverse = np.empty_like(order_rows)
    inverse[order_rows] = np.arange(len(t))
    columns = {k: np.asarray(v)[order_rows] for k, v in columns.items()}
    counts = np.diff(t.dep_ptr)
    dep_ptr = np.concatenate(([0], np.cumsum(counts[order_rows])))
    owner = inverse[np.repeat(np.arange(len(t)), counts)]
    dep_idx = inverse[t.dep_idx][np.argsort(owner, kind="stable")]
    root = None if program.root is None else int(perm[program.root])
    params = dict(program.params)
    params["order"] = tuple(int(r) for r in perm)
    return make_program(program.name, program.collective, n, chunk_factor=cf, columns=columns,
                        root=root, dep_ptr=dep_ptr, dep_idx=dep_idx,
                        switches=nparts - n, params=params)


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
