"""Remembered syntheses: within a :func:`remembered` block, asking again for a program made
before (same arguments, equal topology) returns it instead of synthesizing it again, and so
for a fractional packing's column generation (same edges and roots).

A runtime's search (:func:`~commflow.synth.synthesize_for`) asks for the same candidates for
every target and size range; programs and packings are immutable (read-only step tables,
frozen records), so sharing one is safe. Outside such a block nothing is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from commflow.topology.graph import Topology

_MADE: ContextVar[dict[Hashable, object] | None] = ContextVar("commflow_synth_made",
                                                              default=None)
T = TypeVar("T")


@contextmanager
def remembered() -> Iterator[None]:
    """Remember what :func:`recall` makes until the outermost such block ends."""
    if _MADE.get() is not None:
        yield
        return
    token = _MADE.set({})
    try:
        yield
    finally:
        _MADE.reset(token)


def recall(key: Hashable, make: Callable[[], T]) -> T:
    """``make()``, or within a :func:`remembered` block what it returned for ``key`` before
    (nothing is kept for an unhashable key, or when ``make`` raises)."""
    made = _MADE.get()
    if made is None:
        return make()
    try:
        return made[key]  # type: ignore[return-value]
    except KeyError:
        made[key] = value = make()
        return value
    except TypeError:
        return make()


def topology_key(topology: Topology) -> Hashable:
    """What makes two topologies the same to a synthesis: name, nodes and links (with their
    bandwidths and latencies)."""
    return topology.name, topology.nodes, topology.links
