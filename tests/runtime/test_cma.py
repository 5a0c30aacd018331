"""The single-copy fast path (``shm:copy=cma``): names, exact results against numpy on real
ranks for every collective, dtype and placement, the signature check against the staged
path, and the error when the kernel refuses cross-memory access."""

from __future__ import annotations

import errno
import re
from pathlib import Path

import numpy as np
import pytest

from commflow.collectives import Collective
from commflow.errors import AlgorithmError
from commflow.runtime import _cma, cma, dtype_of, variants
from commflow.runtime.variants import CMA, Variant, effective, variant
from commflow.tune.online import candidates

from .harness import bits_differ, run_world

# one_shot=1: every allreduce above one byte reads peers; 4K segments: several per call
EVERY = "shm:one_shot=1:segment=4K:copy=cma"
DTYPES = ("float32", "float64", "int32", "int64", "int8", "uint8", "float16", "bfloat16", "bool")


def test_names_and_what_a_call_runs_as():
    assert Variant(copy=CMA).name == "shm:copy=cma"
    assert variant("shm:segment=2M:copy=cma") == Variant(segment=2 << 20, copy=CMA)
    assert variant(EVERY).name == EVERY
    with pytest.raises(AlgorithmError, match="copy must be 'stage' or 'cma'"):
        variant("shm:copy=dma")
    AR, AG, RS = Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCESCATTER
    cma_2m = Variant(segment=2 << 20, copy=CMA)
    # small allreduces stage one-shot (the compiled path); larger ones read peers
    assert effective(cma_2m, AR, 64 << 10, 2) is variants.DEFAULT
    assert effective(Variant(one_shot=1 << 20, copy=CMA), AR, 512 << 10, 4) == \
        Variant(one_shot=1 << 20)
    assert effective(cma_2m, AR, 8 << 20, 2) == cma_2m
    # an out-of-place allgather copies and reads a segment at a time; a broadcast reads once
    assert effective(cma_2m, AG, 8 << 20, 2) == cma_2m
    assert effective(cma_2m, Collective.BROADCAST, 8 << 20, 2) == Variant(copy=CMA)
    assert effective(cma_2m, RS, 8 << 20, 4) == cma_2m
    assert "shm:copy=cma" in variants.variants(AG)
    assert not any("cma" in n for n in variants.variants(AG, cma=False))


def _exact(comm):
    n, r = comm.size, comm.rank
    wrong = []
    for name in (EVERY, "shm:copy=cma"):
        for count in (1, 1000, 70_001):
            for dtype in map(dtype_of, DTYPES):
                rng = [np.random.default_rng(1000 * q + count) for q in range(n)]
                inputs = [g.integers(0 if dtype == np.bool_ else -3, 4, count * n)
                          .astype(dtype) for g in rng]
                op = "sum" if count != 1000 or dtype == np.bool_ else "max"
                total = inputs[0].copy()
                for a in inputs[1:]:
                    (np.logical_or if dtype == np.bool_ else np.add if op == "sum"
                     else np.maximum)(total, a, out=total)
                mine, block = inputs[r], slice(r * count, (r + 1) * count)
                in_place = mine.copy()
                comm.allreduce(in_place, op, algo=name, out=in_place)
                scattered = mine.copy()
                comm.reduce_scatter(scattered, op, algo=name, out=scattered[block])
                gathered = np.zeros(n * count, dtype)
                gathered[block] = mine[:count]
                comm.allgather(gathered[block], algo=name, out=gathered)
                got = {
                    "allreduce": comm.allreduce(mine, op, algo=name),
                    "allreduce in place": in_place,
                    "reduce_scatter": comm.reduce_scatter(mine, op, algo=name),
                    "reduce_scatter in place": scattered[block],
                    "allgather": comm.allgather(mine[:count], algo=name),
                    "allgather in place": gathered,
                    "broadcast": comm.broadcast(mine.copy(), n - 1, algo=name),
                }
                want = {"allreduce": total, "allreduce in place": total,
                        "reduce_scatter": total[block], "reduce_scatter in place": total[block],
                        "allgather": np.concatenate([a[:count] for a in inputs]),
                        "allgather in place": np.concatenate([a[:count] for a in inputs]),
                        "broadcast": inputs[n - 1]}
                for what, result in got.items():
                    if not (result.dtype == dtype and np.array_equal(result, want[what])):
                        wrong.append(f"{name} {what} {dtype} {op} count={count}")
        wrong += bits_differ(comm, name)
    return wrong


