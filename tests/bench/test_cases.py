"""Benchmark buffers: exact expected values, nccl-tests in-place aliasing, and the reset that
makes every element to be received wrong until the collective delivers it.

Each collective is carried out here with numpy on the ranks' send buffers (an independent
reference), written into the receive buffers, and must then check as all right.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from commflow.bench.cases import Case, CaseSpec, block_elements, size_bytes
from commflow.collectives import Collective
from commflow.runtime import dtype_of

DTYPES = ("float32", "float16", "bfloat16", "int8", "uint8", "int64", "bool")


def _ops(dtype: str) -> tuple[str, ...]:
    return (
        ("sum", "prod", "min", "max", "avg")
        if dtype.startswith(("float", "bfloat"))
        else ("sum", "prod", "min", "max")
    )


def _cases(coll, n, block, dtype, op, inplace, root):
    return [
        Case(
            CaseSpec(
                collective=coll,
                nranks=n,
                rank=r,
                block=block,
                dtype=dtype_of(dtype),
                op=op,
                root=root,
                inplace=inplace,
            )
        )
        for r in range(n)
    ]


def _reduce(arrays, op):
    acc = arrays[0].astype(np.float64)
    for a in arrays[1:]:
        b = a.astype(np.float64)
        if arrays[0].dtype == np.bool_:
            acc = np.maximum(acc, b) if op in ("sum", "max") else np.minimum(acc, b)
        else:
            acc = {
                "sum": np.add,
                "avg": np.add,
                "prod": np.multiply,
                "min": np.minimum,
                "max": np.maximum,
            }[op](acc, b)
    if op == "avg":
        acc = acc / len(arrays)
    return acc.astype(arrays[0].dtype)


def _deliver(coll, cases, root):
    """Carry out the collective with numpy, from the send buffers into the receive buffers."""
    c = cases[0].spec.block
    op = cases[0].spec.op
    sends = [k.send.copy() for k in cases]
    for r, k in enumerate(cases):
        if coll is Collective.ALLREDUCE or (coll is Collective.REDUCE and r == root):
            k.recv[...] = _reduce(sends, op)
        elif coll is Collective.BROADCAST:
            k.recv[...] = sends[root]
        elif coll is Collective.ALLGATHER or (coll is Collective.GATHER and r == root):
            k.recv[...] = np.concatenate(sends)
        elif coll is Collective.REDUCESCATTER:
            k.recv[...] = _reduce([s[r * c : (r + 1) * c] for s in sends], op)
        elif coll is Collective.SCATTER:
            k.recv[...] = sends[root][r * c : (r + 1) * c]
        elif coll is Collective.ALLTOALL:
            k.recv[...] = np.concatenate([s[r * c : (r + 1) * c] for s in sends])


@pytest.mark.parametrize("coll", list(Collective))
def test_numpy_reference_results_check_as_right(coll):
    for n, block, dtype, inplace in itertools.product((1, 2, 3, 5), (1, 7), DTYPES, (False, True)):
        for op in _ops(dtype):
            root = n - 1
            cases = _cases(coll, n, block, dtype, op, inplace, root)
            for k in cases:
                k.prepare()
            _deliver(coll, cases, root)
            assert [k.wrong() for k in cases] == [0] * n, (n, block, dtype, op, inplace)


@pytest.mark.parametrize("coll", list(Collective))
def test_reset_makes_what_must_arrive_wrong(coll):
    n, c, root = 3, 5, 1
    for inplace in (False, True):
        cases = _cases(coll, n, c, "float32", "sum", inplace, root)
        _deliver(coll, cases, root)
        for r, k in enumerate(cases):
            k.prepare()
            if k.expected is None:
                assert coll in (Collective.REDUCE, Collective.GATHER) and r != root
            elif not inplace:
                assert k.wrong() == k.expected.size
            elif coll in (Collective.ALLGATHER, Collective.GATHER):
                assert k.wrong() == (n - 1) * c  # every block but this rank's own input
            elif r != root or coll not in (Collective.BROADCAST, Collective.SCATTER):
                # in place, parts of this rank's input may equal the result by chance, but
                # what the other ranks contribute has not arrived
                assert k.wrong() >= 1, (coll, r)


def test_in_place_aliasing_follows_nccl_tests():
    ag = _cases(Collective.ALLGATHER, 4, 3, "int32", "sum", True, 0)[2]
    assert np.shares_memory(ag.send, ag.recv) and ag.recv.size == 12 and ag.send.size == 3
    assert (
        ag.send.__array_interface__["data"][0] == ag.recv.__array_interface__["data"][0] + 2 * 3 * 4
    )
    rs = _cases(Collective.REDUCESCATTER, 4, 3, "int32", "sum", True, 0)[1]
    assert (
        rs.recv.__array_interface__["data"][0] == rs.send.__array_interface__["data"][0] + 1 * 3 * 4
    )
    ar = _cases(Collective.ALLREDUCE, 4, 3, "int32", "sum", True, 0)[0]
    assert ar.send is ar.recv
    oop = _cases(Collective.ALLREDUCE, 4, 3, "int32", "sum", False, 0)[0]
    assert not np.shares_memory(oop.send, oop.recv)


def test_expected_values_are_the_closed_forms():
    # allreduce sum over n ranks of (r + g) mod n + 1 + g mod 3 = n(n+1)/2 + n (g mod 3)
    n = 4
    k = _cases(Collective.ALLREDUCE, n, 9, "float16", "sum", False, 0)[0]
    g = np.arange(9)
    assert np.array_equal(k.expected, (n * (n + 1) // 2 + n * (g % 3)).astype(np.float16))
    avg = _cases(Collective.ALLREDUCE, n, 9, "float32", "avg", False, 0)[0]
    assert np.array_equal(avg.expected, ((n + 1) / 2 + g % 3).astype(np.float32))
    # prod: each rank with (r + g) mod 3 == 0 contributes a 2
    prod = _cases(Collective.ALLREDUCE, n, 9, "int32", "prod", False, 0)[0]
    twos = [sum((r + x) % 3 == 0 for r in range(n)) for x in g]
    assert prod.expected.tolist() == [2**t for t in twos]


def test_sizes_round_to_whole_elements_and_blocks():
    assert block_elements(Collective.ALLREDUCE, 4, 8, 4) == 2
    assert block_elements(Collective.ALLGATHER, 4, 8, 4) == 1  # rounded up to one element
    assert block_elements(Collective.ALLGATHER, 4, 1 << 20, 4) == 65536
    assert size_bytes(Collective.ALLGATHER, 4, 1, 4) == 16
    assert size_bytes(Collective.BROADCAST, 4, 5, 2) == 10
