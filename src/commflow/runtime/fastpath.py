"""Shared-buffer fast paths for the ranks of one host (``algo="shm"``).

Each rank copies its data into its own staging area in the host's segment and raises a flag;
once every rank's flag is up, rank r reduces block r of every rank's stage in place (own data
first, then the others by rank, so every element is reduced once, in a fixed order) and raises
a second flag; then every rank copies the reduced blocks out (small allreduces, and by
default any allreduce on two ranks, which then wait once per segment: every rank reduces
everything after the first flag, in rank order, so both ranks agree to the bit)
(reduce-scatter: rank r reduces straight into its output; allgather/broadcast: one flag,
then copies out). That is the two-shot reduce-scatter + allgather of the ``direct``
family, with the messages replaced by loads from shared memory: per byte, one copy in, one
read of every stage for the reduction and one copy out. Staging areas are double-buffered: a
half is refilled only after every rank raised a flag for the following segment, i.e.
finished reading the half. Flags carry the operation's sequence number and signature: ranks
that called different operations abort with ``CommMismatchError``.

Applies to the world communicator when all its ranks share one host. In-place calls need no
copy of the input: a segment is staged before any of its output is written, and a rank writes
only the part of its output that the staged segment covers. A rank stages only what its peers
read: a reduce-scatter, and a two-shot allreduce, reduce its own block from its input (in
place: where it lies), an allgather in place leaves its own block where it is.

**Variants.** How a call is cut is a :class:`Variant`: the largest allreduce segment reduced
one-shot (every rank reduces all of it), the bytes staged per round, how long a waiting
rank polls before it yields its CPU, and whether data is staged at all (``copy="cma"``: each
rank reads its peers' buffers with ``process_vm_readv`` instead, :mod:`commflow.runtime.cma`)
and how it is stored into the output (``store="stream"``: non-temporal stores,
:mod:`commflow.runtime.fastpath_output`). ``shm`` runs the defaults; a variant is named
``shm:one_shot=1M:segment=4M`` (fields that differ from the defaults), which ``algo=``
accepts and a tuning table may name for ``auto`` per size, as NCCL's tuner picks a protocol
and channel count per size. The name is part of the call's signature, so ranks that run
different variants fail with ``CommMismatchError``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from functools import cached_property, lru_cache

import numpy as np

from commflow.collectives import Collective
from commflow.errors import AlgorithmError, CommflowError
from commflow.runtime.cma import CrossMemoryPaths
from commflow.runtime.errors import CommMismatchError, CommTimeoutError
from commflow.runtime.fastpath_output import PLAIN, Output
from commflow.runtime.ops import Reducer
from commflow.runtime.protocol import Signature
from commflow.runtime.transport.shm import ABORT_MISMATCH, ShmEndpoint, ShmTransport
from commflow.units import format_size, parse_size

NAME = "shm"
SEGMENT = int(os.environ.get("COMMFLOW_SHM_SEGMENT", 512 << 10))
"""Bytes staged per round: small enough that a segment is still in the caches when the peers
read it (larger messages go through in several rounds)."""
ONE_SHOT = 64 << 10
"""Allreduce segments up to this many bytes are reduced whole by every rank (one flag, no
second pass), in rank order so every rank computes the same result."""
SPIN = ShmTransport.YIELD_AFTER
"""Polls before a waiting rank yields (the shared-memory transport's)."""
COLLECTIVES = (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.ALLGATHER,
               Collective.BROADCAST)
CACHED, STREAM = "cached", "stream"
"""How data is written into the output (:attr:`Variant.store`): plain stores, or
non-temporal ones (:mod:`commflow.runtime._stream_kernels`)."""
STAGE, CMA = "stage", "cma"
"""How data moves (:attr:`Variant.copy`): through the staging areas, or read by each rank
straight from its peers' buffers (:mod:`commflow.runtime.cma`)."""
SUMMARY = ("shared staging buffers: copy in, reduce block r on rank r, copy out "
           "(two-shot RS+AG through memory); one host, world communicator")


@dataclass(frozen=True)
class Variant:
    """How the fast path cuts a call (the defaults: :data:`ONE_SHOT`, :data:`SEGMENT`)."""

    one_shot: int | None = None
    """Allreduce segments of at most this many bytes are reduced whole by every rank (one
    flag); larger ones two-shot (reduce block r on rank r, a second flag, copy out).
    ``None``: :data:`ONE_SHOT` on more than two ranks; two ranks reduce every segment whole
    (one wait per segment), and a threshold given cuts their larger segments in halves too
    (half the arithmetic per rank and 4.5 bytes moved per byte against 5, but two waits per
    segment: on this machine's two cores 0.89-1.04x the whole segments' time in one A/B
    run and 1.15-1.38x in another, so the tuner decides)."""
    segment: int = SEGMENT
    """Bytes staged per round (at most half a rank's staging area is used)."""
    spin: int = SPIN
    """Polls of the peers' flags before a waiting rank yields its CPU between polls (then it
    sleeps on its doorbell). Where the ranks outnumber the CPUs, 0 lets the peers it waits
    for run sooner."""
    copy: str = STAGE
    """``"stage"``: copy in and out of the shared staging areas; ``"cma"``: each rank reads its
    peers' input and output buffers with ``process_vm_readv`` (one copy per byte;
    :mod:`commflow.runtime.cma`; allreduces of at most ``one_shot`` bytes still stage)."""
    store: str = CACHED
    """``"cached"``: plain stores into the output; ``"stream"``: staged data is copied (and
    summed) into the output with non-temporal stores, which do not read the output's lines
    first nor evict the staging areas from the caches (faster into large buffers beyond the
    caches, slower into outputs already cached; :class:`~.fastpath_output.Output`; plain
    stores where :data:`commflow.runtime._stream_kernels.AVAILABLE` is false)."""

    def __post_init__(self) -> None:
        if self.copy not in (STAGE, CMA):
            raise CommflowError(f"fast path variant: copy must be {STAGE!r} or {CMA!r}, got "
                                f"{self.copy!r}")
        if self.store not in (CACHED, STREAM):
            raise CommflowError(f"fast path variant: store must be {CACHED!r} or {STREAM!r}, "
                                f"got {self.store!r}")
        for field in fields(self)[:3]:
            value = getattr(self, field.name)
            if field.name == "one_shot" and value is None:
                continue
            least = 0 if field.name == "spin" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise CommflowError(f"fast path variant: {field.name} must be an integer >= "
                                    f"{least}, got {value!r}")

    @property
    def limit(self) -> int:
        """The one-shot threshold in bytes (:data:`ONE_SHOT` where ``one_shot`` is None)."""
        return ONE_SHOT if self.one_shot is None else self.one_shot

    @cached_property
    def name(self) -> str:
        """``shm`` for the defaults, else ``shm:FIELD=SIZE:...`` with the fields that differ
        (made once per variant: every fast-path call names its variant)."""
        default = Variant()
        parts = [f"{f.name}={_text(getattr(self, f.name))}" for f in fields(self)
                 if getattr(self, f.name) != getattr(default, f.name)]
        return ":".join([NAME, *parts])


def _text(value: int | str) -> str:
    return value if isinstance(value, str) else format_size(value)


DEFAULT = Variant()
"""The variant ``algo="shm"`` runs."""


TUNED = (Variant(segment=256 << 10), *(Variant(segment=s << 20) for s in (1, 2, 4)),
         Variant(one_shot=256 << 10), Variant(one_shot=1 << 20), Variant(spin=0),
         *(Variant(segment=s << 20, spin=0) for s in (1, 2, 4)),
         Variant(one_shot=256 << 10, spin=0), Variant(copy=CMA), Variant(copy=CMA, spin=0),
         Variant(segment=2 << 20, copy=CMA), Variant(store=STREAM))
"""The variants online tuning measures beside the defaults (:func:`variants`)."""


def variants(collective: Collective, cma: bool = True) -> list[str]:
    """The names of the fast path and its :data:`TUNED` variants for ``collective`` (the
    one-shot threshold only for allreduce; without ``copy="cma"`` unless ``cma``: where the
    ranks may not read each other's memory, :func:`commflow.runtime.cma.permitted`, and for
    reduce-scatter, where a single-copy call copies as many bytes as staging: every peer's
    block once, then the reduction; without ``store="stream"`` where the machine cannot
    stream); ``[]`` when the fast path lacks it."""
    if collective not in COLLECTIVES:
        return []
    from commflow.runtime._stream_kernels import AVAILABLE as streams
    cma = cma and collective is not Collective.REDUCESCATTER
    found = [NAME]
    for option in TUNED:
        if option.copy == CMA and not cma or option.store == STREAM and not streams:
            continue
        if collective is not Collective.ALLREDUCE:
            option = Variant(segment=option.segment, spin=option.spin, copy=option.copy,
                             store=option.store)
        if option.name not in found:
            found.append(option.name)
    return found


def is_fast(name: str) -> bool:
    """Whether the algorithm ``name`` is the fast path or one of its variants."""
    return name == NAME or name.startswith(NAME + ":")


@lru_cache(maxsize=256)
def variant(name: str) -> Variant:
    """The :class:`Variant` an algorithm name of the fast path names (``shm``,
    ``shm:segment=2M``, ...). Raises ``AlgorithmError`` for a malformed name or an unknown
    field."""
    head, *parts = name.split(":")
    if head != NAME:
        raise AlgorithmError(f"{name!r} is not a fast path name (shm or shm:FIELD=SIZE:...)")
    known = {f.name for f in fields(Variant)}
    values: dict[str, int | str] = {}
    for part in parts:
        key, sep, text = part.partition("=")
        if not sep or key not in known or key in values:
            raise AlgorithmError(
                f"fast path variant {name!r}: {part!r} is not FIELD=SIZE with a field of "
                f"{', '.join(sorted(known))} (each once)")
        try:
            values[key] = text if key in ("copy", "store") else parse_size(text)
        except CommflowError as error:
            raise AlgorithmError(f"fast path variant {name!r}: {error}") from None
    try:
        return Variant(**values)
    except CommflowError as error:
        raise AlgorithmError(str(error)) from None


@lru_cache(maxsize=1024)
def effective(options: Variant, collective: Collective, staged: int, nranks: int) -> Variant:
    """``options`` with the fields that do not change how a call is cut set to the defaults,
    for a call that stages ``staged`` bytes per rank (reduce-scatter: its whole input): a
    variant that runs a call as ``shm`` would is named ``shm`` for it (the same signature,
    and the compiled small-message path for small allreduces, which waits its own way)."""
    one_shot, segment, copy, store = options.one_shot, options.segment, options.copy, options.store
    allreduce = collective is Collective.ALLREDUCE
    limit = options.limit
    if allreduce and staged <= min(limit, ONE_SHOT):
        return DEFAULT  # one-shot either way
    if copy == CMA and allreduce and staged <= limit:
        copy = STAGE  # one-shot allreduces stage
    if staged <= min(segment, SEGMENT) or copy == CMA and collective not in _CUT:
        segment = SEGMENT  # one segment either way, or a broadcast's single read
    elif copy == STAGE and staged <= segment:
        segment = 1 << (staged - 1).bit_length()  # one staged segment, whichever holds it
    if not allreduce or copy == CMA or nranks > 2 and one_shot == ONE_SHOT:
        one_shot = None  # no one-shot call either way, or the default threshold
    if copy == CMA:
        store = CACHED  # a single-copy read writes the output itself
    if (one_shot, segment, copy, store) == (options.one_shot, options.segment, options.copy,
                                            options.store):
        return options
    return Variant(one_shot, segment, options.spin, copy, store)


_CUT = (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.ALLGATHER)


def _reduce_into(out: np.ndarray, first: np.ndarray, stages: list[np.ndarray],
                 ranks: Iterable[int], where: slice, reduce: Reducer,
                 writer: Output = PLAIN) -> None:
    """``out`` = ``first`` reduced with ``stages[r][where]`` for ``r`` in ``ranks``, in that
    order (``first`` may be ``out``'s own memory); partial results go to
    ``writer.target(out)``, the last reduction into ``out`` through ``writer``."""
    ranks = list(ranks)
    if not ranks:  # no peer: one rank
        if first is not out:
            writer.copy(out, first)
        return
    partial = writer.target(out)
    for r in ranks[:-1]:
        reduce(first, stages[r][where], partial)
        first = partial
    writer.reduce(reduce, first, stages[ranks[-1]][where], out)


class SharedBufferPaths:
    """The fast paths of one rank over its host's staging areas."""

    def __init__(self, endpoint_factory: Callable[[int, Signature, np.dtype], ShmEndpoint],
                 nranks: int, rank: int) -> None:
        self.endpoint_factory = endpoint_factory
        self.n = nranks
        self.me = rank
        self.epoch = 0
        self.segments = 0
        self._views: dict[tuple[int, str], list[np.ndarray]] = {}
        self._scratch: dict[str, np.ndarray] = {}
        self.cma = CrossMemoryPaths(nranks, rank, self.phase)

    def run(self, collective: Collective, send: np.ndarray, recv: np.ndarray, unit: int,
            reduce: Reducer, root: int, *, seq: int, signature: Signature,
            deadline: float, options: Variant = DEFAULT, placed: bool = False) -> None:
        """Run ``collective`` on flat arrays (shapes as the communicator passes them), cut as
        ``options`` says. ``placed``: an in-place call (``calls.in_place``): an allgather's
        input is already its block of the output, a reduce-scatter's output its block of
        the input, so neither is copied there."""
        endpoint = self.endpoint_factory(seq, signature, send.dtype)
        host = endpoint.t.host
        half_bytes = host.layout.stage_bytes // 2
        one_shot = min(options.limit, half_bytes)
        if collective is Collective.ALLREDUCE and 0 < unit * send.dtype.itemsize <= one_shot:
            self.small_allreduce(send, recv, reduce, seq, signature, deadline, endpoint,
                                 options.spin)
            return
        if options.copy == CMA:
            self.cma.run(endpoint, collective, send, recv, unit, reduce, root, seq=seq,
                         signature=signature, deadline=deadline, segment=options.segment,
                         spin=options.spin)
            return
        n, me = self.n, self.me
        others = [r for r in range(n) if r != me]
        per_stage = n if collective is Collective.REDUCESCATTER else 1
        seg = max(1, min(half_bytes, options.segment) // send.dtype.itemsize // per_stage)
        wait = lambda: self.phase(endpoint, seq, signature, deadline, options.spin)  # noqa: E731
        out = self._output(options.store, send.dtype, half_bytes)
        for lo in range(0, max(unit, 1), seg):
            hi = min(unit, lo + seg)
            m = hi - lo
            half = self.segments % 2
            self.segments += 1
            stages = self._stages(host, half, half_bytes, send.dtype)
            mine = stages[me]
            if collective is Collective.ALLREDUCE and n == 2 and (
                    options.one_shot is None or m * send.dtype.itemsize <= one_shot):
                mine[:m] = send[lo:hi]
                wait()
                out.reduce(reduce, stages[0][:m], stages[1][:m], recv[lo:hi])  # in rank order
            elif collective is Collective.ALLREDUCE and m * send.dtype.itemsize <= one_shot:
                mine[:m] = send[lo:hi]
                wait()
                _reduce_into(recv[lo:hi], stages[0][:m], stages, range(1, n), slice(0, m),
                             reduce, out)
            elif collective is Collective.ALLREDUCE:
                bounds = [m * r // n for r in range(n + 1)]
                first, last = bounds[me], bounds[me + 1]
                mine[:first] = send[lo:lo + first]  # the blocks the peers reduce
                mine[last:m] = send[lo + last:hi]
                wait()
                # own block from the input, into the stage for the peers to copy out
                _reduce_into(mine[first:last], send[lo + first:lo + last], stages, others,
                             slice(first, last), reduce)
                wait()
                for r in range(n):
                    a, b = bounds[r], bounds[r + 1]
                    out.copy(recv[lo + a:lo + b], stages[r][a:b])
            elif collective is Collective.REDUCESCATTER:
                for r in others:  # only the peers read a stage's blocks
                    mine[r * m:(r + 1) * m] = send[r * unit + lo:r * unit + hi]
                wait()
                s = slice(me * m, (me + 1) * m)
                dst = recv[lo:hi]
                own = dst if placed else send[me * unit + lo:me * unit + hi]
                _reduce_into(dst, own, stages, others, s, reduce, out)
            elif collective is Collective.ALLGATHER:
                mine[:m] = send[lo:hi]
                wait()
                for r in others if placed else range(n):
                    out.copy(recv[r * unit + lo:r * unit + hi], stages[r][:m])
            else:
                if me == root:
                    mine[:m] = send[lo:hi]
                wait()
                if me != root:
                    out.copy(recv[lo:hi], stages[root][:m])

    def small_allreduce(self, send: np.ndarray, recv: np.ndarray, reduce: Reducer, seq: int,
                        signature: Signature, deadline: float,
                        endpoint: ShmEndpoint | None = None, spin: int = SPIN) -> None:
        """One-shot allreduce of ``send`` (flat, at most half a staging area) into
        ``recv``, reduced from the staged copies in rank order, as the compiled path
        (:mod:`commflow.runtime.lean`) does: every rank gets the same bits whichever path it
        takes (``minimum(0.0, -0.0)`` is not ``minimum(-0.0, 0.0)``)."""
        unit = len(send)
        if endpoint is None:
            endpoint = self.endpoint_factory(seq, signature, send.dtype)
        host = endpoint.t.host
        stages = self._stages(host, self.segments & 1, host.layout.stage_bytes // 2, send.dtype)
        self.segments += 1
        stages[self.me][:unit] = send
        self.phase(endpoint, seq, signature, deadline, spin)
        if self.n == 1:
            recv[...] = stages[0][:unit]
            return
        reduce(stages[0][:unit], stages[1][:unit], recv)
        for r in range(2, self.n):
            reduce(recv, stages[r][:unit], recv)

    def _output(self, store: str, dtype: np.dtype, nbytes: int) -> Output:
        """The writer of a call's output for ``store``, with a scratch segment of ``nbytes``
        (cached per dtype) for streaming."""
        if store != STREAM:
            return PLAIN
        scratch = self._scratch.get(dtype.str)
        if scratch is None or scratch.nbytes < nbytes:
            scratch = self._scratch[dtype.str] = np.empty(nbytes // dtype.itemsize, dtype)
        return Output(scratch)

    def _stages(self, host, half: int, half_bytes: int, dtype: np.dtype) -> list[np.ndarray]:
        """Every rank's staging half ``half`` viewed as ``dtype`` (cached)."""
        key = (half, dtype.str)
        views = self._views.get(key)
        if views is None:
            views = [host.stage[r][half * half_bytes:(half + 1) * half_bytes].view(dtype)
                     for r in range(self.n)]
            self._views[key] = views
        return views

    def phase(self, endpoint: ShmEndpoint, seq: int, signature: Signature,
              deadline: float, spin: int = SPIN) -> None:
        """Raise this rank's flag to the next epoch and wait for every rank's (polling
        ``spin`` times before yielding the CPU)."""
        host = endpoint.t.host
        self.epoch += 1
        digest = signature.digest & 0x7FFF_FFFF_FFFF_FFFF
        slot = 2 + 2 * (self.epoch % 2)  # a rank is at most one epoch ahead of any other
        flags = host.flags[self.me]
        flags[slot], flags[slot + 1] = seq, digest
        flags[0] = self.epoch
        for r in range(self.n):
            if r != self.me:
                host.ring(r)
        rounds = 0
        pending = [r for r in range(self.n) if r != self.me]
        while pending:
            still = []
            for r in pending:
                theirs = host.flags[r]
                if theirs[0] < self.epoch:
                    still.append(r)
                elif theirs[slot] != seq or theirs[slot + 1] != digest:
                    host.abort(ABORT_MISMATCH, host.me, seq)
                    raise CommMismatchError(
                        f"{signature.collective} #{seq} on rank {self.me}: rank {r} called "
                        f"another operation in this slot ({signature.describe()} here): every "
                        f"rank must call the same collectives in the same order")
            pending = still
            if pending:
                rounds += 1
                if time.monotonic() > deadline:
                    raise CommTimeoutError(
                        f"{signature.collective} #{seq} (shm) on rank {self.me}: timed out "
                        f"waiting for ranks {pending}", op=signature.collective, seq=seq,
                        peers=tuple(pending))
                endpoint.idle(rounds, deadline, spin)
