"""Every registered algorithm verifies, and computes the right numbers, wherever it applies.

Verification (symbolic) runs for nranks 1..17, chunks and channels in {1, 2}, and for rooted
collectives the roots 0 and the last rank; the numpy interpreter checks
a few instances of each algorithm.
"""

from __future__ import annotations

import itertools

import pytest

from commflow.algorithms import available, build
from commflow.collectives import Collective
from commflow.errors import AlgorithmError
from commflow.ir import verify

from .interpret import check_numerically

ALGORITHMS = [a.key for a in available()]


def _roots(collective: Collective, nranks: int) -> list[int | None]:
    if not collective.rooted:
        return [None]
    return sorted({0, nranks - 1})


def _instances(key: str, nranks: int):
    collective, name = key.split("/")
    coll = Collective(collective)
    for chunks, channels in itertools.product((1, 2), (1, 2)):
        for root in _roots(coll, nranks):
            try:
                program = build(coll, name, nranks, chunks=chunks, channels=channels, root=root)
            except AlgorithmError:
                continue
            yield program


@pytest.mark.parametrize("nranks", range(1, 18))
@pytest.mark.parametrize("key", ALGORITHMS)
def test_verifies(key, nranks):
    for program in _instances(key, nranks):
        verify(program)
        assert program.name == key.split("/")[1]


@pytest.mark.parametrize("key", ALGORITHMS)
def test_applies_to_powers_of_two(key):
    collective, name = key.split("/")
    for nranks in (1, 2, 4, 8, 16):
        verify(build(collective, name, nranks))


@pytest.mark.parametrize("nranks", [1, 3, 6, 8])
@pytest.mark.parametrize("key", ALGORITHMS)
def test_numerically_equal_to_numpy(key, nranks):
    for seed, program in enumerate(_instances(key, nranks)):
        check_numerically(program, seed=seed)
