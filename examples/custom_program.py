"""A hand-written 4-rank ring allgather: build it step by step, verify it, export MSCCL XML.

Run: python examples/custom_program.py
"""

from __future__ import annotations

from commflow import Collective, ProgramBuilder, VerificationError, to_msccl_xml, verify
from commflow.ir import inp, out

N = 4


def ring_allgather(n: int) -> ProgramBuilder:
    """Each rank copies its block into place, then forwards blocks around the ring."""
    b = ProgramBuilder(Collective.ALLGATHER, n, chunk_factor=1, name="my_ring_allgather")
    for rank in range(n):
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        b.copy(rank, inp(0), out(rank))
        for step in range(n - 1):
            b.send(rank, nxt, out((rank - step) % n))
            b.recv(rank, prv, out((rank - step - 1) % n))
    return b


def main() -> None:
    program = ring_allgather(N).build()
    verify(program)
    print(
        f"verified: {program.collective.value} {program.name} on {N} ranks, {program.nsteps} steps"
    )

    broken = ring_allgather(N)
    broken.recv(0, N - 1, out(1))  # one receive too many on rank 0
    try:
        verify(broken.build())
    except VerificationError as error:
        print(f"rejected: {error}")

    print(to_msccl_xml(program), end="")


if __name__ == "__main__":
    main()
