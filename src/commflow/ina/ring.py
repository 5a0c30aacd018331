"""End-host ring allreduce over lossy UDP: the baseline the switch is measured against, and
ATP's end-host aggregation without a switch.

Ring reduce-scatter then allgather (``2 (n-1)`` steps, chunk ``(r - s) mod n`` sent to the right
neighbour at step ``s``, as in :mod:`commflow.algorithms.ring`), carried in datagrams of an
18-byte header (magic ``CFRG``, version, kind, step, call, sequence number, count; network byte
order) and ``count`` big-endian values of the array's precision (float32 or float64, as a
float32 NCCL ring sends). Reliability: every DATA packet is acknowledged; a sender keeps at most
``window`` unacknowledged packets and resends one after the retransmission timeout (the
worker's adaptive one); a receiver takes each packet once (duplicates are acknowledged again,
not added) and applies a packet only once its own sends have reached the packet's step, so a
neighbour running ahead cannot overwrite a chunk still to be sent. A rank starts sending step
``s + 1`` once it holds all of step ``s``. At the end each rank tells its right neighbour
``DONE`` (repeated until acknowledged) and lingers until its left one has done the same, or has
been silent for twice the largest timeout, so a lost last ACK is still answered. Partial sums
are added in float64 and sent in the wire precision, in ring order.
"""

from __future__ import annotations

import heapq
import socket
import struct
import time

import numpy as np

from commflow.ina._common import Rto, WorkerStats
from commflow.ina.faults import Faults
from commflow.ina.protocol import InaError, InaTimeoutError

RING = struct.Struct("!4sBBHIIH")
_MAGIC, _VERSION = b"CFRG", 1
_DATA, _ACK, _DONE, _DONEACK = 1, 2, 3, 4
Address = tuple[str, int]