@pytest.mark.parametrize("nranks", [2, 4])
def test_every_collective_dtype_and_placement_is_exact(nranks):
    failures = [f for per_rank in run_world(_exact, nranks, timeout=120) for f in per_rank]
    assert not failures, "\n".join(failures[:20])


def _mixed_placement(comm):
    n, r, count = comm.size, comm.rank, 50_001
    inputs = [np.arange(count, dtype=np.int64) * (q + 1) for q in range(n)]
    out = np.zeros(n * count, np.int64)
    block = out[r * count:(r + 1) * count]
    block[...] = inputs[r]
    send = block if r % 2 else inputs[r]  # odd ranks in place, even ranks out of place
    comm.allgather(send, algo="shm:segment=64K:copy=cma", out=out)
    after = comm.allgather(np.full(3, r), algo="shm")  # the ranks' flags still agree
    return np.array_equal(out, np.concatenate(inputs)) and after.tolist() == \
        [q for q in range(n) for _ in range(3)]


def test_an_allgather_with_ranks_in_and_out_of_place_is_exact():
    for nranks in (2, 4):
        assert run_world(_mixed_placement, nranks, timeout=20) == [True] * nranks


def _mixed(comm):
    name = "shm" if comm.rank == 0 else "shm:copy=cma"
    comm.allgather(np.ones(1 << 18, np.float32), algo=name)


def test_ranks_on_the_staged_and_the_single_copy_path_fail_with_a_mismatch():
    results = run_world(_mixed, 2, expect_failure=True, timeout=20)
    assert all(not ok for ok, _ in results)
    assert any(text.startswith("CommMismatchError") for _, text in results), results


def _refused(comm):
    if comm.rank == 1:
        _cma.read = lambda *args, **kwargs: errno.EPERM  # as Yama's ptrace_scope 2 answers
    comm.allreduce(np.ones(1 << 16, np.float32), algo="shm:copy=cma")


def test_a_refused_read_names_the_operation_ranks_and_remedy_and_aborts_the_peer():
    (ok0, text0), (ok1, text1) = run_world(_refused, 2, expect_failure=True, timeout=20)
    assert not ok0 and not ok1
    assert text1.startswith("CrossMemoryError: allreduce #0 (shm:copy=cma) on rank 1: "
                            "process_vm_readv of 131072 bytes from rank 0"), text1
    assert "EPERM (Operation not permitted)" in text1 and "algo='shm'" in text1, text1
    assert text0.startswith("CommAbortedError") and "aborted by rank 1" in text0, text0


def _tuner_view(comm, refuse: bool):
    if refuse and comm.rank == 1:
        _cma.probe = lambda pid: errno.EPERM
    return cma.permitted(comm), candidates(comm, Collective.ALLGATHER)


def test_the_tuner_skips_the_variant_where_a_rank_may_not_read_its_peers():
    allowed = run_world(_tuner_view, 2, False, timeout=20)
    refused = run_world(_tuner_view, 2, True, timeout=20)
    assert all(ok and "shm:copy=cma" in names for ok, names in allowed)
    assert all(not ok and not any("cma" in n for n in names) for ok, names in refused)
    assert refused[0][1] == refused[1][1]


def _docs_block(comm):
    page = (Path(__file__).resolve().parents[2] / "docs" / "runtime.md").read_text()
    block = re.search(r"```python\n(.*?)```", page.split("## Single-copy reads", 1)[1],
                      re.DOTALL)[1]
    scope = {"comm": comm, "np": np}
    exec(block, scope)
    x = np.arange(1 << 20, dtype=np.float32)
    return (np.array_equal(scope["everyone"], np.concatenate([x, 2 * x]))
            and np.array_equal(scope["total"], 3 * x))


def test_the_runtime_page_example_runs_and_is_exact():
    assert run_world(_docs_block, 2, timeout=20) == [True, True]
