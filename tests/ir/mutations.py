"""Mutations of programs for property tests: each should turn a correct program into one the
verifier rejects."""

from __future__ import annotations

import numpy as np

from commflow.ir import Program, make_program
from commflow.ir.matching import match_transfers
from commflow.ir.step import Op

COLUMNS = ("part", "chan", "op", "peer", "src_buf", "src_off", "dst_buf", "dst_off", "count")


def _rebuild(program: Program, rows: np.ndarray, deps: list[list[int]]) -> Program:
    columns = {k: rows[:, j] for j, k in enumerate(COLUMNS)}
    ptr = np.concatenate(([0], np.cumsum([len(d) for d in deps]))).astype(np.int64)
    idx = np.array([d for ds in deps for d in ds], dtype=np.int64)
    return make_program(program.name, program.collective, program.nranks,
                        chunk_factor=program.chunk_factor, columns=columns, root=program.root,
                        dep_ptr=ptr, dep_idx=idx,
                        switches=len(program.participants) - program.nranks)


def _rows_and_deps(program: Program) -> tuple[np.ndarray, list[list[int]]]:
    t = program.table
    rows = np.stack([getattr(t, k).astype(np.int64) for k in COLUMNS], axis=1)
    deps = [t.deps_of(i).tolist() for i in range(len(t))]
    return rows, deps


def drop_step(program: Program, i: int) -> Program:
    """Remove step ``i`` (and dependencies on it)."""
    rows, deps = _rows_and_deps(program)
    rows = np.delete(rows, i, axis=0)
    deps = [[d - (d > i) for d in ds if d != i] for j, ds in enumerate(deps) if j != i]
    return _rebuild(program, rows, deps)


def set_peer(program: Program, i: int, peer: int) -> Program:
    """Point communicating step ``i`` at another ``peer``."""
    rows, deps = _rows_and_deps(program)
    rows[i, COLUMNS.index("peer")] = peer
    return _rebuild(program, rows, deps)


def _insert_copies(program: Program, steps: list[int], accumulate: int) -> Program:
    """Insert a copy of each of ``steps`` right after it; the copy of step ``accumulate``
    reduces into its destination (its source becomes its destination)."""
    rows, deps = _rows_and_deps(program)
    src, dst = COLUMNS.index("src_buf"), COLUMNS.index("dst_buf")
    for i in sorted(steps, reverse=True):
        row = rows[i].copy()
        if i == accumulate:
            row[src:src + 2] = row[dst:dst + 2]
        rows = np.insert(rows, i + 1, row, axis=0)
        deps = [[d + (d > i) for d in ds] for ds in deps]
        deps.insert(i + 1, [])
    return _rebuild(program, rows, deps)


def duplicate_reduce(program: Program, i: int) -> Program:
    """Apply reduction step ``i`` a second time, accumulating into its destination (with a
    second copy of its matching send, for a receive-reduce, so the message counts agree)."""
    if program.table.op[i] == Op.RECV_REDUCE:
        return _insert_copies(program, [i, int(match_transfers(program)[i])], accumulate=i)
    return _insert_copies(program, [i], accumulate=i)


def drop_deps(program: Program, i: int) -> Program:
    """Remove the explicit dependencies of step ``i`` (a data race where they ordered two
    channels' accesses to a chunk)."""
    rows, deps = _rows_and_deps(program)
    deps[i] = []
    return _rebuild(program, rows, deps)
