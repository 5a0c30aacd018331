"""The fast path's variants (:mod:`commflow.runtime.fastpath`): how a call is cut, and the
algorithm names that say so.

How a call is cut is a :class:`Variant`: the largest allreduce segment reduced
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
from dataclasses import dataclass, fields
from functools import cached_property, lru_cache

from commflow.collectives import Collective
from commflow.errors import AlgorithmError, CommflowError
from commflow.runtime.transport.shm import ShmTransport
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
