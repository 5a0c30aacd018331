"""Every collective x algorithm x dtype x op on 1-5 real ranks equals a numpy reference.

Inputs are small integers (also for floats), so every result is exact whatever the reduction
order; ``test_float_sums_within_reduction_order_tolerance`` covers arbitrary floats.
"""

from __future__ import annotations

import numpy as np
import pytest

from commflow import algorithms
from commflow.collectives import Collective
from commflow.errors import AlgorithmError
from commflow.runtime import OPS, algorithm_names, dtype_of

from .harness import run_world

DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64", "bool")
COUNTS = (1, 37)


def _ops(dtype: np.dtype, reduces: bool) -> tuple[str, ...]:
    if not reduces:
        return ("sum",)
    if dtype.kind in "iub":
        return tuple(o for o in OPS if o != "avg")
    return OPS


def _input(rank: int, count: int, dtype: np.dtype, op: str, nranks: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + count)
    if dtype == np.bool_:
        return rng.integers(0, 2, count * nranks).astype(bool)
    values = rng.choice([-2, -1, 1, 2] if op == "prod" else np.arange(-4, 5), count * nranks)
    if dtype.kind == "u":
        values = np.abs(values)
    return values.astype(dtype)


def _reduce(arrays: list[np.ndarray], op: str) -> np.ndarray:
    acc = arrays[0].copy()
    for a in arrays[1:]:
        if acc.dtype == np.bool_:
            acc = (acc | a) if op in ("sum", "max") else (acc & a)
        else:
            acc = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum,
                   "max": np.maximum}[op](acc, a, dtype=acc.dtype)
    if op == "avg":
        acc = np.divide(acc, len(arrays), dtype=acc.dtype)
    return acc


def _cases(nranks: int):
    for coll in Collective:
        for name in ["auto", *algorithm_names(coll)]:
            try:
                if name not in ("auto", "shm"):
                    algorithms.build(coll, name, nranks)
            except AlgorithmError:
                continue
            roots = sorted({0, nranks - 1}) if coll.rooted else [0]
            for dt in DTYPES:
                dtype = dtype_of(dt)
                for op in _ops(dtype, coll.reduces):
                    for root in roots:
                        yield coll, name, dt, op, root


def _check_all(comm) -> list[str]:
    n, r = comm.size, comm.rank
    failures = []
    for coll, name, dt, op, root in _cases(n):
        dtype = dtype_of(dt)
        for count in COUNTS:
            inputs = [_input(q, count, dtype, op, n) for q in range(n)]
            mine = inputs[r]
            blocks = [[a[j * count:(j + 1) * count] for j in range(n)] for a in inputs]
            if coll is Collective.ALLREDUCE:
                got, want = comm.allreduce(mine, op, algo=name), _reduce(inputs, op)
            elif coll is Collective.REDUCESCATTER:
                got = comm.reduce_scatter(mine, op, algo=name)
                want = _reduce(inputs, op)[r * count:(r + 1) * count]
            elif coll is Collective.ALLGATHER:
                got = comm.allgather(mine[:count], algo=name)
                want = np.concatenate([a[:count] for a in inputs])
            elif coll is Collective.ALLTOALL:
                got = comm.alltoall(mine, algo=name)
                want = np.concatenate([blocks[q][r] for q in range(n)])
            elif coll is Collective.BROADCAST:
                buf = mine.copy()
                got, want = comm.broadcast(buf, root, algo=name), inputs[root]
            elif coll is Collective.REDUCE:
                buf = mine.copy()
                got = comm.reduce(buf, root, op, algo=name)
                want = _reduce(inputs, op) if r == root else mine
            elif coll is Collective.GATHER:
                got = comm.gather(mine[:count], root, algo=name)
                want = np.concatenate([a[:count] for a in inputs]) if r == root else None
            else:
                got = comm.scatter(mine, root, algo=name)
                want = blocks[root][r]
            same = got is None and want is None or (
                got is not None and want is not None and got.dtype == want.dtype
                and np.array_equal(got.view(np.uint8), want.view(np.uint8)))
            if not same:
                failures.append(f"{coll.value}/{name} {dt} {op} root={root} count={count}: "
                                f"got {got!r} want {want!r}")
    return failures


@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 5])
def test_every_collective_algorithm_dtype_op(nranks):
    results = run_world(_check_all, nranks, timeout=120)
    failures = [f for per_rank in results for f in per_rank]
    assert not failures, "\n".join(failures[:20])


def _float_sums(comm):
    rng = np.random.default_rng(comm.rank)
    x = rng.standard_normal(10_001).astype(np.float32)
    return x, comm.allreduce(x, algo="ring"), comm.allreduce(x, algo="recursive_doubling")


def test_float_sums_within_reduction_order_tolerance():
    results = run_world(_float_sums, 3)
    want = np.sum([x for x, _, _ in results], axis=0, dtype=np.float64)
    for _, ring, rd in results:
        np.testing.assert_allclose(ring, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(rd, want, rtol=1e-5, atol=1e-5)
