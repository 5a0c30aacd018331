"""The step vocabulary of the IR: operations, buffers, chunk references and the step view."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Op(IntEnum):
    """What a step does.

    - ``SEND``: send ``src`` chunks to ``peer``.
    - ``RECV``: receive from ``peer`` into ``dst``.
    - ``RECV_REDUCE``: receive from ``peer``, reduce with the local ``src``, write ``dst``.
    - ``COPY``: local copy ``src -> dst``.
    - ``REDUCE``: local ``dst = dst (op) src``.
    """

    SEND = 0
    RECV = 1
    RECV_REDUCE = 2
    COPY = 3
    REDUCE = 4

    @property
    def receives(self) -> bool:
        """Whether the step takes a message from a peer."""
        return self in (Op.RECV, Op.RECV_REDUCE)

    @property
    def communicates(self) -> bool:
        """Whether the step has a peer."""
        return self in (Op.SEND, Op.RECV, Op.RECV_REDUCE)

    @property
    def reads_src(self) -> bool:
        """Whether ``src`` is read."""
        return self in (Op.SEND, Op.RECV_REDUCE, Op.COPY, Op.REDUCE)

    @property
    def writes_dst(self) -> bool:
        """Whether ``dst`` is written."""
        return self is not Op.SEND


class Buffer(IntEnum):
    """A participant's buffers."""

    INPUT = 0
    OUTPUT = 1
    SCRATCH = 2

    @property
    def label(self) -> str:
        """Lower-case name (``"input"``)."""
        return self.name.lower()


class ParticipantKind(IntEnum):
    """What executes a participant's channels: a compute rank or an in-network switch."""

    RANK = 0
    SWITCH = 1


@dataclass(frozen=True)
class Ref:
    """``count`` contiguous chunks of ``buffer`` starting at chunk ``index``."""

    buffer: Buffer
    index: int
    count: int = 1

    def __post_init__(self) -> None:
        if self.index < 0 or self.count < 1:
            raise ValueError(f"bad chunk reference {self}: index >= 0 and count >= 1 required")


def inp(index: int, count: int = 1) -> Ref:
    """Reference to input chunks."""
    return Ref(Buffer.INPUT, index, count)


def out(index: int, count: int = 1) -> Ref:
    """Reference to output chunks."""
    return Ref(Buffer.OUTPUT, index, count)


def scr(index: int, count: int = 1) -> Ref:
    """Reference to scratch chunks."""
    return Ref(Buffer.SCRATCH, index, count)


@dataclass(frozen=True)
class Step:
    """One step of one channel of one participant, as plain data.

    ``deps`` are ``(channel, position)`` pairs on the same participant that must complete
    before this step starts (in addition to the previous step of its own channel).
    """

    op: Op
    peer: int | None
    src: Ref | None
    dst: Ref | None
    deps: tuple[tuple[int, int], ...] = ()

    @property
    def count(self) -> int:
        """Chunks moved by the step."""
        ref = self.src if self.src is not None else self.dst
        assert ref is not None
        return ref.count
