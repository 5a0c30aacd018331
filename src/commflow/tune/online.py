"""Online tuning on a live communicator: which algorithm is fastest at each size, measured.

For each collective, size and placement (out of place, in place), every algorithm the
runtime can run on this communicator is timed by successive halving (Jamieson and Talwalkar
2016): each round times the surviving candidates ``iters`` times, half of the calls on 4
KiB pages and half on huge pages (:func:`buffer`; each call after a barrier; the time is
the slowest rank's, so every rank sees the same numbers and keeps the same half), then the
number of calls doubles, until one is left or the time budget is spent
(then the fastest so far wins). Runs of sizes with the same winners become rules of a
:class:`~commflow.tuning_table.TuningTable` (``model="live"``, keyed by
:func:`live_fingerprint`): one rule for both placements where they have the same winner, a
rule per placement where not; ``auto`` follows the table once loaded
(:func:`commflow.runtime.use_tuning_table`, or ``COMMFLOW_TUNING_TABLE``).

Where the fast path runs, its variants are candidates too (a rule may name
``shm:segment=1M``): ``auto`` then runs the fast path cut that way at those sizes, while
``algo="shm"`` keeps the defaults. Variants that cut a size as another candidate does are
timed once (:func:`distinct`). A winner replaces what ``auto`` runs without a table
(:func:`commflow.runtime.programs.builtin`: ``shm`` where the fast path runs) only when it
is more than a margin faster than it (:func:`margin_of`: 3% for a variant that only cuts
or waits otherwise than ``shm``, 5% else) in a final round and again in a re-check with
twice the calls, the final round on the 4 KiB pages of a torch tensor and the re-check on
the huge pages numpy gives large arrays (:func:`buffer`): a gain that holds on one kind of
page only is not kept. A third round times them again on 4 KiB pages, each call after an
untimed call of the program ``auto`` runs where the fast path does not
(:func:`commflow.runtime.programs.builtin`), as where other collectives run
between two calls of this one: a single-copy variant that wins on quiet buffers may lose
there (2 ranks, reduce-scatter in place, 16 MiB: ``shm:copy=cma`` 0.84x ``shm`` alone,
1.03x with ``ring`` between calls). The runners-up that the halving ranked ahead of the
default run in the same rounds (:data:`CONTENDERS`), so that a winner that loses there
gives way to the next, not straight to the default.
"""

from __future__ import annotations

import math
import mmap
import time
from collections.abc import Callable, Sequence

import numpy as np

from commflow.collectives import Collective, parse_collective
from commflow.errors import AlgorithmError, CommflowError
from commflow.tuning_table import IN_PLACE, OUT_OF_PLACE, Rule, TuningTable

COLLECTIVES = (Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCESCATTER)
"""Collectives tuned by default."""


def live_fingerprint(comm) -> str:
    """What a live table is keyed by: the rank count and ranks per host of ``comm``."""
    return f"live:{comm.size}ranks:{getattr(comm, 'local_size', comm.size)}perhost"


def candidates(comm, collective: Collective) -> list[str]:
    """The algorithms the runtime can run for ``collective`` on ``comm``'s ranks (those that
    do not apply to its rank count left out): where the fast path runs, ``shm`` and its
    tuned variants (:func:`commflow.runtime.variants.variants`: segment size, one-shot
    threshold, single-copy reads where every rank may read the others' memory:
    :func:`commflow.runtime.cma.permitted`, so a collective call), as NCCL's tuner ranks
    protocols and channel counts; then the registered programs."""
    from commflow import algorithms
    from commflow.runtime import cma, programs, variants

    found = variants.variants(collective, cma=cma.permitted(comm)) \
        if getattr(comm, "fast_path", False) else []
    for name in programs.names(collective):
        if name == "auto" or variants.is_fast(name):
            continue
        try:
            algorithms.build(collective, name, comm.size)
        except AlgorithmError:
            continue
        found.append(name)
    return found


