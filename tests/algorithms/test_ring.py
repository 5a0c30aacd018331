"""Ring family: the vectorised generator against a plain-loop reference, the alpha-beta
closed forms, pipelining order, and size at scale."""

from __future__ import annotations

from fractions import Fraction

import pytest

from commflow.algorithms import build
from commflow.ir import Op, Step, inp, out, scr

from .alphabeta import alpha_beta_time, message_count
from .interpret import check_numerically

ALPHA, BETA, SIZE = Fraction(3), Fraction(1, 7), Fraction(2**6 * 3**3 * 5**2 * 7 * 11 * 13)


def _reference(collective: str, p: int, k: int, channels: int, r: int, c: int) -> list[Step]:
    """Rank ``r``'s channel ``c`` written out step by step: piece j of every ring step is
    forwarded right after it arrives; the first sends come from the input."""
    nxt, prv = (r + 1) % p, (r - 1) % p
    steps = 2 * (p - 1) if collective == "allreduce" else p - 1
    if collective == "allreduce":
        cf = p * k * channels

        def chunk(seg: int, j: int) -> int:
            return c * p * k + seg % p * k + j

        def sent(t: int, j: int):
            if t < p - 1:
                return inp(chunk(r - t, j)) if t == 0 else out(chunk(r - t, j))
            return out(chunk(r + 1 - (t - p + 1), j))

        def received(t: int, j: int) -> Step:
            if t < p - 1:
                x = chunk(r - t - 1, j)
                return Step(Op.RECV_REDUCE, prv, inp(x), out(x))
            return Step(Op.RECV, prv, None, out(chunk(r - (t - p + 1), j)))
    elif collective == "allgather":
        cf = k * channels

        def sent(t: int, j: int):
            x = c * k + j
            return inp(x) if t == 0 else out((r - t) % p * cf + x)

        def received(t: int, j: int) -> Step:
            return Step(Op.RECV, prv, None, out((r - t - 1) % p * cf + c * k + j))
    else:
        cf = k * channels

        def sent(t: int, j: int):
            x = (r - t - 1) % p * cf + c * k + j
            return inp(x) if t == 0 else scr(x)

        def received(t: int, j: int) -> Step:
            x = (r - t - 2) % p * cf + c * k + j
            dst = out(c * k + j) if t == steps - 1 else scr(x)
            return Step(Op.RECV_REDUCE, prv, inp(x), dst)

    if p == 1:
        return [Step(Op.COPY, None, inp(c * k, k), out(c * k, k))]
    want = []
    if collective == "allgather":
        want.append(Step(Op.COPY, None, inp(c * k, k), out(r * cf + c * k, k)))
    want += [Step(Op.SEND, nxt, sent(0, j), None) for j in range(k)]
    for t in range(steps):
        for j in range(k):
            want.append(received(t, j))
            if t + 1 < steps:
                want.append(Step(Op.SEND, nxt, sent(t + 1, j), None))
    return want


@pytest.mark.parametrize("collective", ["allreduce", "allgather", "reducescatter"])
@pytest.mark.parametrize("p", [1, 2, 3, 5])
def test_vectorised_ring_equals_reference(collective, p):
    for k, channels in ((1, 1), (3, 1), (2, 3)):
        program = build(collective, "ring", p, chunks=k, channels=channels)
        for r in range(p):
            for c in range(channels):
                assert list(program.steps(r, c)) == _reference(collective, p, k, channels, r, c)


@pytest.mark.parametrize("p", range(1, 13))
def test_closed_forms(p):
    frac = Fraction(p - 1, p)
    assert (
        alpha_beta_time(build("allreduce", "ring", p), ALPHA, BETA, SIZE)
        == 2 * (p - 1) * ALPHA + 2 * frac * SIZE * BETA
    )
    for coll in ("allgather", "reducescatter"):
        assert (
            alpha_beta_time(build(coll, "ring", p), ALPHA, BETA, SIZE)
            == (p - 1) * ALPHA + frac * SIZE * BETA
        )


@pytest.mark.parametrize("p", range(2, 10))
def test_chain_closed_form_is_pipelined(p):
    for coll in ("broadcast", "reduce"):
        for k in (1, 4):
            program = build(coll, "ring", p, chunks=k, root=p // 2)
            assert alpha_beta_time(program, ALPHA, BETA, SIZE) == (p - 2 + k) * (
                ALPHA + SIZE / k * BETA
            )
            assert message_count(program) == (p - 1) * k


def test_ring_forwards_a_piece_before_receiving_the_next():
    steps = build("allreduce", "ring", 4, chunks=3).steps(2, 0)
    first_forward = next(
        i for i, s in enumerate(steps) if s.op is Op.SEND and s.src.buffer is out(0).buffer
    )
    second_receive = [i for i, s in enumerate(steps) if s.op.receives][1]
    assert first_forward < second_receive
    chain = build("broadcast", "ring", 4, chunks=3, root=1).steps(2, 0)
    assert [s.op for s in chain] == [Op.RECV, Op.SEND] * 3


def test_reduce_chain_leaves_non_root_outputs_alone():
    program = build("reduce", "ring", 5, chunks=2, channels=2, root=3)
    for r in range(5):
        for c in (0, 1):
            written = {s.dst.buffer for s in program.steps(r, c) if s.dst is not None}
            assert (out(0).buffer in written) == (r == 3)


def test_odd_chunks_and_channels_compute_the_collective():
    for coll in ("allreduce", "allgather", "reducescatter", "broadcast", "reduce"):
        for p in (4, 7):
            check_numerically(build(coll, "ring", p, chunks=3, channels=3, root=p - 1))


def test_large_ring_has_the_expected_shape():
    p, k = 256, 2
    program = build("allreduce", "ring", p, chunks=k)
    t = program.table
    assert program.chunk_factor == p * k
    assert program.nsteps == p * 2 * (p - 1) * 2 * k
    send = t.op == Op.SEND
    assert (t.peer[send] == (t.part[send] + 1) % p).all()
    assert (t.peer[~send] == (t.part[~send] - 1) % p).all()
    assert (t.count == 1).all()
