"""Choosing and caching the programs the runtime executes.

``algo="auto"`` follows a loaded tuning table where it has a rule (:func:`use_tuning_table`,
``COMMFLOW_TUNING_TABLE``; :func:`commflow.tune.tune_live` measures one), else picks the
shared-memory fast path where it applies, else by collective and message size
(latency-bound sizes get log-step or one-shot algorithms, bandwidth-bound sizes the ring);
any registered algorithm can be named, or a :class:`~commflow.ir.Program` passed (one of
your own, or from :func:`commflow.synth.synthesize`): :func:`adopt` checks it against the
call and gives it a name. Programs are generated (or adopted), verified once, and their
per-rank plans cached per buffer size.
"""

from __future__ import annotations

import hashlib
import os
import weakref
from functools import lru_cache

import numpy as np

from commflow import algorithms
from commflow.collectives import Collective
from commflow.errors import AlgorithmError
from commflow.ir import Program, element_trace, to_json, verify
from commflow.runtime import variants
from commflow.runtime.plan import RankPlan, plan_rank
from commflow.tuning_table import TuningTable, load_table

PROGRAM_SUFFIX = ".json"
"""An algorithm given by name that ends with this suffix is a program file (tools that take
algorithm names on the command line or in the environment accept one)."""

SMALL = 64 * 1024
"""Bytes below which ``auto`` prefers latency-optimal algorithms."""

_AUTO = {
    Collective.ALLREDUCE: ("recursive_doubling", "ring"),
    Collective.ALLGATHER: ("recursive_doubling", "ring"),
    Collective.REDUCESCATTER: ("halving_doubling", "ring"),
    Collective.BROADCAST: ("binomial_tree", "binomial_tree"),
    Collective.REDUCE: ("binomial_tree", "binomial_tree"),
    Collective.GATHER: ("direct", "direct"),
    Collective.SCATTER: ("direct", "direct"),
    Collective.ALLTOALL: ("direct", "pairwise"),
}


TABLE_ENV = "COMMFLOW_TUNING_TABLE"
"""Environment variable naming a tuning table (JSON) that ``auto`` follows."""
_table: list[TuningTable | None] = []
generation = 0
"""Counts the tables ``auto`` has followed in this process (0: none yet), so that callers
may cache what they chose under one table."""


def tuned() -> bool:
    """Whether ``auto`` follows a tuning table in this process."""
    return _active_table() is not None


def use_tuning_table(table: TuningTable | str | os.PathLike | None) -> None:
    """Make ``auto`` follow ``table`` (a table or its JSON file; ``None``: none) in this
    process. Every rank must use the same table: ranks that pick different algorithms fail
    the wire protocol's signature check. Without a call, ``auto`` loads the file named by
    ``COMMFLOW_TUNING_TABLE`` on first use. Raises ``CommflowError`` for a malformed file,
    ``AlgorithmError`` for a malformed fast-path variant name
    (:func:`commflow.runtime.variants.variant`)."""
    global generation
    if isinstance(table, str | os.PathLike):
        table = load_table(table)
    _table[:] = [_checked(table)]
    generation += 1


def _checked(table: TuningTable | None) -> TuningTable | None:
    """``table`` once every fast-path variant it names parses (``AlgorithmError`` else)."""
    for rule in () if table is None else table.rules:
        if variants.is_fast(rule.algo):
            variants.variant(rule.algo)
    return table


def _active_table() -> TuningTable | None:
    global generation
    if not _table:
        path = os.environ.get(TABLE_ENV)
        _table.append(_checked(load_table(path)) if path else None)
        generation += 1
    return _table[0]


def choose(
    collective: Collective, nranks: int, nbytes: int, algo: str, *, fast_path: bool = False,
    in_place: bool = False,
) -> str:
    """The algorithm to run: ``algo`` itself unless it is ``"auto"``; then the tuning table's
    rule for the collective, rank count, size and placement (``in_place``:
    :func:`commflow.runtime.calls.in_place`) when one is loaded and covers it
    (:func:`use_tuning_table`; a rule for the fast path or a variant of it only where the fast
    path applies; ranks that call one collective in different placements may then choose
    differently and fail with ``CommMismatchError``); else the
    shared-memory fast path where it applies (``fast_path``: one host, world communicator; it
    was fastest or level at every size in ``commflow bench --algo all``, see
    docs/benchmarks.md), else a log-step algorithm below :data:`SMALL` bytes and a
    bandwidth-optimal one above."""
    if algo != "auto":
        return algo
    return choices(collective, nranks, nbytes, fast_path=fast_path)[in_place]


def choices(collective: Collective, nranks: int, nbytes: int, *,
            fast_path: bool = False) -> tuple[str, str]:
    """What ``auto`` runs (:func:`choose`) for a call out of place and in place; a caller
    looks at its call's placement only where the two differ."""
    _active_table()  # loads COMMFLOW_TUNING_TABLE on first use, a new generation
    key = (collective, nranks, nbytes, fast_path, generation)
    chosen = _chosen.get(key)
    if chosen is None:
        if len(_chosen) > 4096:
            _chosen.clear()
        chosen = _chosen[key] = (_choose(collective, nranks, nbytes, fast_path, False),
                                 _choose(collective, nranks, nbytes, fast_path, True))
    return chosen


_chosen: dict[tuple, tuple[str, str]] = {}
"""What ``auto`` chose per call shape and table generation (a table has many rules)."""


def _choose(collective: Collective, nranks: int, nbytes: int, fast_path: bool,
            in_place: bool) -> str:
    table = _active_table()
    tuned = None if table is None else table.lookup(collective, nranks, nbytes,
                                                    in_place=in_place)
    if tuned is not None and (fast_path or not variants.is_fast(tuned)):
        return tuned
    return builtin(collective, nbytes, fast_path=fast_path)


