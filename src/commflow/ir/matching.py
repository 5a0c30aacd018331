"""Pairing of sends with receives: FIFO per connection ``(src, dst, channel)``."""

from __future__ import annotations

import numpy as np

from commflow.errors import VerificationError
from commflow.ir.program import Program
from commflow.ir.step import Op

_KIND = np.zeros(max(Op) + 1, dtype=np.int8)
"""Per op, the ``kind`` code of :func:`commflow.ir.matching_kernel.match` (its ``SEND`` = 1,
``RECV`` = 2; the kernel module is imported on first use, as it loads numba)."""
_KIND[Op.SEND] = 1
_KIND[[Op.RECV, Op.RECV_REDUCE]] = 2


def match_transfers(
    program: Program, *, mirror: bool = False, dtype: type = np.int64
) -> np.ndarray:
    """For every step, the global index of the send it receives from (-1 for non-receives);
    with ``mirror``, also for every send the global index of its receive. ``dtype``: the
    integer type of the result (``np.int32`` halves its memory when the program has fewer
    than 2**31 steps).

    Raises ``VerificationError`` naming the connection when sends and receives do not pair up
    (different numbers of messages, or a message received with a different chunk count).
    """
    from commflow.ir.matching_kernel import match

    t = program.table
    nparts = len(program.participants)
    matched = np.full(len(t), -1, dtype=dtype)
    kind = _KIND[t.op]
    if not match(t.part, t.chan, t.peer, t.count, kind, t.channel_starts, nparts, matched, mirror):
        _explain_mismatch(program)
    return matched


def _explain_mismatch(program: Program) -> None:
    """Raise ``VerificationError`` for the first connection, in ``(src, dst, channel)``
    order, whose sends and receives do not pair up."""
    t = program.table
    send = np.flatnonzero(t.op == Op.SEND)
    recv = np.flatnonzero((t.op == Op.RECV) | (t.op == Op.RECV_REDUCE))
    nparts = np.int64(len(program.participants))
    nchan = np.int64(int(t.chan.max()) + 1 if len(t) else 1)
    ks = (t.part[send] * nparts + t.peer[send]) * nchan + t.chan[send]
    kr = (t.peer[recv] * nparts + t.part[recv]) * nchan + t.chan[recv]
    order_s, order_r = np.argsort(ks, kind="stable"), np.argsort(kr, kind="stable")
    send, ks, recv, kr = send[order_s], ks[order_s], recv[order_r], kr[order_r]
    if len(send) == len(recv) and np.array_equal(ks, kr):
        bad = np.flatnonzero(t.count[send] != t.count[recv])
        s, r = int(send[bad[0]]), int(recv[bad[0]])
        part, chan, pos = program.where(r)
        raise VerificationError(
            f"receives {t.count[r]} chunk(s) from rank {t.part[s]} whose matching send "
            f"(its step {program.where(s)[2]}) carries {t.count[s]}",
            rank=part,
            channel=chan,
            step=pos,
        )
    us, cs = np.unique(ks, return_counts=True)
    ur, cr = np.unique(kr, return_counts=True)
    sends = dict(zip(us.tolist(), cs.tolist(), strict=True))
    recvs = dict(zip(ur.tolist(), cr.tolist(), strict=True))
    for k in sorted(set(sends) | set(recvs)):
        if sends.get(k, 0) != recvs.get(k, 0):
            src_dst, chan = divmod(k, int(nchan))
            src, dst = divmod(src_dst, int(nparts))
            raise VerificationError(
                f"mismatched send/recv: rank {src} sends {sends.get(k, 0)} message(s) to rank "
                f"{dst} on channel {chan}, but rank {dst} receives {recvs.get(k, 0)} from it",
                rank=src,
                channel=chan,
            )
    raise AssertionError("unreachable: keys differ but counts agree")
