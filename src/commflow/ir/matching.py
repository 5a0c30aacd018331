"""Pairing of sends with receives: FIFO per connection ``(src, dst, channel)``."""

from __future__ import annotations

import numpy as np

from commflow.errors import VerificationError
from commflow.ir.program import Program
from commflow.ir.step import Op


def match_transfers(program: Program) -> np.ndarray:
    """For every step, the global index of the send it receives from (-1 for non-receives).

    Raises ``VerificationError`` naming the connection when sends and receives do not pair up
    (different numbers of messages, or a message received with a different chunk count).
    """
    t = program.table
    n = len(t)
    is_send = t.op == Op.SEND
    is_recv = (t.op == Op.RECV) | (t.op == Op.RECV_REDUCE)
    send = np.flatnonzero(is_send)
    recv = np.flatnonzero(is_recv)
    nparts = len(program.participants)
    nchan = int(t.chan.max()) + 1 if n else 1
    wide = nparts * nparts * nchan >= np.iinfo(np.int32).max
    kind = np.int64 if wide else np.int32

    def key(src: np.ndarray, dst: np.ndarray, chan: np.ndarray) -> np.ndarray:
        return (src.astype(kind) * nparts + dst) * nchan + chan

    # steps are stored in channel order, so a stable sort by connection keeps FIFO order
    # (and is nearly linear: most programs list a connection's messages together)
    ks = key(t.part[send], t.peer[send], t.chan[send])
    kr = key(t.peer[recv], t.part[recv], t.chan[recv])
    order_s = np.argsort(ks, kind="stable")
    order_r = np.argsort(kr, kind="stable")
    send, ks = send[order_s], ks[order_s]
    recv, kr = recv[order_r], kr[order_r]
    if len(send) != len(recv) or not np.array_equal(ks, kr):
        _explain_mismatch(program, ks, kr, np.int64(nparts), np.int64(nchan))
    bad = np.flatnonzero(t.count[send] != t.count[recv])
    if len(bad):
        s, r = int(send[bad[0]]), int(recv[bad[0]])
        part, chan, pos = program.where(r)
        raise VerificationError(
            f"receives {t.count[r]} chunk(s) from rank {t.part[s]} whose matching send "
            f"(its step {program.where(s)[2]}) carries {t.count[s]}",
            rank=part, channel=chan, step=pos)
    matched = np.full(n, -1, dtype=np.int64)
    matched[recv] = send
    return matched


def _explain_mismatch(program: Program, ks: np.ndarray, kr: np.ndarray, nparts: np.int64,
                      nchan: np.int64) -> None:
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
                rank=src, channel=chan)
    raise AssertionError("unreachable: keys differ but counts agree")
