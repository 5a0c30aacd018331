"""Small hand-written programs used by the IR tests (independent of the algorithm library)."""

from __future__ import annotations

from commflow.collectives import Collective
from commflow.ir import Program, ProgramBuilder, inp, out


def ring_allgather(n: int) -> Program:
    """Ring allgather: copy own block, then n-1 forward steps."""
    b = ProgramBuilder(Collective.ALLGATHER, n, chunk_factor=1, name="test-ring-ag")
    for r in range(n):
        b.copy(r, inp(0), out(r))
        for s in range(n - 1):
            b.send(r, (r + 1) % n, out((r - s) % n))
            b.recv(r, (r - 1) % n, out((r - s - 1) % n))
    return b.build()


def ring_allreduce(n: int) -> Program:
    """Ring allreduce: reduce-scatter then allgather, reading input and writing output."""
    b = ProgramBuilder(Collective.ALLREDUCE, n, chunk_factor=n, name="test-ring-ar")
    for r in range(n):
        nxt, prv = (r + 1) % n, (r - 1) % n
        if n == 1:
            b.copy(r, inp(0), out(0))
            continue
        b.send(r, nxt, inp(r))
        for s in range(1, n):
            c = (r - s) % n
            b.recv_reduce(r, prv, inp(c), out(c))
            if s < n - 1:
                b.send(r, nxt, out(c))
        for s in range(n - 1):
            c = (r + 1 - s) % n
            b.send(r, nxt, out(c))
            b.recv(r, prv, out((c - 1) % n))
    return b.build()


def two_channel_allgather(n: int) -> Program:
    """Allgather with a copy on channel 1 that channel 0's first send depends on."""
    b = ProgramBuilder(Collective.ALLGATHER, n, chunk_factor=1, name="test-2ch-ag")
    for r in range(n):
        c = b.copy(r, inp(0), out(r), channel=1)
        for s in range(n - 1):
            b.send(r, (r + 1) % n, out((r - s) % n), deps=[c] if s == 0 else [])
            b.recv(r, (r - 1) % n, out((r - s - 1) % n))
    return b.build()
