"""Several rings side by side, each over its own share of the data and its own rank order:
NCCL's channels. :func:`commflow.topology.nccl_rings` gives the rings NCCL would build: on
clusters with a NIC per GPU one ring per local rank, crossing boxes rail to rail, so the
rings together use every NIC; in boxes of direct links (DGX-1, MI250) cycles over disjoint
NVLinks/xGMI links. This is the baseline users actually run, where a single ring crosses
boxes through one NIC and uses one NVLink per GPU.

Cost: with ``k`` rings of orders whose slowest hop has bandwidth ``b_i``, the ring algorithm's
cost on ``n/k`` bytes each, the slowest ring setting the time (allreduce:
``2(p-1)a + 2(p-1)/p * n/k / min_i b_i``).
"""

from __future__ import annotations

from collections.abc import Sequence

from commflow.algorithms import ring
from commflow.algorithms.registry import register
from commflow.collectives import Collective
from commflow.errors import AlgorithmError
from commflow.ir import Program
from commflow.ir.transform import relabel, stack


def generate(
    collective: Collective,
    nranks: int,
    *,
    chunks: int = 1,
    channels: int = 1,
    root: int | None = None,
    orders: Sequence[Sequence[int]] | None = None,
) -> Program:
    """``len(orders)`` rings (default: ``channels`` rings in rank order), ring ``i`` laid out
    along ``orders[i]`` (see :func:`commflow.ir.transform.relabel`), each pipelined in
    ``chunks``, stacked over shares of the data (:func:`commflow.ir.transform.stack`).
    Raises ``AlgorithmError`` for an empty or malformed ``orders``."""
    orders = [tuple(range(nranks))] * channels if orders is None else [tuple(o) for o in orders]
    if not orders:
        raise AlgorithmError("multi_ring: give at least one order")
    for order in orders:
        if sorted(order) != list(range(nranks)):
            raise AlgorithmError(f"multi_ring: every order must be a permutation of "
                                 f"0..{nranks - 1}, got {list(order)}")
    rings = []
    for order in orders:
        position = None if root is None else order.index(root)
        program = ring.generate(collective, nranks, chunks=chunks, channels=1, root=position)
        rings.append(relabel(program, order))
    result = stack(rings, name="multi_ring")
    params = {**dict(result.params), "rings": len(orders), "chunks": chunks}
    return Program(result.name, result.collective, result.nranks, result.chunk_factor,
                   result.root, result.participants, result.table, tuple(sorted(params.items())))


register(
    [Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCESCATTER],
    "multi_ring",
    generate,
    "k rings over shares of the data, each its own order (NCCL channels; rails across boxes):"
    " ring cost on n/k bytes",
    params=("orders",),
)
