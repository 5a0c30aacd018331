"""Where a program runs: the rules of each runtime, and bounded buffering as dependencies.

A :class:`Target` names a runtime and its protocol. The ``live`` target is commflow's own
runtime: a send never blocks (messages are buffered without bound). The MSCCL-family targets
are GPU runtimes that read MSCCL XML: a connection ``(src, dst, channel)`` holds ``slots``
buffer slots (``NCCL_STEPS`` = 8), and a message takes the slots its bytes fill, in whole
slices: Simple sends 1 MiB slices of 2 steps, and a full chunk (``MSCCL_CHUNKSTEPS`` = 4
steps, 2 MiB) takes 4, so two full chunks are in flight but four small messages; LL and LL128
take one step per 32 KiB / 562.5 KB chunk. A step's ``cnt`` chunks go as one message, or
as several where the kernel cuts them (:meth:`Target.chunks_per_message`). Limits
of the runtimes' XML parsers and kernels are fields too (docs/ir.md, "Targets").

Bounded buffering is proven by the same machinery as everything else: :func:`bounded`
returns the program with one extra dependency per send that must wait for room, so the
verifier's deadlock check and the simulator's sweep honour the slots unchanged.

- A send of message ``k`` on a connection completes once the messages before it fit: with
  ``m`` the slots of each message, it waits for the receive of message ``j``, the first whose
  draining leaves ``m[j+1] + ... + m[k] <= slots``.
- A message larger than the whole buffer streams through it: its send completes only once
  the receiver has reached that receive (the receive's channel predecessor and its explicit
  dependencies have completed), a rendezvous.

Without a size, slots are counted at the largest chunk a runtime uses (large sizes), the worst
case: a program proven so cannot hang at any size. Given the largest size it will run at (an
exported file's ``maxBytes``), chunks are counted at that size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from commflow.collectives import Collective
from commflow.errors import ProgramError
from commflow.ir.matching import match_transfers
from commflow.ir.program import Program
from commflow.ir.step import Op
from commflow.ir.transform import with_deps

PROTOCOLS = ("Simple", "LL", "LL128")
"""NCCL protocols an MSCCL algorithm may name."""

_NAMES_MSCCL = MappingProxyType({
    Collective.ALLREDUCE: "allreduce",
    Collective.ALLGATHER: "allgather",
    Collective.REDUCESCATTER: "reduce_scatter",
    Collective.ALLTOALL: "alltoall",
    Collective.BROADCAST: "broadcast",
    Collective.REDUCE: "reduce",
})
_NAMES_EXECUTOR = MappingProxyType({
    Collective.ALLREDUCE: "allreduce",
    Collective.ALLGATHER: "allgather",
    Collective.REDUCESCATTER: "reducescatter",
    Collective.ALLTOALL: "alltoall",
    Collective.BROADCAST: "broadcast",
    Collective.REDUCE: "reduce",
    Collective.GATHER: "gather",
    Collective.SCATTER: "scatter",
})


@dataclass(frozen=True, kw_only=True)
class Target:
    """A runtime that executes programs, and the rules a program must follow there."""

    name: str
    """``live``, ``msccl``, ``msccl-executor`` or ``rccl``."""
    protocol: str = "Simple"
    """NCCL protocol (``Simple``, ``LL``, ``LL128``); ignored by ``live``."""
    slots: int | None = None
    """Buffer slots per connection; ``None``: unbounded (a send never blocks)."""
    slots_per_chunk: int = 1
    """Slots one full chunk takes."""
    slot_bytes: float | None = None
    """Bytes one slot carries; a smaller chunk takes fewer slots (``None``: always
    :attr:`slots_per_chunk`)."""
    slots_per_slice: int = 1
    """Slots a chunk takes at least (NCCL sends a chunk in slices of this many steps)."""
    collective_names: Mapping[Collective, str] = field(default_factory=dict)
    """The XML ``coll`` name of each collective the runtime runs (empty for ``live``)."""
    max_steps_per_threadblock: int | None = None
    """Steps (``nop`` included) one ``<tb>`` may hold."""
    max_threadblocks: int | None = None
    """Threadblocks per rank."""
    max_channels: int | None = None
    """MSCCL channels (``chan`` below this)."""
    max_children: int | None = None
    """Child elements one XML element may hold (the parsers' fixed arrays)."""
    max_nodes: int | None = None
    """XML elements the parser keeps (its fixed node array)."""
    nodes_per_rank: bool = False
    """Whether :attr:`max_nodes` counts the ``<algo>``, every ``<gpu>`` and only the loading
    rank's ``<tb>`` and ``<step>`` elements (RCCL, msccl-executor: the parser skips other
    ranks' threadblocks) rather than every element of the file (MSCCL 2.12)."""
    max_depid: int | None = None
    """Highest threadblock a step may depend on (``depid`` is a signed 8-bit integer)."""
    max_count: int | None = None
    """Largest ``cnt`` of one step."""
    max_offset: int | None = None
    """Largest ``srcoff``/``dstoff`` (the runtimes keep them in signed 16-bit fields)."""
    chunk_bytes: float | None = None
    """Most bytes one chunk carries in one loop of the kernel (NCCL's per-protocol step size
    times MSCCL_CHUNKSTEPS for Simple); a larger chunk runs in several loops
    (:func:`~commflow.ir.transform.repeat`). ``None``: one pass."""

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ProgramError(
                f"unknown protocol {self.protocol!r}; use one of {', '.join(PROTOCOLS)}")
        if self.slots is not None and (self.slots < 1 or self.slots_per_chunk < 1):
            raise ProgramError("a target's slots and slots_per_chunk must be >= 1")

    @property
    def bounded(self) -> bool:
        """Whether sends can block for want of buffer slots."""
        return self.slots is not None

    def chunks_per_message(self, chunk_bytes: float) -> int | None:
        """Most chunks of ``chunk_bytes`` bytes (a whole chunk, before loops) one message
        of a step carries: MSCCL's ``mscclMaxAllowedCount`` (``mscclSetupCount``: the bytes
        of a loop's chunk, :attr:`chunk_bytes`, over the whole chunk's, at least 1 and below
        ``MSCCL_MAX_COUNT``); the kernel cuts a step of more ``cnt`` into messages of this
        many (:func:`~commflow.ir.transform.split_messages`). ``None`` where a step always
        goes as one message (``live``)."""
        if self.chunk_bytes is None:
            return None
        most = max(1, int(self.chunk_bytes // max(1, math.ceil(chunk_bytes))))
        return most if self.max_count is None else min(most, self.max_count - 1)

    def slots_for(self, counts: np.ndarray, chunk_bytes: float | None = None) -> np.ndarray:
        """Slots a message of ``counts`` chunks of ``chunk_bytes`` bytes takes (``None``: full
        chunks, the worst case): the whole slices of :attr:`slots_per_slice` slots of
        :attr:`slot_bytes` each that its bytes fill (the kernel sends a step's chunks as one
        message), ``counts * slots_per_chunk`` without a slot size."""
        counts = np.asarray(counts, dtype=np.int64)
        if self.slot_bytes is None or (chunk_bytes is None and self.chunk_bytes is None):
            return counts * self.slots_per_chunk
        size = self.chunk_bytes if chunk_bytes is None else min(chunk_bytes,
                                                                self.chunk_bytes or math.inf)
        per_slice = self.slot_bytes * self.slots_per_slice
        slices = np.maximum(1, np.ceil(counts * max(size, 1.0) / per_slice - 1e-9))
        return slices.astype(np.int64) * self.slots_per_slice

    def describe(self) -> str:
        """``msccl (Simple, 8 slots per connection, 4 per chunk)``, or ``live (unbounded
        buffering)``."""
        if not self.bounded:
            return f"{self.name} (unbounded buffering)"
        return (f"{self.name} ({self.protocol}, {self.slots} slots per connection, "
                f"{self.slots_per_chunk} per chunk)")


_STEP_BYTES = {"Simple": (4 << 20) / 8, "LL": (1 << 19) / 8 / 2, "LL128": 4915200 / 8 * 120 / 128}
"""Bytes of data one buffer slot (an NCCL step) carries: NCCL's default buffer per protocol
(Simple 4 MiB, LL 512 KiB with half of it flags, LL128 4.69 MB with 8 of 128 bytes flags)
over its 8 steps. A chunk is MSCCL_CHUNKSTEPS = 4 steps for Simple (2 MiB per loop), sent in
slices of MSCCL_SLICESTEPS = 2 steps; one step for LL and LL128 (32 KiB, 562.5 KB)."""


def _msccl_family(name: str, protocol: str) -> Target:
    simple = protocol == "Simple"
    common = {"name": name, "protocol": protocol, "slots": 8,
              "slots_per_chunk": 4 if simple else 1, "slot_bytes": _STEP_BYTES[protocol],
              "slots_per_slice": 2 if simple else 1, "max_channels": 32,
              "max_children": 1024, "max_nodes": 4096, "max_depid": 127, "max_count": 72,
              "max_offset": 32767,
              "chunk_bytes": _STEP_BYTES[protocol] * (4 if simple else 1)}
    if name == "msccl":
        return Target(**common, collective_names=_NAMES_MSCCL, max_steps_per_threadblock=256,
                      max_threadblocks=216)
    return Target(**common, collective_names=_NAMES_EXECUTOR, max_steps_per_threadblock=64,
                  max_threadblocks=64 if name == "rccl" else 1024, nodes_per_rank=True)


TARGETS = ("live", "msccl", "msccl-executor", "rccl")
"""Names :func:`get_target` accepts."""


def get_target(target: Target | str | None = None, *, protocol: str = "Simple") -> Target:
    """The :class:`Target` named ``target`` (``None``: ``live``), with ``protocol``.

    Raises ``ProgramError`` naming the known targets for an unknown name.
    """
    if isinstance(target, Target):
        return target
    name = "live" if target is None else str(target)
    if protocol not in PROTOCOLS:
        raise ProgramError(f"unknown protocol {protocol!r}; use one of {', '.join(PROTOCOLS)}")
    if name == "live":
        return Target(name="live", protocol=protocol)
    if name in TARGETS:
        return _msccl_family(name, protocol)
    raise ProgramError(f"unknown target {name!r}; use one of {', '.join(TARGETS)}")


def bounded(program: Program, target: Target, *, chunk_bytes: float | None = None,
            fused: np.ndarray | None = None) -> Program:
    """``program`` with the dependencies bounded buffering adds on ``target`` (see the module
    docstring); ``program`` itself when the target buffers without bound. Chunks of
    ``chunk_bytes`` bytes take :meth:`Target.slots_for` slots (``None``: full chunks, the
    worst case).

    ``fused`` lists sends (global step indices) that run fused with the receive just before
    them in their channel (MSCCL's ``rcs``/``rrcs``): such a receive completes only once its
    send has room, so it takes the send's waits too. The extra dependencies may cross
    participants: the result is for verification and simulation, not for saving.
    """
    if not target.bounded:
        return program
    t = program.table
    sends = np.flatnonzero(t.op == Op.SEND)
    if not len(sends):
        return program
    partner = match_transfers(program, mirror=True)
    nparts = np.int64(len(program.participants))
    nchan = np.int64(int(t.chan.max()) + 1)
    key = (t.part[sends].astype(np.int64) * nparts + t.peer[sends]) * nchan + t.chan[sends]
    sends = sends[np.argsort(key, kind="stable")]
    key = np.sort(key, kind="stable")
    size = target.slots_for(t.count[sends], chunk_bytes)
    total = np.cumsum(size)
    first = np.r_[0, np.flatnonzero(np.diff(key)) + 1]
    base = np.repeat(total[first] - size[first], np.diff(np.r_[first, len(key)]))
    waits = total - base > target.slots
    drained = np.searchsorted(total, total - target.slots, side="left")
    rendezvous = waits & (drained == np.arange(len(sends)))
    queued = waits & ~rendezvous
    owners = [sends[queued]]
    deps = [partner[sends[drained[queued]]]]
    # a rendezvous send waits for what its receive waits for, the message aside
    held, recvs = sends[rendezvous], partner[sends[rendezvous]]
    later = t.position[recvs] > 0
    owners.append(held[later])
    deps.append(recvs[later] - 1)
    ndeps = t.dep_ptr[recvs + 1] - t.dep_ptr[recvs]
    within = np.arange(int(ndeps.sum())) - np.repeat(np.cumsum(ndeps) - ndeps, ndeps)
    owners.append(np.repeat(held, ndeps))
    deps.append(t.dep_idx[np.repeat(t.dep_ptr[recvs], ndeps) + within])
    owners, deps = np.concatenate(owners), np.concatenate(deps)
    if fused is not None and len(fused):
        joint = np.isin(owners, fused)
        owners = np.concatenate((owners, owners[joint] - 1))
        deps = np.concatenate((deps, deps[joint]))
    return with_deps(program, owners, deps) if len(owners) else program
