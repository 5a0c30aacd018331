"""The wire format: a fixed binary header in front of every fragment, and the signature of a
collective call. Nothing is pickled; every received header is validated before use."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from commflow.errors import CommflowError
from commflow.runtime.errors import CommMismatchError, CommProtocolError

MAGIC = 0xC0FF10E5
VERSION = 1

HEADER = np.dtype([
    ("magic", "<u4"), ("version", "<u2"), ("kind", "<u2"),
    ("seq", "<u8"), ("signature", "<u8"),
    ("channel", "<u4"), ("nbytes", "<u4"),
    ("offset", "<u8"), ("total", "<u8"),
    ("source", "<u4"), ("comm", "<u4"),
    ("checksum", "<u8"),
])
"""Fragment header: 64 bytes, little-endian. ``checksum`` is 0, or :data:`CHECKSUMMED` plus
the CRC-32 of the fragment's payload when the sender computes checksums."""

HEADER_BYTES = HEADER.itemsize
assert HEADER_BYTES == 64

KIND_DATA = 1

CHECKSUMMED = 1 << 32
"""Set in a header's ``checksum`` field when it carries the payload's CRC-32."""

CHECKSUM_ENV = "COMMFLOW_CHECKSUM"
"""Environment variable turning per-message checksums on (``1``) for every transport."""


@dataclass(frozen=True)
class Signature:
    """What every rank must agree on for one collective call."""

    op: str
    collective: str
    dtype: str
    nbytes: int
    reduce_op: str
    root: int
    algorithm: str

    @cached_property
    def digest(self) -> int:
        """64-bit digest carried in every header."""
        text = "|".join(map(str, (self.op, self.collective, self.dtype, self.nbytes,
                                  self.reduce_op, self.root, self.algorithm))).encode()
        return zlib.crc32(text) << 32 | zlib.adler32(text)

    def describe(self) -> str:
        """Human-readable form for error messages."""
        return (f"{self.collective}({self.nbytes} B of {self.dtype}, op={self.reduce_op}, "
                f"root={self.root}, algo={self.algorithm})")


def make_header(view: np.ndarray, *, seq: int, signature: int, comm: int, channel: int,
                nbytes: int, offset: int, total: int, source: int, checksum: int = 0) -> None:
    """Fill the 64-byte ``view`` (uint8) with a data-fragment header (``checksum``: 0, or
    :func:`payload_checksum` of the payload)."""
    h = view.view(HEADER)[0]
    h["magic"], h["version"], h["kind"] = MAGIC, VERSION, KIND_DATA
    h["seq"], h["signature"], h["comm"], h["channel"] = seq, signature, comm, channel
    h["nbytes"], h["offset"], h["total"], h["source"] = nbytes, offset, total, source
    h["checksum"] = checksum


def checksum_from_env(env: Mapping[str, str]) -> bool:
    """Whether ``COMMFLOW_CHECKSUM`` in ``env`` turns checksums on (``1``/``true``/``yes``;
    unset, ``0``, ``false``, ``no``: off). Raises ``CommflowError`` on another value."""
    text = env.get(CHECKSUM_ENV, "0").strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise CommflowError(f"{CHECKSUM_ENV}={env[CHECKSUM_ENV]!r}: use 1 (on) or 0 (off)")


def payload_checksum(payload: np.ndarray) -> int:
    """The ``checksum`` header field for ``payload`` (contiguous bytes): its CRC-32 with
    :data:`CHECKSUMMED` set."""
    return zlib.crc32(payload) | CHECKSUMMED


def check_payload(header: np.void, payload: np.ndarray, *, required: bool, what: str,
                  peer: int, transport: str) -> None:
    """Verify a received fragment's payload against its header's checksum, if it carries one.

    ``what`` names the operation and this rank (``"allreduce #3 on rank 0"``), ``peer`` the
    sender. Raises ``CommProtocolError`` when the payload does not match (corrupted in
    transit), and ``CommMismatchError`` when ``required`` (this rank checks) but the sender
    sent none (it runs without checksums)."""
    field = int(header["checksum"])
    if not field & CHECKSUMMED:
        if required:
            raise CommMismatchError(
                f"{what}: the message from rank {peer} carries no checksum, but this rank "
                f"checks them: set {CHECKSUM_ENV}=1 (or init(checksum=True)) on every rank")
        return
    got = zlib.crc32(payload)
    if got != field & 0xFFFF_FFFF:
        offset = int(header["offset"])
        raise CommProtocolError(
            f"{what}: the message from rank {peer} ({transport}; bytes {offset}.."
            f"{offset + len(payload)} of {int(header['total'])}) fails its checksum (CRC-32 "
            f"0x{got:08x}, sent 0x{field & 0xFFFF_FFFF:08x}): the payload was corrupted in "
            f"transit, so the operation stops rather than return a wrong result; rerun, and if "
            f"it repeats check the host's memory (ECC errors in dmesg) or the network link")


def check_header(header: np.void, *, where: str, capacity: int, source: int) -> None:
    """Validate a received header (magic, version, kind, sizes within ``capacity``, sender).

    Raises ``CommProtocolError`` naming ``where`` (e.g. "rank 1 <- rank 0").
    """
    if header["magic"] != MAGIC:
        raise CommProtocolError(f"{where}: bad magic 0x{int(header['magic']):08x} in a message "
                                f"header: corrupted transport or a foreign writer")
    if header["version"] != VERSION or header["kind"] != KIND_DATA:
        raise CommProtocolError(f"{where}: unsupported header version {int(header['version'])} "
                                f"kind {int(header['kind'])}: mixed commflow versions?")
    if header["nbytes"] > capacity or header["offset"] + header["nbytes"] > header["total"]:
        raise CommProtocolError(f"{where}: header sizes out of bounds (fragment "
                                f"{int(header['nbytes'])} B at {int(header['offset'])} of "
                                f"{int(header['total'])} B, slot capacity {capacity} B)")
    if header["source"] != source:
        raise CommProtocolError(f"{where}: header claims sender {int(header['source'])}")


def check_signature(header: np.void, *, seq: int, signature: Signature, where: str) -> None:
    """Raise ``CommMismatchError`` unless the fragment belongs to this call."""
    if header["seq"] != seq or header["signature"] != signature.digest:
        raise CommMismatchError(
            f"{where}: operation #{seq} {signature.describe()} received a message of "
            f"operation #{int(header['seq'])} with a different signature: every rank must call "
            f"the same collectives in the same order with the same size, dtype, op and root")
