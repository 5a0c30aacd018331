"""Which commflow algorithm each collective of the ``commflow`` backend runs.

Like ``NCCL_ALGO``, the environment variable ``COMMFLOW_ALGO`` names an algorithm per
collective (``COMMFLOW_ALGO=allreduce:ring,allgather:bruck``); :func:`use_algorithms` overrides
it for the calls made inside a ``with`` block (in this thread or async context). Collectives
left unnamed use ``"auto"`` (the runtime's choice by message size). Collective names are
commflow's (``allreduce``, ``allgather``, ``reducescatter``, ``broadcast``, ``reduce``,
``gather``, ``scatter``, ``alltoall``); torch spellings with underscores (``all_reduce``,
``reduce_scatter``, ``all_to_all``) are accepted too. An algorithm ending in ``.json`` is a
program file (``COMMFLOW_ALGO=allgather:ag4.json``, saved by ``commflow synth -o``), loaded
once per process; the communicator checks its rank count and root at each call.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from types import MappingProxyType

from commflow.collectives import Collective
from commflow.errors import AlgorithmError, ProgramError
from commflow.ir import Program, load_program
from commflow.runtime import algorithm_names
from commflow.runtime.programs import is_program_file

ENV_VAR = "COMMFLOW_ALGO"
"""Environment variable holding the per-collective algorithm choice."""

AUTO = "auto"

_override: ContextVar[Mapping[Collective, str | Program]] = ContextVar(
    "commflow_algorithms", default=MappingProxyType({})
)


def _collective(name: str, where: str) -> Collective:
    key = name.strip().lower().replace("_", "")
    for collective in Collective:
        if collective.value == key:
            return collective
    raise AlgorithmError(
        f"{where}: unknown collective {name!r}; use one of {', '.join(c.value for c in Collective)}"
    )


def check_algorithm(collective: Collective, algo: str, where: str) -> str | Program:
    """``algo`` stripped, if the runtime can run it for ``collective`` (or it is ``"auto"``),
    or the program of a program file for ``collective``; else ``AlgorithmError`` naming
    ``where`` and the choices (``ProgramError`` for a file that cannot be read)."""
    algo = algo.strip()
    if is_program_file(algo):
        program = _load(algo, where)
        if program.collective is not collective:
            raise AlgorithmError(
                f"{where}: {algo} implements {program.collective.value}, not {collective.value}"
            )
        return program
    known = algorithm_names(collective)
    if algo != AUTO and algo not in known:
        raise AlgorithmError(
            f"{where}: no algorithm {algo!r} for {collective.value}; choose "
            f"from {AUTO}, {', '.join(known)}"
        )
    return algo


@lru_cache(maxsize=16)
def _load(path: str, where: str) -> Program:
    """The program in file ``path``, read once per process (so it is verified once)."""
    try:
        return load_program(path)
    except ProgramError as error:
        raise ProgramError(f"{where}: {error}") from None


@lru_cache(maxsize=32)
def parse_algorithms(spec: str, where: str = ENV_VAR) -> Mapping[Collective, str | Program]:
    """Parse ``"allreduce:ring,allgather:bruck"`` into ``{Collective: algorithm}``.

    Raises ``AlgorithmError`` (naming ``where``) for a malformed entry, an unknown collective,
    or an algorithm the runtime has no program for."""
    choice: dict[Collective, str | Program] = {}
    for entry in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, algo = entry.partition(":")
        if not sep or not algo.strip():
            raise AlgorithmError(
                f"{where}: entry {entry!r} must read collective:algorithm, e.g. allreduce:ring"
            )
        collective = _collective(name, where)
        choice[collective] = check_algorithm(collective, algo, where)
    return MappingProxyType(choice)


def algorithm_for(collective: Collective) -> str | Program:
    """The algorithm for ``collective`` now: the innermost :func:`use_algorithms` block,
    else ``COMMFLOW_ALGO``, else ``"auto"``. Raises ``AlgorithmError`` when
    ``COMMFLOW_ALGO`` is malformed."""
    chosen = _override.get().get(collective)
    if chosen is not None:
        return chosen
    return parse_algorithms(os.environ.get(ENV_VAR, "")).get(collective, AUTO)


@contextmanager
def use_algorithms(spec: str | None = None, /, **choices: str) -> Iterator[None]:
    """Run the collectives issued inside the block with the named algorithms::

        with commflow.torch.use_algorithms("allreduce:ring", allgather="bruck"):
            dist.all_reduce(t)

    ``spec`` has ``COMMFLOW_ALGO``'s syntax; keyword arguments name one collective each. Blocks
    nest (inner choices win) and leave other collectives to the outer choice. Raises
    ``AlgorithmError`` for unknown collectives or algorithms."""
    where = "use_algorithms"
    merged = dict(_override.get())
    merged.update(parse_algorithms(spec or "", where))
    for name, algo in choices.items():
        collective = _collective(name, where)
        merged[collective] = check_algorithm(collective, algo, where)
    token = _override.set(merged)
    try:
        yield
    finally:
        _override.reset(token)