def distinct(names: Sequence[str], collective: Collective, size: int,
             nranks: int) -> list[str]:
    """``names`` without the fast-path variants that cut a ``size``-byte call as an earlier
    name does (:func:`commflow.runtime.variants.effective`; each kept under its name)."""
    from commflow.runtime import variants

    staged = _count(collective, size, nranks) * 4  # a rank's float32 input, all staged
    seen, kept = set(), []
    for name in names:
        key = variants.effective(variants.variant(name), collective, staged, nranks).name \
            if variants.is_fast(name) else name
        if key not in seen:
            seen.add(key)
            kept.append(name)
    return kept


def _count(collective: Collective, size: int, nranks: int) -> int:
    """float32 elements of one rank's input for a ``size``-byte call (nccl-tests sizes)."""
    elements = max(1, size // 4)
    return {Collective.ALLGATHER: max(1, elements // nranks),
            Collective.REDUCESCATTER: max(1, elements // nranks) * nranks}.get(collective,
                                                                                elements)


def _call(comm, collective: Collective, x: np.ndarray, algo: str,
          buf: np.ndarray | None, out: np.ndarray | None) -> None:
    """One call out of place, on ``x`` into ``out``, or in place, on ``buf`` (``None``: out of
    place; ``x`` then gives only the length of a rank's input): allgather's input is this
    rank's block of ``buf``, reduce-scatter's output is."""
    if collective is Collective.ALLREDUCE:
        comm.allreduce(x if buf is None else buf, algo=algo, out=out if buf is None else buf)
    elif collective is Collective.ALLGATHER:
        block = slice(comm.rank * len(x), (comm.rank + 1) * len(x))
        comm.allgather(x if buf is None else buf[block], algo=algo,
                       out=out if buf is None else buf)
    elif collective is Collective.REDUCESCATTER:
        m = len(x) // comm.size
        comm.reduce_scatter(x if buf is None else buf, algo=algo,
                            out=out if buf is None else buf[comm.rank * m:(comm.rank + 1) * m])
    else:
        raise CommflowError(f"online tuning covers allreduce, allgather and reducescatter, not "
                            f"{collective.value}")


SMALL, HUGE = "small", "huge"
"""Pages of the buffers a tuning round times on (:func:`buffer`)."""


def buffer(count: int, dtype: np.dtype | type, pages: str = SMALL) -> np.ndarray:
    """``count`` zeroed elements of ``dtype`` on ``pages``: :data:`SMALL`, 4 KiB pages
    (:func:`small_pages`, as torch tensors have), or :data:`HUGE`, as numpy allocates them
    (2 MiB transparent huge pages for large arrays where the kernel gives them). A variant's
    gain may hold on one kind only (2 ranks, allreduce in place, in halves: 4-9% faster than
    whole segments at 64 MiB on 4 KiB pages, 21-32% slower at 16-64 MiB in numpy's arrays
    in ``commflow bench``)."""
    return small_pages(count, dtype) if pages == SMALL else np.zeros(count, dtype)


def small_pages(count: int, dtype: np.dtype | type) -> np.ndarray:
    """``count`` zeroed elements of ``dtype`` in anonymous memory advised against transparent
    huge pages (``MADV_NOHUGEPAGE``), as a torch tensor's memory is where the kernel gives
    huge pages on request only (``transparent_hugepage/enabled`` = ``madvise``): a
    single-copy (``copy=cma``) call pins every page it reads or writes, so on 4 KiB pages it
    costs more than on the 2 MiB pages numpy gives large arrays where the kernel allows them
    (2 ranks, 16 MiB in place: 2.7-2.9 ms against 1.3-1.7 ms), and the tuner must time
    candidates on the pages users' buffers have."""
    nbytes = max(1, count * np.dtype(dtype).itemsize)
    memory = mmap.mmap(-1, nbytes)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        memory.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(memory, dtype, count)


def _time(comm, collective: Collective, x: np.ndarray, names: Sequence[str],
          iters: int, placements: Sequence[bool] = (False, True),
          pages: str = SMALL, between: str | None = None) -> dict[str, float]:
    """Median over ``iters`` samples of the slowest rank's seconds, per name; a sample is
    one call in each of ``placements`` (``True``: in place; a program run in place copies
    its input first; out of place from a copy of ``x`` into one preallocated output, as
    ``commflow bench`` and DDP's buckets call, not a fresh array whose pages each call would
    fault in; every buffer on ``pages``, :func:`buffer`), each timed call after an untimed
    call of the algorithm ``between`` on the same buffers where one is given. Every call is
    prepared as ``commflow bench`` prepares it: in place the buffer is restored, out of
    place the output is refilled (so it starts in the caches, as a buffer the caller has
    just written). The names take turns sample by sample, so a change in the machine's load
    reaches all of them alike."""
    whole = len(x) * (comm.size if collective is Collective.ALLGATHER else 1)
    given = {}  # placement: (_call's x, buf, out), then the buffer it writes and its image
    if True in placements:
        buf = buffer(whole, x.dtype, pages)
        buf.fill(0)  # fault every page in now, not in the first name's first call
        block = slice(comm.rank * len(x), (comm.rank + 1) * len(x))
        (buf[block] if collective is Collective.ALLGATHER else buf)[...] = x
        given[True] = ((x, buf, None), buf, buf.copy())
    if False in placements:
        src = buffer(len(x), x.dtype, pages)
        src[...] = x
        out = buffer(len(x) // comm.size if collective is Collective.REDUCESCATTER else whole,
                     x.dtype, pages)
        out.fill(0)
        given[False] = ((src, None, out), out, np.zeros_like(out))
    times = np.zeros((len(names), iters))
    for i in range(iters):
        for j, name in enumerate(names):
            for placed in placements:
                (data, inside, into), target, image = given[placed]
                if between is not None:
                    _call(comm, collective, data, between, inside, into)
                np.copyto(target, image)
                comm.barrier()
                start = time.perf_counter()
                _call(comm, collective, data, name, inside, into)
                times[j, i] += time.perf_counter() - start
    slowest = comm.allreduce(times, op="max")
    return {name: float(np.median(row)) for name, row in zip(names, slowest, strict=True)}


MAX_ITERS = 64
"""Most calls per candidate in the first round of :func:`halve`."""
FINAL_CALLS = 16
"""Fewest calls of each in the final round of :func:`halve` against the incumbent (the
re-check and the round among other traffic that follow make twice as many)."""
CONTENDERS = 3
"""How many of the names successive halving ranked ahead of the incumbent run against it in
:func:`halve`'s head-to-head rounds: where the winner of the quiet rounds loses among other
traffic (a single-copy variant, and its sibling with another spin), the next may still beat
the default."""
MARGIN = 0.05
"""How much faster than the incumbent (what ``auto`` runs without a table) a winner that
moves data otherwise (single-copy reads, streaming stores, another algorithm;
:func:`margin_of`) must be in each head-to-head round of :func:`halve` to replace it: a
rule that only follows a noisy round would make ``auto`` slower than the default it
replaces (2 ranks, reduce-scatter in place, 16 MiB: ``shm:copy=cma`` won the rounds on 4
KiB pages by 3-4% and took 1.05-1.11x ``shm``'s time in ``commflow bench``)."""
CUT_MARGIN = 0.03
"""The margin for a fast-path variant that stages and stores as ``shm`` does and only cuts
calls or waits otherwise (segment, one-shot threshold, spin; :func:`margin_of`): it moves
the same bytes through the same buffers, so its gains carry over (2 ranks, reduce-scatter
in place, 64 MiB: ``shm:segment=2M`` 0.93-0.95x ``shm``'s time alone and with ``ring``
called between calls, 0.92-0.95x in ``commflow bench --algo all``), and where one wins the
rounds by luck the bench finds it at about ``shm``'s time (the same at 16 MiB:
0.96-1.03x)."""


def margin_of(name: str) -> float:
    """How much faster than the incumbent the algorithm ``name`` must be in :func:`halve`'s
    head-to-head rounds: :data:`CUT_MARGIN` for a fast-path variant that stages and stores as
    ``shm`` does, else :data:`MARGIN`."""
    from commflow.runtime import variants

    if variants.is_fast(name):
        option = variants.variant(name)
        if (option.copy, option.store) == (variants.STAGE, variants.CACHED):
            return CUT_MARGIN
    return MARGIN

Measure = Callable[..., dict[str, float]]
"""How :func:`halve` times candidates: ``measure(comm, collective, x, names, iters,
placements, pages, between)`` returns every name's seconds per sample, the same on every
rank (default: the median of the slowest rank's, names taking turns sample by sample)."""


def halve(comm, collective: Collective, size: int, names: Sequence[str], *,
          iters: int = 3, deadline: float = float("inf"), incumbent: str | None = None,
          margin: Callable[[str], float] = margin_of,
          placements: Sequence[bool] = (False, True),
          traffic: str | None = None, measure: Measure = _time) -> tuple[str, float]:
    """The fastest of ``names`` for a ``size``-byte ``collective`` (nccl-tests convention)
    by successive halving, and its median seconds per sample (one call in each of
    ``placements``: ``False`` out of place, ``True`` in place). Every rank returns the same.

    Each round times the names on both kinds of page (:func:`buffer`), half of the calls
    on each, and ranks them by the mean of the two medians. The first round times every
    name ``iters`` times, or more (up to :data:`MAX_ITERS`) when a second warm-up call of
    each (the first pays for setting up: segments, page faults) says that the rounds fit
    before ``deadline`` (every round costs about the same: half the names, twice the calls).

    With an ``incumbent`` (one of ``names``), the winner and the runners-up that the rounds
    ranked ahead of the incumbent (:data:`CONTENDERS` in all) then run against it, call by
    call, as many calls as the last round made (at least :data:`FINAL_CALLS`), on 4 KiB
    pages; then twice as many on huge pages, the incumbent taking the first turn; and, given
    another algorithm of the collective than the incumbent as ``traffic``, as many on 4 KiB
    pages, each after an untimed call of ``traffic`` (as where other collectives run between
    two calls of this one). The fastest of those more than ``margin(name)`` faster than the
    incumbent in every round replaces it (the time returned is the last round's).
    ``measure`` times the calls (:data:`Measure`; tests pass their own)."""
    count = _count(collective, size, comm.size)
    x = small_pages(count, np.float32)
    x[...] = np.random.default_rng(comm.rank).standard_normal(count)
    alive = list(names)
    for _ in range(2):  # warm-up; the second call's times say how many calls fit
        timed = measure(comm, collective, x, alive, 1, placements)
    left = comm.allreduce(np.array([deadline - time.monotonic()]), op="min")[0]
    rounds_left = max(1, math.ceil(math.log2(len(alive))))
    fits = left / (sum(timed.values()) * rounds_left * 1.5)  # 1.5: barriers, stragglers
    rounds = int(min(MAX_ITERS, max(iters, fits))) if math.isfinite(fits) else iters
    dropped: list[str] = []  # out of the rounds, those that lasted longest first
    while len(alive) > 1:
        halves = [measure(comm, collective, x, alive, -(-rounds // 2), placements, pages)
                  for pages in (SMALL, HUGE)]
        timed = {n: (halves[0][n] + halves[1][n]) / 2 for n in alive}
        order = sorted(alive, key=lambda n: (timed[n], n))
        keep = max(1, len(alive) // 2)
        alive, dropped = order[:keep], order[keep:] + dropped
        rounds *= 2
        if _past(comm, deadline):
            break
    ranked = alive + dropped
    best = ranked[0]
    if incumbent is None or incumbent == best:
        return best, timed[best]
    calls = max(FINAL_CALLS, rounds // 2)
    contenders = ranked[:min(CONTENDERS, ranked.index(incumbent))]
    return _head_to_head(comm, collective, x, contenders, incumbent, calls, placements,
                         margin, traffic, measure)


def _past(comm, deadline: float) -> bool:
    """Whether some rank's clock is past ``deadline`` (every rank gets the same answer)."""
    return bool(comm.allreduce(np.array([float(time.monotonic() > deadline)]), op="max")[0])


def _head_to_head(comm, collective: Collective, x: np.ndarray, contenders: list[str],
                  incumbent: str, calls: int, placements: Sequence[bool],
                  margin: Callable[[str], float], traffic: str | None,
                  measure: Measure) -> tuple[str, float]:
    """The rounds of :func:`halve` between ``contenders`` and ``incumbent``, taking turns:
    ``calls`` each on 4 KiB pages, twice as many on huge pages (the incumbent first), and as
    many again on 4 KiB pages after ``traffic`` calls (unless ``traffic`` is ``None`` or the
    incumbent). A contender stays only while more than ``margin(name)`` faster than the
    incumbent; the fastest that stays to the end wins, else the incumbent (name and seconds
    in the last round)."""
    checks = [(calls, SMALL, None), (2 * calls, HUGE, None)]
    if traffic not in (None, incumbent):
        checks.append((2 * calls, SMALL, traffic))
    alive = list(contenders)
    for samples, pages, between in checks:
        turns = [incumbent, *alive] if pages == HUGE else [*alive, incumbent]
        final = measure(comm, collective, x, turns, samples, placements, pages, between)
        alive = [n for n in alive if final[n] < final[incumbent] * (1 - margin(n))]
        if not alive:
            return incumbent, final[incumbent]
    best = min(alive, key=lambda n: (final[n], n))
    return best, final[best]


def tune_live(comm, sizes: Sequence[int], *,
              collectives: Sequence[Collective | str] = COLLECTIVES,
              budget: float = 60.0, iters: int = 3) -> TuningTable:
    """Measure the fastest algorithm for each of ``collectives`` at each of ``sizes`` (bytes,
    increasing) on ``comm`` within about ``budget`` seconds; every rank returns the same
    table. Each placement is tuned on its own, in half the time of a size. Rules cover from
    just above the previous tuned size's rule to their own size; the first starts at 0 bytes,
    the last covers every larger size; a rule holds for both placements where their winners
    agree, else there is one per placement.

    Raises ``CommflowError`` for no sizes, unsorted sizes or a collective it cannot time.
    """
    sizes = [int(s) for s in sizes]
    if not sizes or sizes != sorted(set(sizes)) or sizes[0] < 1:
        raise CommflowError(f"online tuning needs increasing sizes >= 1 byte, got {sizes}")
    from commflow.runtime import programs

    kinds = [parse_collective(c) for c in collectives]
    deadline = time.monotonic() + budget
    per_case = budget / (len(kinds) * len(sizes))
    rules: list[Rule] = []
    for kind in kinds:
        names = candidates(comm, kind)
        winners = []
        for size in sizes:
            kept = distinct(names, kind, size, comm.size)
            default = programs.builtin(kind, size, fast_path=getattr(comm, "fast_path", False))
            program = programs.builtin(kind, size)  # what auto runs without the fast path
            traffic = program if program != default and program in kept else None
            winners.append(tuple(
                halve(comm, kind, size, kept, iters=iters, placements=(placed,),
                      deadline=min(deadline, time.monotonic() + per_case / 2),
                      incumbent=default if default in kept else None, traffic=traffic)
                for placed in (False, True)))
        rules += _rules(kind, comm.size, sizes, winners)
    return TuningTable(fingerprint=live_fingerprint(comm), topology=f"live {comm.size} ranks",
                       model="live", rules=tuple(rules))


def _rules(kind: Collective, nranks: int, sizes: list[int],
           winners: list[tuple[tuple[str, float], tuple[str, float]]]) -> list[Rule]:
    """Rules from the ``(out of place, in place)`` winners at each of ``sizes``: a run of
    sizes with the same winners becomes one rule for both placements where they agree, else
    one rule per placement (``time_us``: per call, the two placements' mean for both)."""
    rules: list[Rule] = []
    low = 0
    for j, (size, (out, inside)) in enumerate(zip(sizes, winners, strict=True)):
        last = j == len(sizes) - 1
        if not last and (winners[j + 1][0][0], winners[j + 1][1][0]) == (out[0], inside[0]):
            continue
        top = 2**63 - 1 if last else size
        if out[0] == inside[0]:
            rules.append(Rule(collective=kind, nranks=nranks, min_bytes=low, max_bytes=top,
                              algo=out[0], time_us=(out[1] + inside[1]) / 2 * 1e6))
        else:
            rules += [Rule(collective=kind, nranks=nranks, min_bytes=low, max_bytes=top,
                           algo=algo, time_us=seconds * 1e6, placement=placement)
                      for (algo, seconds), placement in ((out, OUT_OF_PLACE), (inside, IN_PLACE))]
        low = size + 1
    return rules
