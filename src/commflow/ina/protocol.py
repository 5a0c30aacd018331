"""Wire format and quantization of the live in-network aggregation protocol (SwitchML-style).

Every datagram is a fixed 34-byte header in network byte order followed by ``count`` int32
values (big-endian); nothing is pickled. Header fields, in order:

=========  =====  ==================================================================
magic      4s     ``b"CFIN"``
version    u8     :data:`VERSION`
kind       u8     a :class:`Kind`
flags      u8     bit 0: the slot's version (which of its two shadow copies)
reason     u8     a :class:`Reason` (``REJECT`` only)
job        u16    job id: slots are granted per job
session    u16    switch-assigned per JOIN..LEAVE session; stale packets carry an old one
worker     u16    sender's rank (``RESULT``/``JOINED``/``LEFT``: the addressee; ``RESULT``
                  sent once to the job's multicast group: :data:`GROUP`)
nworkers   u16    ranks in the job
slot       u16    job-local slot index (``JOIN``: slots wanted; ``JOINED``: slots granted)
count      u16    int32 values in the payload (``JOIN``: the exponents of the array's first
                  blocks; ``JOINED``: values per packet, the payload one exponent per granted
                  slot or none; ``NOSLOT``: the workers' addresses that follow, 4-byte IPv4
                  and port each)
exp        i16    ``DATA``: the sender's exponent of the *next* block on this slot;
                  ``RESULT``: the maximum over the workers (:data:`EMPTY` for all-zero);
                  ``JOIN``: the values per packet its exponents are for (0: none sent)
phase      u32    use number of the slot (0: exponent bootstrap, j >= 1: its j-th block;
                  ``JOIN``: the worker's call id, random per call, the same when repeated)
offset     u64    element offset of the block in the array (``JOIN``: the multicast group
                  the worker takes results on, :func:`group_field`; 0: none)
=========  =====  ==================================================================

Sessions. A worker sends LEAVE once it holds all its results and does not wait for ``LEFT``. A
JOIN of the job with a new call id from a worker of a session all have joined is its next call:
the switch counts it as that worker's LEAVE (the first may have been lost) and holds it until
every worker has left the old session, so no result another worker still needs is freed. A JOIN
that carries the exponents of the first block of every slot the switch grants, for the switch's
values per packet (a worker learns them from an earlier JOINED), lets the switch agree on them
at the barrier: when every worker's JOIN did, JOINED carries the maxima and the stream starts
at phase 1 (no exponent-only phase 0); otherwise JOINED has no payload and phase 0 runs.

Quantization (power-of-two scale per block of ``values`` elements). Every worker's exponent of a
block is ``e = frexp(max |x|)[1]`` (so ``max |x| < 2**e``); the switch returns the maximum ``E``
over workers one block ahead, and each worker sends ``q = rint(x * 2**(Q - E))`` with
``Q = 30 - ceil(log2 n)``, so ``|q| <= 2**Q`` and the sum of ``n`` such integers stays within
``n * 2**Q <= 2**30``: no overflow in int32. The switch adds integers exactly; the worker decodes
``sum(q) * 2**(E - Q)`` exactly in float64. Each worker's rounding is at most half a step, so
per element ``|result - exact| <= n * 2**(E - Q - 1)`` (:func:`error_bound`), a relative error
below ``n * 2**-Q`` of the block's largest magnitude; float32 results add the final cast's half
ulp.
"""

from __future__ import annotations

import enum
import socket
import struct
from typing import NamedTuple

import numpy as np

from commflow.errors import CommflowError

MAGIC = b"CFIN"
VERSION = 2
"""2: JOIN carries a call id and the first block exponents, JOINED their maxima."""
HEADER = struct.Struct("!4sBBBBHHHHHHhIQ")
WIRE = np.dtype(">i4")
PEER = struct.Struct("!4sH")
"""A worker's IPv4 address and port, as ``NOSLOT`` lists them for the end-host fallback."""
EMPTY = -(2**15)
"""The exponent of an all-zero block (smaller than any real one)."""
MAX_VALUES = (65507 - HEADER.size) // 4
"""Largest payload of one UDP datagram, in int32 values."""
MAX_WORKERS = 64
GROUP = 0xFFFF
"""``RESULT`` worker id of a result sent once to the job's multicast group (every worker)."""


class InaError(CommflowError):
    """An in-network aggregation operation failed."""


