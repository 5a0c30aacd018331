"""The implementations ``commflow bench`` measures, behind one small interface.

Each implementation is a module (:mod:`~commflow.bench.impl_commflow`,
:mod:`~commflow.bench.impl_gloo`, :mod:`~commflow.bench.impl_mpi`) with

* ``missing() -> str | None``: why it cannot run here and how to install it, or ``None``;
* ``unsupported(collective, dtype, op) -> str | None``: why it cannot run this operation;
* ``connect(timeout) -> Ranks``: join the job (inside a rank process).

Their optional libraries (torch, mpi4py) are imported only inside ``connect``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Protocol

import numpy as np

from commflow.bench.cases import Case
from commflow.collectives import Collective
from commflow.errors import CommflowError
from commflow.ir import Program

IMPLS = ("commflow", "gloo", "mpi")
"""Implementation names, as ``--vs`` and the JSON ``impl`` field spell them."""

PEER_ALGO = "default"
"""The ``algo`` recorded for a peer library: its own choice of algorithm."""


class Ranks(Protocol):
    """One rank's handle on an implementation's job."""

    rank: int
    """This rank."""
    nranks: int
    """Number of ranks in the job."""

    def barrier(self) -> None:
        """Return once every rank has entered the barrier."""

    def operation(self, algo: str | Program, case: Case) -> Callable[[], object]:
        """A call that runs ``case``'s collective once on its buffers with ``algo`` (a name,
        or for commflow a :class:`~commflow.ir.Program`)."""

    def close(self) -> None:
        """Leave the job."""


def module(name: str) -> ModuleType:
    """The module of implementation ``name``; ``CommflowError`` listing the known ones."""
    if name not in IMPLS:
        raise CommflowError(f"unknown implementation {name!r}; use one of {', '.join(IMPLS)}")
    return importlib.import_module(f"commflow.bench.impl_{name}")


def via_recv(case: Case, run: Callable[[], object]) -> Callable[[], object]:
    """``run`` for APIs that only work in place on the receive buffer (broadcast and reduce
    in torch.distributed and commflow, broadcast in MPI): out of place, the ranks whose input
    it reads first copy their send buffer into the receive buffer, inside the timed call, as
    a user of that API pays it."""
    spec = case.spec
    if spec.inplace or (spec.collective is Collective.BROADCAST and spec.rank != spec.root):
        return run

    def copy_then_run() -> object:
        np.copyto(case.recv, case.send)
        return run()

    return copy_then_run
