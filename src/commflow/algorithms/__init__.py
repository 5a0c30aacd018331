"""Predefined collective algorithms as program generators, one module per family.

``build(collective, name, nranks, **params)`` generates a program; ``build_for(collective,
name, topology)`` generates it for a topology's ranks with topology-aware defaults;
``available(collective)`` lists what is registered.
"""

from commflow.algorithms import (  # noqa: F401 (imported to register the families)
    binomial_tree,
    bruck,
    direct,
    double_binary_tree,
    halving_doubling,
    hierarchical,
    in_network,
    multi_ring,
    pairwise,
    recursive_doubling,
    ring,
    torus2d,
)
from commflow.algorithms.in_network import aggregation_trees
from commflow.algorithms.placement import build_for
from commflow.algorithms.registry import Algorithm, available, build, get, register

__all__ = ["Algorithm", "aggregation_trees", "available", "build", "build_for", "get",
           "register"]