class InaProtocolError(InaError):
    """A datagram failed validation, or the switch refused one of ours."""


class InaVersionError(InaProtocolError):
    """A commflow ina datagram of another protocol version (``version``: the sender's)."""

    def __init__(self, version: int, message: str = "") -> None:
        super().__init__(message or f"protocol version {version}, this side speaks {VERSION}")
        self.version = version


class InaTimeoutError(InaError):
    """No progress before the deadline (switch down, a worker missing)."""


class InaNoSlotsError(InaError):
    """The switch has no free aggregator slot for this job and no fallback was given."""


class Kind(enum.IntEnum):
    """What a datagram is."""

    DATA = 1
    RESULT = 2
    JOIN = 3
    JOINED = 4
    NOSLOT = 5
    LEAVE = 6
    LEFT = 7
    REJECT = 8


class Reason(enum.IntEnum):
    """Why the switch refused a datagram (sent back in ``REJECT``)."""

    NONE = 0
    WRONG_NWORKERS = 1
    BAD_WORKER = 2
    UNKNOWN_JOB = 3
    BAD_SLOT = 4
    BAD_PHASE = 5
    TOO_MANY_VALUES = 6
    BAD_KIND = 7
    BAD_VERSION = 8


_KINDS = {k.value: k for k in Kind}
_REASONS = {r.value: r for r in Reason}
REASONS = {
    Reason.WRONG_NWORKERS: "the job's number of workers differs from the switch's -n",
    Reason.BAD_WORKER: "worker id is not below the number of workers",
    Reason.UNKNOWN_JOB: "no such job/session on the switch (not joined, or its lease expired)",
    Reason.BAD_SLOT: "slot index is not below the slots granted to the job",
    Reason.BAD_PHASE: "the phase skips ahead of the slot, or its block differs from the other "
                      "workers' (did every rank pass an array of the same size?)",
    Reason.TOO_MANY_VALUES: "more values than the switch's values per packet",
    Reason.BAD_KIND: "a switch only accepts DATA, JOIN and LEAVE",
    Reason.BAD_VERSION: "the switch speaks another protocol version",
}


class Header(NamedTuple):
    """One datagram's header (see the module docstring for the fields); a tuple, cheap to
    make per packet."""

    kind: Kind
    job: int
    session: int = 0
    worker: int = 0
    nworkers: int = 0
    slot: int = 0
    count: int = 0
    exp: int = EMPTY
    phase: int = 0
    offset: int = 0
    flags: int = 0
    reason: Reason = Reason.NONE

    @property
    def ver(self) -> int:
        """The slot version (shadow copy) this datagram belongs to."""
        return self.flags & 1


def pack(h: Header, payload: bytes = b"") -> bytes:
    """The datagram for header ``h`` and ``payload`` (``h.count`` big-endian int32 values)."""
    return HEADER.pack(MAGIC, VERSION, h.kind, h.flags, h.reason, h.job, h.session, h.worker,
                       h.nworkers, h.slot, h.count, h.exp, h.phase, h.offset) + payload


def unpack(data: bytes) -> tuple[Header, memoryview]:
    """Parse and validate a datagram; raises :class:`InaProtocolError` naming what is wrong."""
    if len(data) < HEADER.size:
        raise InaProtocolError(f"datagram of {len(data)} bytes is shorter than the "
                               f"{HEADER.size}-byte header")
    (magic, version, kind, flags, reason, job, session, worker, nworkers, slot, count, exp,
     phase, offset) = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise InaProtocolError(f"bad magic {magic!r} (expected {MAGIC!r}): not a commflow "
                               "ina datagram")
    if version != VERSION:
        raise InaVersionError(version)
    if kind not in _KINDS or reason not in _REASONS:
        raise InaProtocolError(f"unknown kind {kind} or reason {reason}")
    kind = _KINDS[kind]
    payload = memoryview(data)[HEADER.size:]
    size = {Kind.DATA: 4, Kind.RESULT: 4, Kind.JOIN: 4, Kind.NOSLOT: PEER.size}.get(kind, 0)
    if kind is Kind.JOINED:
        if len(payload) not in (0, 4 * slot):
            raise InaProtocolError(f"JOINED datagram: {slot} slots granted but "
                                   f"{len(payload)} payload bytes follow")
    elif len(payload) != size * count:
        raise InaProtocolError(f"{kind.name} datagram: header says {count} values but "
                               f"{len(payload)} payload bytes follow")
    if flags > 1:
        raise InaProtocolError(f"{kind.name} datagram: unknown flags {flags:#x}")
    return Header(kind, job, session, worker, nworkers, slot, count, exp, phase, offset, flags,
                  _REASONS[reason]), payload


