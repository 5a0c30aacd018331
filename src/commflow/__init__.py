"""commflow: the communication side of distributed deep-learning training.

A collective algorithm is a :class:`Program` (per-rank channels of send, receive, reduce and
copy steps) that is verified (:func:`verify`), simulated on a topology (:func:`simulate`),
compared with what no algorithm can beat (:func:`lower_bound`), saved as JSON
(:func:`save_program`) and exported to MSCCL (:func:`to_msccl_xml`)::

    import commflow

    topo = commflow.load_topology("dgx1")
    program = commflow.build_for("allreduce", "ring", topo)  # laid along the fastest links
    commflow.verify(program)
    result = commflow.simulate(program, topo, 64 << 20)
    bound = commflow.lower_bound("allreduce", topo, 64 << 20)

Run collectives for real between processes with ``comm = commflow.init()`` (see
:mod:`commflow.runtime`). Subpackages: :mod:`commflow.topology`, :mod:`commflow.algorithms`,
:mod:`commflow.ir`, :mod:`commflow.sim`, :mod:`commflow.runtime`; the names below are their
main entry points, imported on first use so that ``import commflow`` stays cheap (no scipy
until a simulation or bound is asked for).
Units: bytes, seconds and bytes/second throughout; every error is a :class:`CommflowError`.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "CommflowError": "commflow.errors",
    "TopologyError": "commflow.errors",
    "ProgramError": "commflow.errors",
    "VerificationError": "commflow.errors",
    "AlgorithmError": "commflow.errors",
    "SimulationError": "commflow.errors",
    "Collective": "commflow.collectives",
    "Program": "commflow.ir",
    "ProgramBuilder": "commflow.ir",
    "verify": "commflow.ir",
    "to_json": "commflow.ir",
    "from_json": "commflow.ir",
    "save_program": "commflow.ir",
    "load_program": "commflow.ir",
    "to_msccl_xml": "commflow.ir",
    "build": "commflow.algorithms",
    "build_for": "commflow.algorithms",
    "available": "commflow.algorithms",
    "Topology": "commflow.topology",
    "load_topology": "commflow.topology:load",
    "simulate": "commflow.sim",
    "lower_bound": "commflow.sim",
    "init": "commflow.runtime",
    "Communicator": "commflow.runtime",
    "CommError": "commflow.runtime",
    "CommTimeoutError": "commflow.runtime",
    "CommMismatchError": "commflow.runtime",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    """Import an entry point (or a subpackage) on first access."""
    target = _EXPORTS.get(name)
    if target is None:
        if name in ("topology", "algorithms", "ir", "sim", "runtime", "cli", "collectives",
                    "units"):
            return importlib.import_module(f"commflow.{name}")
        raise AttributeError(f"module 'commflow' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    value = getattr(importlib.import_module(module), attr or name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
