"""The fast path's variants (segment size, one-shot threshold): names, what they cut alike,
exact results on real ranks, and the signature check between ranks that run different ones."""

from __future__ import annotations

import numpy as np
import pytest

from commflow.collectives import Collective
from commflow.errors import AlgorithmError
from commflow.runtime import variants
from commflow.runtime.errors import CommMismatchError
from commflow.runtime.variants import ONE_SHOT, SEGMENT, Variant, effective, variant

from .harness import bits_differ, run_world

# Tiny segments and thresholds, so that small arrays cross every boundary: several segments,
# a one-shot first segment and a two-shot one, a call one-shot whole above the default.
VARIANTS = ("shm", "shm:segment=4K", "shm:segment=1K:one_shot=2K", "shm:one_shot=512K",
            "shm:segment=8K:one_shot=4K:spin=0",  # two ranks: 8K segments in 4K halves
            "shm:segment=8K:one_shot=4K:store=stream")  # the same, streamed out
COUNTS = (1, 777, 5000, 70_001)


def test_names_round_trip_and_drop_defaults():
    v = variant("shm:segment=2M:one_shot=1M")
    assert v == Variant(one_shot=1 << 20, segment=2 << 20)
    assert v.name == "shm:one_shot=1M:segment=2M"
    assert variant(v.name) == v
    assert variant("shm").name == "shm" and variant(f"shm:segment={SEGMENT}") == variants.DEFAULT
    assert Variant(segment=1000).name == "shm:segment=1000"
    assert variant("shm:spin=0:segment=1M").name == "shm:segment=1M:spin=0"
    assert variant("shm:store=stream:segment=1M").name == "shm:segment=1M:store=stream"
    for bad in ("shm:foo=1K", "shm:segment", "shm:segment=0", "shm:segment=1K:segment=2K",
                "shmx", "shm:one_shot=-4", "shm:store=1K", "shm:store=fast"):
        with pytest.raises(AlgorithmError):
            variant(bad)


def test_effective_names_a_call_by_how_it_is_cut():
    AR, AG, RS = Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCESCATTER
    big = Variant(one_shot=1 << 20, segment=2 << 20)
    # one-shot whole under both: the defaults (the compiled small-message path)
    assert effective(big, AR, ONE_SHOT, 4) is variants.DEFAULT
    # one segment under both: the segment does not count; the threshold does (4 ranks)
    assert effective(big, AR, 256 << 10, 4) == Variant(one_shot=1 << 20)
    # the threshold counts only for allreduce; on two ranks a given one cuts larger segments
    # in halves, where the defaults reduce every segment whole
    assert effective(big, AG, 4 << 20, 4) == Variant(segment=2 << 20)
    assert effective(big, RS, 256 << 10, 2) == variants.DEFAULT
    assert effective(big, AR, 4 << 20, 2) == big
    assert effective(Variant(one_shot=1 << 20), AR, 1 << 20, 2) == Variant(one_shot=1 << 20)
    # the default threshold given by name is the default on more than two ranks only
    assert effective(Variant(one_shot=ONE_SHOT), AR, 4 << 20, 4) == variants.DEFAULT
    assert effective(Variant(one_shot=ONE_SHOT), AR, 4 << 20, 2) == Variant(one_shot=ONE_SHOT)
    assert effective(big, AR, 4 << 20, 4) == big
    # segments that each stage a call whole cut it alike: named by the least power of two
    for size in (1, 2, 4):
        assert effective(Variant(segment=size << 20), RS, 3 << 18, 2) == Variant(segment=1 << 20)
    assert effective(Variant(segment=4 << 20, spin=0), AG, 3 << 20, 4) == \
        effective(Variant(segment=8 << 20, spin=0), AG, 3 << 20, 4) == Variant(segment=4 << 20,
                                                                               spin=0)
    assert effective(Variant(segment=2 << 20), AG, 3 << 20, 4) == Variant(segment=2 << 20)
    assert effective(Variant(segment=4 << 20, copy=variants.CMA), RS, 1 << 20,
                     2) == Variant(segment=4 << 20, copy=variants.CMA)
    # how a rank waits is kept, but not on the compiled path of small allreduces
    assert effective(Variant(spin=0), AG, 16, 4) == Variant(spin=0)
    assert effective(Variant(spin=0), AR, 16, 4) == variants.DEFAULT
    # streamed stores are kept where staged data is copied out, not where a rank reads its
    # peers' buffers itself
    stream = Variant(store=variants.STREAM)
    assert effective(stream, AG, 4 << 20, 2) is stream
    assert effective(stream, AR, 16, 2) is variants.DEFAULT
    assert effective(Variant(copy=variants.CMA, store=variants.STREAM), AG, 4 << 20,
                     2) == Variant(copy=variants.CMA)


