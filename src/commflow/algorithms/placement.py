"""Instantiating an algorithm for a topology: the rank count, and the defaults a topology
implies (ring order along direct links, box size of hierarchical algorithms)."""

from __future__ import annotations

from commflow.algorithms.registry import build, get
from commflow.collectives import Collective
from commflow.ir import Program
from commflow.topology.graph import Topology
from commflow.topology.rings import nccl_rings, ring_order

INA_CHUNKS = 64
"""Chunks per tree of ``ina`` built for a topology (within 5% of ``size / B`` on a switch
and a fat-tree at large sizes)."""


def build_for(collective: Collective | str, name: str, topology: Topology,
              **params: object) -> Program:
    """Generate algorithm ``name`` for every rank of ``topology``.

    Unless given in ``params``: ``ring`` follows :func:`~commflow.topology.ring_order` (a
    cycle over the fastest direct links, e.g. 0 1 3 2 6 7 5 4 on a DGX-1), ``multi_ring``
    takes :func:`~commflow.topology.nccl_rings` (NCCL's channels), ``ina`` aggregates up the
    topology's switch trees (:func:`~commflow.algorithms.in_network.aggregation_trees`) in
    :data:`INA_CHUNKS` chunks per tree, and
    ``hierarchical`` takes the ranks of one box as its ``box`` when the topology has several
    boxes of equal size. Other parameters go to :func:`~commflow.algorithms.build`.
    """
    algorithm = get(collective, name)
    n = topology.nranks
    if name == "ring" and "order" not in params:
        params["order"] = ring_order(topology)
    if name == "multi_ring" and "orders" not in params:
        params["orders"] = nccl_rings(topology)
    if name == "ina" and "trees" not in params:
        from commflow.algorithms.in_network import aggregation_trees

        params["trees"], params["switch_nodes"] = aggregation_trees(topology)
        params.setdefault("chunks", INA_CHUNKS)
    if "box" in algorithm.params and "box" not in params and topology.nboxes > 1 \
            and n % topology.nboxes == 0:
        params["box"] = n // topology.nboxes
    return build(algorithm.collective, name, n, **params)