def udp_ring_allreduce(array: np.ndarray, sock: socket.socket, peers: list[Address], *,
                       rank: int, call: int = 0, values: int = 1024, window: int = 64,
                       timeout: float = 30.0, faults: Faults | None = None,
                       stats: WorkerStats | None = None) -> np.ndarray:
    """The sum of ``array`` over the ranks whose UDP addresses are ``peers`` (``sock`` is
    bound to ``peers[rank]``); ``call`` tells consecutive calls apart (increase it per call).
    ``faults`` injects loss on this rank's sends; ``stats`` counts sends and retransmissions.
    Raises :class:`InaTimeoutError` after ``timeout`` seconds without progress."""
    x = np.asarray(array)
    n = len(peers)
    if not 0 <= rank < n or values < 1 or window < 1:
        raise InaError(f"udp ring rank {rank}: need 0 <= rank < {n} peers, values and window "
                       ">= 1")
    buf = x.astype(np.float64).reshape(-1)
    wire = np.dtype(">f4") if x.dtype == np.float32 else np.dtype(">f8")
    if n == 1:
        return buf.astype(x.dtype).reshape(x.shape)
    faults, stats = faults or Faults(), stats or WorkerStats()
    right, left = peers[(rank + 1) % n], peers[(rank - 1) % n]
    bounds = np.linspace(0, buf.size, n + 1).astype(np.int64)
    nsteps = 2 * (n - 1)

    def chunk(s: int, sending: bool) -> int:
        c = rank - s - (0 if sending else 1) if s < n - 1 else rank + 1 - (s - n + 1) - (
            0 if sending else 1)
        return c % n

    def packets(c: int) -> int:
        return -(-int(bounds[c + 1] - bounds[c]) // values)

    got = [np.zeros(packets(chunk(s, False)), bool) for s in range(nsteps)]
    have = [int(g.size) == 0 for g in got]
    rto = Rto(0.05, 0.02, 1.0)
    unacked: dict[tuple[int, int], tuple[bytes, float, bool]] = {}
    timers: list[tuple[float, int, int]] = []
    send_step, next_seq = 0, 0
    done_left, done_right, done_sent = False, False, 0.0
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)

    def send(data: bytes, addr: Address) -> None:
        stats.sent += 1
        try:
            faults.sendto(sock, data, addr)
        except OSError:
            stats.send_errors += 1

    def data_packet(s: int, seq: int) -> bytes:
        lo = int(bounds[chunk(s, True)]) + seq * values
        hi = min(lo + values, int(bounds[chunk(s, True) + 1]))
        return RING.pack(_MAGIC, _VERSION, _DATA, s, call, seq, hi - lo) + buf[lo:hi].astype(
            wire).tobytes()

    early: dict[int, list[tuple[int, np.ndarray]]] = {}
    applied = [0] * nsteps

    def apply() -> None:
        """Add (reduce-scatter) or copy (allgather) the packets received for steps up to the
        one being sent; later ones wait, so a chunk is never overwritten before it is sent."""
        for s in [s for s in early if s <= send_step]:
            for seq, vals in early.pop(s):
                lo = int(bounds[chunk(s, False)]) + seq * values
                if s < n - 1:
                    buf[lo:lo + vals.size] += vals
                else:
                    buf[lo:lo + vals.size] = vals
            applied[s] = int(got[s].sum())
            have[s] = applied[s] == got[s].size

    progress = heard = time.monotonic()
    linger = 2 * rto.hi
    while True:
        now = time.monotonic()
        if early:
            apply()
        while send_step < nsteps and (send_step == 0 or have[send_step - 1]):
            if next_seq < packets(chunk(send_step, True)) and len(unacked) < window:
                pkt = data_packet(send_step, next_seq)
                unacked[send_step, next_seq] = (pkt, now, False)
                heapq.heappush(timers, (now + rto.value, send_step, next_seq))
                send(pkt, right)
                next_seq += 1
            elif next_seq >= packets(chunk(send_step, True)):
                send_step, next_seq = send_step + 1, 0
            else:
                break
        while timers and timers[0][0] <= now:
            _, s, seq = heapq.heappop(timers)
            if (s, seq) in unacked:
                rto.backoff(now)
                pkt = unacked[s, seq][0]
                unacked[s, seq] = (pkt, now, True)
                stats.retransmits += 1
                send(pkt, right)
                heapq.heappush(timers, (now + rto.value, s, seq))
        finished = send_step == nsteps and not unacked and all(have)
        if finished and not done_right and now - done_sent > rto.value:
            send(RING.pack(_MAGIC, _VERSION, _DONE, 0, call, 0, 0), right)
            done_sent = now
        if finished and ((done_left and done_right) or now - heard > linger):
            break
        if now - progress > timeout:
            raise InaTimeoutError(
                f"udp ring rank {rank}: no progress for {timeout:.1f} s at send step "
                f"{send_step}/{nsteps} with {len(unacked)} packets unacknowledged by "
                f"{right[0]}:{right[1]}; a neighbour may have died")
        wait = timers[0][0] - now if timers and not finished else 0.05
        sock.settimeout(max(wait, 1e-4))
        try:
            data, addr = sock.recvfrom(65536)
        except (TimeoutError, ConnectionError):
            continue
        if len(data) < RING.size:
            stats.malformed += 1
            continue
        magic, version, kind, s, c, seq, count = RING.unpack_from(data)
        if magic != _MAGIC or version != _VERSION or len(data) != RING.size + (
                wire.itemsize * count if kind == _DATA else 0):
            stats.malformed += 1
            continue
        now = time.monotonic()
        heard = now if c == call else heard
        if kind == _ACK and c == call and (s, seq) in unacked:
            pkt, sent_at, again = unacked.pop((s, seq))
            if not again:
                rto.sample(now - sent_at)
            progress = now
        elif kind == _DATA and c == call and s < nsteps and seq < got[s].size:
            if not got[s][seq]:
                early.setdefault(s, []).append((seq, np.frombuffer(data, wire, count,
                                                                    RING.size)))
                got[s][seq] = True
                progress = now
            else:
                stats.duplicates += 1
            send(RING.pack(_MAGIC, _VERSION, _ACK, s, call, seq, 0), left)
        elif kind == _DATA and c < call:
            send(RING.pack(_MAGIC, _VERSION, _ACK, s, c, seq, 0), addr)
        elif kind == _DONE and c == call:
            done_left = True
            send(RING.pack(_MAGIC, _VERSION, _DONEACK, 0, call, 0, 0), left)
        elif kind == _DONEACK and c == call:
            done_right = True
        else:
            stats.malformed += 1
    for _ in range(3 if done_left else 0):
        send(RING.pack(_MAGIC, _VERSION, _DONEACK, 0, call, 0, 0), left)
    return buf.astype(x.dtype).reshape(x.shape)