def version_notice(data: bytes) -> bytes | None:
    """What the switch answers to ``data``, a datagram of another protocol version: a
    ``REJECT`` (``BAD_VERSION``) in its own version, so that a worker of any version that
    checks the version byte learns both and stops (:class:`InaVersionError`) instead of
    timing out; ``None`` when ``data`` is a ``REJECT`` itself (two switches of different
    versions never answer each other's notices)."""
    if data[5:6] == bytes([Kind.REJECT]):
        return None
    return pack(Header(Kind.REJECT, 0, reason=Reason.BAD_VERSION))


def pack_peers(addrs: list[tuple[str, int]]) -> bytes:
    """The ``NOSLOT`` payload: every worker's address, in rank order."""
    return b"".join(PEER.pack(socket.inet_aton(host), port) for host, port in addrs)


def unpack_peers(payload: memoryview, count: int) -> list[tuple[str, int]]:
    """The workers' addresses of a ``NOSLOT`` payload."""
    return [(socket.inet_ntoa(ip), port) for ip, port in
            (PEER.unpack_from(payload, i * PEER.size) for i in range(count))]


def group_field(group: tuple[str, int] | None) -> int:
    """The ``JOIN`` offset naming a multicast ``group`` (``(address, port)``; 0 for none):
    the IPv4 address in bits 16-47, the port in bits 0-15."""
    if group is None:
        return 0
    return int.from_bytes(socket.inet_aton(group[0]), "big") << 16 | group[1]


def group_address(field: int) -> tuple[str, int] | None:
    """The ``(address, port)`` a ``JOIN`` offset names, or ``None`` unless it is a multicast
    group (224.0.0.0/4) with a port."""
    ip, port = field >> 16, field & 0xFFFF
    if ip >> 28 != 0xE or ip >> 32 or not port:
        return None
    return socket.inet_ntoa(ip.to_bytes(4, "big")), port


def shift(nworkers: int) -> int:
    """``Q = 30 - ceil(log2 nworkers)``: quantized magnitudes stay within ``2**Q``."""
    if not 1 <= nworkers <= MAX_WORKERS:
        raise InaError(f"ina: {nworkers} workers; use 1 to {MAX_WORKERS}")
    return 30 - (nworkers - 1).bit_length()


def exponents(x: np.ndarray, values: int) -> np.ndarray:
    """Per block of ``values`` elements of the 1-D float64 ``x``: ``frexp(max |x|)[1]``, or
    :data:`EMPTY` for an all-zero block (int64)."""
    nblocks = -(-x.size // values)
    padded = np.zeros(nblocks * values)
    padded[:x.size] = np.abs(x)
    absmax = padded.reshape(nblocks, values).max(axis=1)
    e = np.frexp(absmax)[1].astype(np.int64)
    return np.where(absmax > 0, e, EMPTY)


def quantize(block: np.ndarray, exp: int, q: int) -> bytes:
    """The wire payload of a float64 block under the agreed exponent ``exp``."""
    if exp == EMPTY:
        return bytes(4 * block.size)
    return np.rint(np.ldexp(block, q - exp)).astype(WIRE).tobytes()


def dequantize(payload: memoryview, exp: int, q: int) -> np.ndarray:
    """The float64 values of an aggregated payload under exponent ``exp``."""
    ints = np.frombuffer(payload, WIRE).astype(np.float64)
    return ints if exp == EMPTY else np.ldexp(ints, exp - q)


def error_bound(inputs: list[np.ndarray], values: int) -> np.ndarray:
    """Per element, the largest ``|ina sum - exact sum|`` of the workers' ``inputs`` (float64,
    before any float32 cast): ``n * 2**(E - Q - 1)`` with ``E`` the block's agreed exponent."""
    flat = [np.asarray(a, np.float64).reshape(-1) for a in inputs]
    n, size = len(flat), flat[0].size
    e = np.max([exponents(a, values) for a in flat], axis=0)
    per_block = np.where(e == EMPTY, 0.0, n * np.ldexp(1.0, e - shift(n) - 1))
    return np.repeat(per_block, values)[:size]
