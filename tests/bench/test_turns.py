"""The order in which ``commflow bench`` times its algorithms (``bench.worker._measure``): each
drawn order is followed by its reverse, so within rounds every algorithm follows each other
as often as it precedes it, and the orders differ between runs (seeds), sizes and placements."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from commflow.bench.spec import RunSpec
from commflow.bench.worker import _measure

NAMES = ("auto", "shm", "ring", "direct", "bruck")


class _Ranks:
    """A rank whose calls only log the algorithm they run."""

    rank = 0

    def __init__(self) -> None:
        self.log: list[str] = []

    def barrier(self) -> None:
        pass

    def operation(self, algo: str, case):
        return lambda: self.log.append(algo)


def _case(block: int, inplace: bool):
    return SimpleNamespace(spec=SimpleNamespace(block=block, inplace=inplace), expected=None,
                           prepare=lambda: None, wrong=lambda: 0)


def _rounds(seed: int, block: int = 4, inplace: bool = False,
            count: int = 20) -> list[tuple[str, ...]]:
    spec = RunSpec(impl="commflow", collective="allgather", algos=NAMES, blocks=(block,),
                   dtype="float32", op="sum", root=0, warmup=0, iters=20, small_iters=200,
                   timeout=1.0, seed=seed)
    ranks = _Ranks()
    results = _measure(ranks, spec, [(n, n) for n in NAMES], _case(block, inplace), count)
    assert [r["algo"] for r in results] == list(NAMES)
    assert all(len(r["times"]) == count for r in results)
    log = ranks.log
    return [tuple(log[i:i + len(NAMES)]) for i in range(0, len(log), len(NAMES))]


def test_each_order_is_followed_by_its_reverse_so_successions_balance():
    rounds = _rounds(seed=7)
    assert len(rounds) == 20 and all(sorted(r) == sorted(NAMES) for r in rounds)
    assert all(rounds[i + 1] == rounds[i][::-1] for i in range(0, 20, 2))
    follows = Counter((r[k - 1], r[k]) for r in rounds for k in range(1, len(r)))
    assert all(follows[(a, b)] == follows[(b, a)] for a in NAMES for b in NAMES)


def test_orders_differ_between_runs_sizes_and_placements():
    first = _rounds(seed=7)
    assert _rounds(seed=7) == first  # every rank of a run draws the same
    assert _rounds(seed=8) != first
    assert _rounds(seed=7, block=16) != first
    assert _rounds(seed=7, inplace=True) != first


def test_any_number_of_rounds_takes_the_same_turns_as_a_longer_run_begins_with():
    # --small-iters runs more rounds at small sizes: the same pairs, reversed, continued
    long = _rounds(seed=7, count=200)
    assert len(long) == 200 and all(long[i + 1] == long[i][::-1] for i in range(0, 200, 2))
    assert _rounds(seed=7, count=7) == long[:7] and _rounds(seed=7) == long[:20]
