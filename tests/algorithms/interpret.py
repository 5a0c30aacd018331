"""A tiny numpy reference interpreter for programs, and numpy results of the collectives.

Independent of the verifier: a program runs on integer arrays (one row of ``width`` elements
per chunk), steps taken in a random order among those whose predecessors are done (previous
step of the channel, explicit deps, the matching send); sends are eager (the message is a
copy taken when the send runs). Output and scratch start as random garbage, so reading
unwritten data shows up as a wrong result.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from commflow.collectives import Collective
from commflow.ir import Buffer, Op, Program, match_transfers


def execution_order(program: Program, rng: np.random.Generator) -> Iterator[int]:
    """Global step indices in a random order respecting channel order, deps and messages.

    Raises ``AssertionError`` if some steps can never run (deadlock).
    """
    t = program.table
    n = len(t)
    sender = match_transfers(program)
    succ: list[list[int]] = [[] for _ in range(n)]
    indegree = np.zeros(n, dtype=np.int64)
    for i in range(n):
        preds = [int(d) for d in t.deps_of(i)]
        if t.position[i] > 0:
            preds.append(i - 1)
        if sender[i] >= 0:
            preds.append(int(sender[i]))
        indegree[i] = len(preds)
        for p in preds:
            succ[p].append(i)
    ready = [int(i) for i in np.flatnonzero(indegree == 0)]
    done = 0
    while ready:
        i = ready.pop(int(rng.integers(len(ready))))
        done += 1
        yield i
        for j in succ[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    assert done == n, f"{program.name}: {n - done} steps never run (deadlock)"


def run(program: Program, inputs: list[np.ndarray], rng: np.random.Generator) -> list[np.ndarray]:
    """Execute ``program`` on ``inputs`` (rank r: shape ``(input chunks, width)``); returns
    every rank's output array."""
    width = inputs[0].shape[1]
    bufs = []
    for r, part in enumerate(program.participants):
        own = inputs[r].copy() if r < program.nranks else np.zeros((0, width), np.int64)
        garbage = [rng.integers(-(10**6), 10**6, (part.chunks(b), width)) for b in Buffer]
        bufs.append([own, garbage[Buffer.OUTPUT], garbage[Buffer.SCRATCH]])
    t = program.table
    sender = match_transfers(program)
    messages: dict[int, np.ndarray] = {}
    for i in execution_order(program, rng):
        part, op, k = int(t.part[i]), Op(int(t.op[i])), int(t.count[i])
        src = (
            bufs[part][t.src_buf[i]][t.src_off[i] : t.src_off[i] + k] if t.src_buf[i] >= 0 else None
        )
        if op is Op.SEND:
            messages[i] = src.copy()
            continue
        dst = bufs[part][t.dst_buf[i]][t.dst_off[i] : t.dst_off[i] + k]
        if op is Op.RECV:
            value = messages.pop(int(sender[i]))
        elif op is Op.RECV_REDUCE:
            value = src + messages.pop(int(sender[i]))
        elif op is Op.COPY:
            value = src.copy()
        else:
            value = dst + src
        dst[...] = value
    assert not messages, f"{program.name}: {len(messages)} message(s) never received"
    return [bufs[r][Buffer.OUTPUT] for r in range(program.nranks)]


def expected(program: Program, inputs: list[np.ndarray]) -> dict[int, np.ndarray]:
    """The numpy result of the program's collective: ``{rank: output}`` for every rank whose
    output the collective defines."""
    coll, n, cf, root = program.collective, program.nranks, program.chunk_factor, program.root
    total = np.sum(inputs, axis=0)
    if coll is Collective.ALLREDUCE:
        return dict.fromkeys(range(n), total)
    if coll is Collective.REDUCE:
        return {root: total}
    if coll is Collective.BROADCAST:
        return dict.fromkeys(range(n), inputs[root])
    if coll is Collective.ALLGATHER:
        return dict.fromkeys(range(n), np.concatenate(inputs))
    if coll is Collective.GATHER:
        return {root: np.concatenate(inputs)}
    if coll is Collective.REDUCESCATTER:
        return {r: total[r * cf : (r + 1) * cf] for r in range(n)}
    if coll is Collective.SCATTER:
        return {r: inputs[root][r * cf : (r + 1) * cf] for r in range(n)}
    return {
        r: np.concatenate([inputs[i][r * cf : (r + 1) * cf] for i in range(n)]) for r in range(n)
    }


def check_numerically(program: Program, seed: int = 0, width: int = 3) -> None:
    """Run ``program`` on random integers and assert every defined output equals numpy's."""
    rng = np.random.default_rng(seed)
    chunks_in, _ = program.expected_buffers()
    inputs = [rng.integers(-1000, 1000, (chunks_in, width)) for _ in range(program.nranks)]
    outputs = run(program, inputs, rng)
    for rank, want in expected(program, inputs).items():
        np.testing.assert_array_equal(outputs[rank], want, err_msg=f"{program.name} rank {rank}")
