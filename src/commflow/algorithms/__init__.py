"""Predefined collective algorithms as program generators, one module per family.

``build(collective, name, nranks, **params)`` generates a program; ``available(collective)``
lists what is registered.
"""

from commflow.algorithms import binomial_tree, double_binary_tree, hierarchical, torus2d  # noqa: F401
from commflow.algorithms.registry import Algorithm, available, build, get, register

__all__ = ["Algorithm", "available", "build", "get", "register"]