def builtin(collective: Collective, nbytes: int, *, fast_path: bool = False) -> str:
    """What ``auto`` runs without a tuning table (:func:`choose`): the shared-memory fast
    path where it applies, else a log-step algorithm below :data:`SMALL` bytes and a
    bandwidth-optimal one above."""
    if fast_path and collective in variants.COLLECTIVES:
        return variants.NAME
    small, large = _AUTO[collective]
    return small if nbytes < SMALL else large


_ADOPTED: weakref.WeakValueDictionary[str, Program] = weakref.WeakValueDictionary()
"""Programs passed as ``algo=``, by the name :func:`adopt` gave them (while they are alive)."""


def is_program_file(name: str) -> bool:
    """Whether an algorithm named ``name`` is a program JSON file rather than an algorithm."""
    return name.endswith(PROGRAM_SUFFIX)


def mismatch(prog: Program, collective: Collective, nranks: int, root: int) -> str | None:
    """Why ``prog`` cannot run a call of ``collective`` on ``nranks`` ranks with ``root``
    (checked for rooted collectives only), e.g. ``"implements allgather, not allreduce"``;
    ``None`` when it can."""
    if prog.collective is not collective:
        return f"implements {prog.collective.value}, not {collective.value}"
    if prog.nranks != nranks:
        return f"is for {prog.nranks} ranks, not {nranks}"
    if collective.rooted and prog.root != root:
        return f"has root {prog.root}, not {root}"
    return None


def check_runnable(prog: Program) -> None:
    """Verify ``prog`` and check that the runtime can execute it: ``VerificationError`` when
    it does not implement its collective (or is too large to verify), ``AlgorithmError`` when
    it has switch participants (in-network aggregation has no runtime yet)."""
    if len(prog.participants) > prog.nranks:
        raise AlgorithmError(
            f"program {prog.name!r} has {len(prog.participants) - prog.nranks} "
            f"switch participant(s); the runtime runs programs of ranks only"
        )
    verify(prog)


def adopt(prog: Program, collective: Collective, nranks: int, root: int, rank: int) -> str:
    """The name under which the runtime runs ``prog`` for a call of ``collective`` on
    ``nranks`` ranks (``root`` counts for rooted collectives only), called on ``rank``.

    Cheap per call: the program is checked with :func:`check_runnable` once per object (pass
    the same :class:`~commflow.ir.Program` again, not a fresh copy). Raises ``AlgorithmError``
    when the program is for another collective, rank count or root (:func:`mismatch`), and
    what :func:`check_runnable` raises.
    """
    problem = mismatch(prog, collective, nranks, root)
    if problem:
        raise AlgorithmError(
            f"{collective.value} on rank {rank}: program {prog.name!r} {problem}; pass a "
            f"program built or synthesized for this call"
        )
    return _adopted_name(prog)


@lru_cache(maxsize=64)
def _adopted_name(prog: Program) -> str:
    """Check ``prog`` (once per object) and name it by its name and a digest of its content,
    so that ranks running different programs fail the signature check of the wire protocol."""
    check_runnable(prog)
    digest = hashlib.blake2b(to_json(prog).encode(), digest_size=8).hexdigest()
    name = f"{prog.name}@{digest}"
    _ADOPTED[name] = prog
    return name


@lru_cache(maxsize=256)
def program(collective: Collective, name: str, nranks: int, root: int | None) -> Program:
    """The verified program of ``name``: registered, or adopted by :func:`adopt` (raises
    ``AlgorithmError`` if unknown/inapplicable)."""
    adopted = _ADOPTED.get(name)
    if adopted is not None:
        return adopted
    built = algorithms.build(collective, name, nranks, root=root)
    verify(built)
    return built


@lru_cache(maxsize=64)
def _trace(collective: Collective, name: str, nranks: int, root: int | None) -> np.ndarray:
    return element_trace(program(collective, name, nranks, root))


@lru_cache(maxsize=1024)
def rank_plan(
    collective: Collective, name: str, nranks: int, root: int | None, rank: int, unit_elements: int
) -> RankPlan:
    """``rank``'s plan of the program for units of ``unit_elements`` elements."""
    prog = program(collective, name, nranks, root)
    trace = (
        None if unit_elements % prog.chunk_factor == 0 else _trace(collective, name, nranks, root)
    )
    return plan_rank(prog, rank, unit_elements, trace)


def check_algorithm(collective: Collective, name: str) -> None:
    """Raise ``AlgorithmError`` unless ``name`` is ``auto``, a fast path (or a variant of it,
    :func:`commflow.runtime.variants.variant`) for ``collective`` or registered for it."""
    if variants.is_fast(name):
        variants.variant(name)
        if collective not in variants.COLLECTIVES:
            raise AlgorithmError(
                f"fast path {name!r} has no {collective.value}; it covers "
                f"{', '.join(c.value for c in variants.COLLECTIVES)}"
            )
        return
    if name != "auto":
        if algorithms.get(collective, name).in_network:
            raise AlgorithmError(
                f"{collective.value}/{name} aggregates in network switches, which the "
                "shared-memory runtime has none of; simulate it (commflow sim --algo "
                f"{name}) or run it through a software switch (commflow ina)")
        return
    if collective not in _AUTO:
        raise AlgorithmError(f"no automatic choice for {collective.value}")


def names(collective: Collective) -> list[str]:
    """Every algorithm the runtime can run for ``collective``: the fast path (if it covers the
    collective) and the registered programs (some apply only to certain rank counts)."""
    fast = [variants.NAME] if collective in variants.COLLECTIVES else []
    return fast + [a.name for a in algorithms.available(collective)]
