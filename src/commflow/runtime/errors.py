"""Errors raised by the runtime; all are :class:`~commflow.errors.CommflowError`."""

from __future__ import annotations

from commflow.errors import CommflowError


class CommError(CommflowError):
    """A collective or point-to-point operation failed on this rank."""


class CommTimeoutError(CommError):
    """A wait passed its deadline: names the operation, its sequence number and the peers
    not heard from."""

    def __init__(self, message: str, *, op: str, seq: int, peers: tuple[int, ...]) -> None:
        super().__init__(message)
        self.op = op
        self.seq = seq
        self.peers = peers


class CommMismatchError(CommError):
    """Ranks called different operations (collective, size, dtype, op or root) in the same
    sequence slot."""


class CommProtocolError(CommError):
    """A message failed validation (bad magic, version, or sizes out of bounds)."""


class CommAbortedError(CommError):
    """Another rank failed and aborted the communicator; the message names it and why."""


class CrossMemoryError(CommError):
    """The single-copy fast path (``shm:copy=cma``) could not read a peer's memory (the
    kernel refused ``process_vm_readv``): names the operation, both ranks and what to do."""


class FlightRecordError(CommflowError):
    """A flight record file is unreadable or malformed, or records contradict each other."""