def test_variants_to_tune_are_distinct_and_apply():
    ar = variants.variants(Collective.ALLREDUCE)
    ag = variants.variants(Collective.ALLGATHER)
    assert ar[0] == ag[0] == "shm" and len(set(ar)) == len(ar) and len(set(ag)) == len(ag)
    assert any("one_shot" in n for n in ar) and not any("one_shot" in n for n in ag)
    assert set(ag) < set(ar)
    # single-copy reads save no copy in a reduce-scatter: not among its candidates
    rs = variants.variants(Collective.REDUCESCATTER)
    assert any("copy=cma" in n for n in ag) and not any("copy=cma" in n for n in rs)
    assert set(rs) == {n for n in ag if "copy=cma" not in n}
    assert variants.variants(Collective.ALLTOALL) == []


def _reference(inputs: list[np.ndarray]) -> np.ndarray:
    acc = inputs[0].copy()
    for a in inputs[1:]:
        acc = np.add(acc, a, dtype=acc.dtype)
    return acc


def _exact(comm):
    n, r = comm.size, comm.rank
    wrong = []
    for name in VARIANTS:
        for count in COUNTS:
            for dtype in (np.float32, np.int64, np.float64):
                inputs = [np.random.default_rng(100 * q + count).integers(-9, 10, count * n)
                          .astype(dtype) for q in range(n)]
                total = _reference(inputs)
                mine = inputs[r]
                block = slice(r * count, (r + 1) * count)
                got = {
                    "allreduce": comm.allreduce(mine, algo=name),
                    "allreduce in place": _in_place_allreduce(comm, mine, name),
                    "reduce_scatter": comm.reduce_scatter(mine, algo=name),
                    "allgather": comm.allgather(mine[:count], algo=name),
                    "broadcast": comm.broadcast(mine.copy(), n - 1, algo=name),
                    # ranks in and out of place in one call (each rank's own block differs)
                    "reduce_scatter, some ranks in place": _scattered(comm, mine, name, count),
                    "allgather, some ranks in place": _gathered(comm, mine[:count], name),
                }
                gathered = np.concatenate([a[:count] for a in inputs])
                want = {"allreduce": total, "allreduce in place": total,
                        "reduce_scatter": total[block], "allgather": gathered,
                        "broadcast": inputs[n - 1],
                        "reduce_scatter, some ranks in place": total[block],
                        "allgather, some ranks in place": gathered}
                for what, result in got.items():
                    if not (result.dtype == want[what].dtype
                            and np.array_equal(result, want[what])):
                        wrong.append(f"{name} {what} {np.dtype(dtype)} count={count}")
        wrong += bits_differ(comm, name)
    return wrong


def _in_place_allreduce(comm, mine: np.ndarray, name: str) -> np.ndarray:
    buf = mine.copy()
    comm.allreduce(buf, algo=name, out=buf)
    return buf


def _placed(comm, count: int) -> bool:
    """Whether this rank's call with ``count`` elements per block runs in place (ranks of
    both kinds in every call)."""
    return (comm.rank + count) % 2 == 1


def _scattered(comm, mine: np.ndarray, name: str, count: int) -> np.ndarray:
    buf = mine.copy()
    block = buf[comm.rank * count:(comm.rank + 1) * count]
    return comm.reduce_scatter(buf, algo=name, out=block if _placed(comm, count) else None)


def _gathered(comm, part: np.ndarray, name: str) -> np.ndarray:
    n, r, count = comm.size, comm.rank, len(part)
    out = np.zeros(n * count, part.dtype)
    if not _placed(comm, count):
        comm.allgather(part, algo=name, out=out)
        return out
    block = out[r * count:(r + 1) * count]
    block[...] = part
    comm.allgather(block, algo=name, out=out)
    return out


@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_every_variant_is_exact_on_every_rank(nranks):
    results = run_world(_exact, nranks, timeout=120)
    failures = [f for per_rank in results for f in per_rank]
    assert not failures, "\n".join(failures[:20])


def _alone(comm) -> list[str]:
    x = np.arange(300_000, dtype=np.float32)  # 1.2 MB: several 64K segments
    wrong = []
    for name in ("shm:segment=64K", "shm:one_shot=1M:segment=64K"):  # two-shot, one-shot
        if not np.array_equal(comm.allreduce(x, algo=name), x):
            wrong.append(f"{name} allreduce")
        placed = x.copy()
        comm.reduce_scatter(placed, algo=name, out=placed)
        if not (np.array_equal(comm.reduce_scatter(x, algo=name), x)
                and np.array_equal(placed, x)):
            wrong.append(f"{name} reduce_scatter")
    return wrong


def test_one_rank_reduces_to_its_own_data():
    """With no peer every reduction is a copy of the rank's own block (in place: none)."""
    assert run_world(_alone, 1, timeout=60) == [[]]


def _mixed(comm, size: int):
    name = "shm" if comm.rank == 0 else "shm:one_shot=1M"
    comm.allreduce(np.ones(size // 4, np.float32), algo=name)


def test_ranks_that_cut_a_call_differently_fail_with_a_mismatch():
    # 256 KiB: two-shot by default, one-shot under the variant
    results = run_world(_mixed, 3, 256 << 10, expect_failure=True, timeout=20)
    assert all(not ok for ok, _ in results)
    assert any(CommMismatchError.__name__ in text for _, text in results)
    # 4 KiB: one-shot under both, so the same call
    assert run_world(_mixed, 3, 4 << 10, timeout=20) == [None] * 3
