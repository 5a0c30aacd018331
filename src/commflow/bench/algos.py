"""The ``--algo`` entries of ``commflow bench``: algorithm names, or program JSON files.

An entry ending in ``.json`` is a program saved by :func:`commflow.ir.save_program` (for
example ``commflow synth allgather --topo ring4 -o ag.json``); the benchmark runs it through
``algo=Program`` of the runtime and labels its rows with the file name. Ranks receive the
file's path in their :class:`~commflow.bench.spec.RunSpec` and load it themselves (nothing is
pickled).
"""

from __future__ import annotations

from pathlib import Path

from commflow.collectives import Collective
from commflow.errors import AlgorithmError
from commflow.ir import Program, load_program
from commflow.runtime.programs import check_runnable, is_program_file, mismatch


def label(entry: str) -> str:
    """How tables and JSON records name the entry: a program file by its file name."""
    return Path(entry).name if is_program_file(entry) else entry


def check_program_file(entry: str, collective: Collective, nranks: int, root: int) -> None:
    """Load the program file ``entry`` and check that it fits the benchmark and that the
    runtime can run it (:func:`commflow.runtime.programs.check_runnable`).

    Raises ``ProgramError`` when the file cannot be read or is malformed, ``AlgorithmError``
    when the program's collective, rank count or root (rooted collectives) differ from the
    benchmark's, and ``VerificationError`` when it does not implement its collective.
    """
    prog = load_program(entry)
    problem = mismatch(prog, collective, nranks, root)
    if problem:
        raise AlgorithmError(
            f"--algo {entry}: program {prog.name!r} {problem}; give a program for this "
            f"benchmark, or match the benchmark to the program (COLLECTIVE, -n, -r)"
        )
    check_runnable(prog)


def resolve(entry: str) -> str | Program:
    """What a rank passes as ``algo=``: the loaded program for a program file, else the name
    (``ProgramError`` when the file cannot be read)."""
    return load_program(entry) if is_program_file(entry) else entry
