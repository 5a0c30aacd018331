"""The online tuner's head-to-head rounds: a winner of successive halving replaces what
``auto`` runs without a table only when it is faster by the margin in the final round (4 KiB
pages), again in a re-check with twice the calls (huge pages) and, given traffic, in a round
where another algorithm's call comes before every timed call (measured times injected, so
the rounds are exact)."""

from __future__ import annotations

import numpy as np
import pytest

from commflow.collectives import Collective
from commflow.runtime import programs
from commflow.tune.online import (
    CONTENDERS,
    CUT_MARGIN,
    FINAL_CALLS,
    HUGE,
    MARGIN,
    SMALL,
    halve,
    margin_of,
)

AR = Collective.ALLREDUCE
NAMES = ["shm", "shm:spin=0", "ring", "direct"]
HALVING = {"shm": 10.0, "shm:spin=0": 9.0, "ring": 20.0, "direct": 30.0}


class _Rank:
    """What :func:`halve` needs of a communicator, for one rank alone."""

    size, rank = 2, 0

    def allreduce(self, x: np.ndarray, op: str = "sum") -> np.ndarray:
        return x


def _halve(*heads: dict[str, float], traffic: str | None = None,
           halving: dict[str, float] = HALVING
           ) -> tuple[tuple[str, float], list[tuple[list[str], int, str, str | None]]]:
    """:func:`halve` on :data:`NAMES` with ``shm`` the incumbent, the halving rounds timed as
    ``halving`` and the head-to-head rounds as ``heads``; its answer and the calls the
    head-to-head rounds were asked for (names in turn order, calls of each, pages, the
    algorithm called between timed calls)."""
    asked: list[tuple[list[str], int, str, str | None]] = []

    def measure(comm, collective, x, names, iters, placements, pages=SMALL, between=None):
        asked.append((list(names), iters, pages, between))
        round_ = len(asked) - 7  # two warm-ups, two halving rounds (4, 2 names) x 2 pages
        return dict(halving) if round_ < 0 else dict(heads[round_])

    answer = halve(_Rank(), AR, 4096, NAMES, incumbent="shm", traffic=traffic,
                   measure=measure)
    return answer, asked[6:]


def test_a_winner_that_wins_only_the_final_round_leaves_the_default():
    (best, seconds), heads = _halve({"shm:spin=0": 9.0, "shm": 10.0},
                                    {"shm:spin=0": 9.9, "shm": 10.0})
    assert (best, seconds) == ("shm", 10.0)
    assert heads == [(["shm:spin=0", "shm"], FINAL_CALLS, SMALL, None),
                     (["shm", "shm:spin=0"], 2 * FINAL_CALLS, HUGE, None)]


def test_a_winner_that_wins_both_rounds_by_the_margin_replaces_the_default():
    faster = 10.0 * (1 - MARGIN) - 0.01
    (best, seconds), heads = _halve({"shm:spin=0": 9.0, "shm": 10.0},
                                    {"shm:spin=0": faster, "shm": 10.0})
    assert (best, seconds) == ("shm:spin=0", pytest.approx(faster))
    assert [(calls, pages) for _, calls, pages, _ in heads] == [(FINAL_CALLS, SMALL),
                                                               (2 * FINAL_CALLS, HUGE)]


def test_a_winner_that_loses_among_other_traffic_leaves_the_default():
    """Faster by the margin on quiet buffers of both kinds, but not when a call of another
    algorithm comes before each timed call: ``shm`` stays."""
    faster = {"shm:spin=0": 10.0 * (1 - MARGIN) - 0.01, "shm": 10.0}
    (best, seconds), heads = _halve(faster, faster, {"shm:spin=0": 10.3, "shm": 10.0},
                                    traffic="ring")
    assert (best, seconds) == ("shm", 10.0)
    assert heads[2] == (["shm:spin=0", "shm"], 2 * FINAL_CALLS, SMALL, "ring")
    (best, _), heads = _halve(faster, faster, faster, traffic="ring")
    assert best == "shm:spin=0" and len(heads) == 3


def test_runners_up_ranked_ahead_of_the_default_run_the_same_rounds():
    """``direct`` wins the halving but loses among traffic; ``shm:spin=0``, second in the
    halving and ahead of ``shm``, took turns in every round and, faster by the margin in
    each, replaces the default; ``ring``, ranked behind it, never runs against it."""
    halving = {"direct": 8.0, "shm:spin=0": 9.0, "shm": 10.0, "ring": 20.0}
    faster = 10.0 * (1 - MARGIN) - 0.01
    won = {"direct": faster - 1, "shm:spin=0": faster, "shm": 10.0}
    lost = {"direct": 10.3, "shm:spin=0": faster, "shm": 10.0}
    (best, seconds), heads = _halve(won, won, lost, traffic="ring", halving=halving)
    assert (best, seconds) == ("shm:spin=0", pytest.approx(faster))
    assert heads == [(["direct", "shm:spin=0", "shm"], FINAL_CALLS, SMALL, None),
                     (["shm", "direct", "shm:spin=0"], 2 * FINAL_CALLS, HUGE, None),
                     (["direct", "shm:spin=0", "shm"], 2 * FINAL_CALLS, SMALL, "ring")]
    # the fastest of those that beat the default in every round wins
    (best, _), _ = _halve(won, won, won, traffic="ring", halving=halving)
    assert best == "direct"
    # one that falls out runs no further round
    (best, _), heads = _halve(won, {**won, "shm:spin=0": 9.9}, won, traffic="ring",
                              halving=halving)
    assert best == "direct" and heads[2][0] == ["direct", "shm"]


def test_a_variant_that_only_cuts_otherwise_needs_the_smaller_margin():
    """Faster by 4% in every round: enough for ``shm:spin=0``, which stages and stores as
    ``shm`` does, not for the program ``direct``, ranked first by the halving."""
    assert margin_of("shm:segment=4M:spin=0") == margin_of("shm:one_shot=1M") == CUT_MARGIN
    assert margin_of("shm:copy=cma") == margin_of("shm:segment=2M:store=stream") == MARGIN
    assert margin_of("ring") == MARGIN and CUT_MARGIN < 0.04 < MARGIN
    halving = {"direct": 8.0, "shm:spin=0": 9.0, "shm": 10.0, "ring": 20.0}
    by4 = {"direct": 9.6, "shm:spin=0": 9.6, "shm": 10.0}
    (best, _), heads = _halve(by4, by4, halving=halving)
    assert best == "shm:spin=0" and heads[1][0] == ["shm", "shm:spin=0"]


@pytest.mark.parametrize("contenders", [1, 2, CONTENDERS])
def test_at_most_contenders_names_run_against_the_default(contenders, monkeypatch):
    from commflow.tune import online

    monkeypatch.setattr(online, "CONTENDERS", contenders)
    halving = {"direct": 7.0, "ring": 8.0, "shm:spin=0": 9.0, "shm": 10.0}
    names = ["direct", "ring", "shm:spin=0"][:contenders]
    fast = {n: 1.0 for n in names} | {"shm": 10.0}
    (best, _), heads = _halve(fast, fast, halving=halving)
    assert CONTENDERS == 3 and heads[0][0] == [*names, "shm"] and best == "direct"


def test_a_runner_up_ranked_behind_the_default_never_runs_against_it():
    halving = {"direct": 8.0, "shm": 10.0, "shm:spin=0": 11.0, "ring": 20.0}
    (best, _), heads = _halve({"direct": 9.9, "shm": 10.0}, halving=halving)
    assert best == "shm" and heads == [(["direct", "shm"], FINAL_CALLS, SMALL, None)]


def test_no_traffic_round_where_the_traffic_is_the_default():
    faster = {"shm:spin=0": 10.0 * (1 - MARGIN) - 0.01, "shm": 10.0}
    (best, _), heads = _halve(faster, faster, traffic="shm")
    assert best == "shm:spin=0" and len(heads) == 2


def test_halving_rounds_time_half_their_calls_on_each_kind_of_page():
    """The rounds that halve the names time every survivor on 4 KiB pages and on huge
    pages, half of the calls on each (the mean of the two medians ranks them)."""
    asked: list[tuple[int, int, str]] = []

    def measure(comm, collective, x, names, iters, placements, pages=SMALL, between=None):
        asked.append((len(names), iters, pages))
        slow_on_huge = {"shm": 10.0, "shm:spin=0": 12.0 if pages == HUGE else 9.0,
                        "ring": 20.0, "direct": 30.0}
        return {n: slow_on_huge[n] for n in names}

    best, seconds = halve(_Rank(), AR, 4096, NAMES, iters=4, measure=measure)
    assert asked[2:] == [(4, 2, SMALL), (4, 2, HUGE), (2, 4, SMALL), (2, 4, HUGE)]
    assert (best, seconds) == ("shm", 10.0)  # spin=0: 9 on small pages, 12 on huge


def test_a_winner_that_loses_the_final_round_is_not_rechecked():
    (best, seconds), heads = _halve({"shm:spin=0": 9.8, "shm": 10.0})
    assert (best, seconds) == ("shm", 10.0) and len(heads) == 1


def test_the_incumbent_is_what_auto_runs_without_a_table():
    assert programs.builtin(AR, 1024, fast_path=True) == "shm"
    assert programs.builtin(AR, 1024) == "recursive_doubling"
    assert programs.builtin(AR, 1 << 20) == "ring"
    assert programs.builtin(Collective.REDUCESCATTER, 1024) == "halving_doubling"


class _Recorder(_Rank):
    """A one-rank stand-in that records the buffers each collective call was given and
    what they held, then scribbles over them as a call writes its output."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int | None]] = []
        self.held: list[tuple[np.ndarray, np.ndarray | None]] = []

    def barrier(self) -> None:
        pass

    def _record(self, what: str, x: np.ndarray, out: np.ndarray | None) -> None:
        self.calls.append((what, x.ctypes.data, None if out is None else out.ctypes.data))
        self.held.append((x.copy(), None if out is None else out.copy()))
        (x if out is None else out)[...] = -1.0

    def allreduce(self, x, op: str = "sum", *, algo: str = "auto", out=None):
        if algo == "auto":  # the tuner's own agreement on times
            return x
        self._record("allreduce", x, out)
        return x

    def allgather(self, x, *, algo: str, out=None):
        self._record("allgather", x, out)

    def reduce_scatter(self, x, *, algo: str, out=None):
        self._record("reducescatter", x, out)


@pytest.mark.parametrize("collective", [AR, Collective.ALLGATHER, Collective.REDUCESCATTER])
def test_out_of_place_samples_reuse_one_preallocated_output(collective):
    """Out of place, every timed call writes into the same preallocated output (as
    ``commflow bench`` and DDP do), never a fresh array whose pages each call faults in; in
    place, into the one buffer the input was copied into."""
    from commflow.tune.online import _time

    comm = _Recorder()
    x = np.arange(8, dtype=np.float32)
    times = _time(comm, collective, x, ["shm", "ring"], 3, placements=(False, True))
    assert set(times) == {"shm", "ring"} and all(t >= 0 for t in times.values())
    outside = [c for i, c in enumerate(comm.calls) if i % 2 == 0]
    inside = [c for i, c in enumerate(comm.calls) if i % 2 == 1]
    assert len(outside) == len(inside) == 6
    assert len({out for _, _, out in outside}) == 1 and outside[0][2] is not None
    assert len({src for _, src, _ in outside}) == 1
    assert len({(src, out) for _, src, out in inside}) == 1 and inside[0][1] != x.ctypes.data


@pytest.mark.parametrize("collective", [AR, Collective.ALLGATHER, Collective.REDUCESCATTER])
def test_every_call_is_prepared_as_commflow_bench_prepares_it(collective):
    """Out of place the input holds ``x`` and the output is refilled before every call; in
    place the whole buffer is restored (the input where this rank's data goes, zeros
    elsewhere), whatever the previous call wrote."""
    from commflow.tune.online import _time

    comm = _Recorder()
    x = np.arange(1, 9, dtype=np.float32)
    _time(comm, collective, x, ["shm", "ring"], 2, placements=(False, True))
    outside, inside = comm.held[0::2], comm.held[1::2]
    for src, out in outside:
        assert np.array_equal(src, x) and not out.any()
    image = np.zeros(len(x) * (2 if collective is Collective.ALLGATHER else 1), np.float32)
    image[:len(x)] = x  # rank 0's block
    for held, whole in inside:
        if collective is Collective.ALLGATHER:  # given its block, the whole buffer as output
            assert np.array_equal(held, x) and np.array_equal(whole, image)
        else:
            assert np.array_equal(held, image)


def test_traffic_calls_come_before_every_timed_call_on_the_same_buffers():
    """With ``between``, every timed call follows an untimed call of that algorithm on the
    same buffer, in place here."""
    from commflow.tune.online import _time

    calls: list[tuple[str, int]] = []

    class _Algos(_Rank):
        def barrier(self) -> None:
            pass

        def allreduce(self, x, op: str = "sum", *, algo: str = "auto", out=None):
            if algo != "auto":  # "auto": the tuner's own agreement on times
                calls.append((algo, x.ctypes.data))
            return x

    x = np.arange(8, dtype=np.float32)
    _time(_Algos(), AR, x, ["shm", "shm:spin=0"], 2, placements=(True,), between="ring")
    assert [algo for algo, _ in calls] == ["ring", "shm", "ring", "shm:spin=0"] * 2
    assert len({address for _, address in calls}) == 1 and calls[0][1] != x.ctypes.data


def _thp_eligible(a: np.ndarray) -> int:
    """The kernel's ``THPeligible`` flag of the mapping that holds ``a``'s middle byte (numpy
    advises huge pages from the first 2 MiB boundary on, a mapping of its own)."""
    address = a.ctypes.data + a.nbytes // 2
    with open("/proc/self/smaps") as smaps:
        inside = False
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "THPeligible:":
                return int(line.split()[1])
    raise AssertionError("no mapping holds the array")


def test_the_tuner_times_on_small_pages_where_numpy_would_take_huge_ones():
    """A single-copy call pins every page it touches, so a variant's time depends on the
    pages: the tuner's rounds time on the 4 KiB pages of a torch tensor and its re-check on
    the huge pages numpy asks for large arrays, and a variant is kept only if it wins on
    both."""
    from commflow.tune.online import buffer, small_pages

    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
        assert "[never]" not in f.read(), "this test needs transparent huge pages"
    big = np.ones(4 << 20, np.float32)  # 16 MiB: numpy advises huge pages
    mine = small_pages(4 << 20, np.float32)
    mine[...] = 1.0
    assert _thp_eligible(big) == 1 and _thp_eligible(mine) == 0
    # the re-check's buffers are numpy's; the other rounds' small pages
    assert _thp_eligible(buffer(4 << 20, np.float32, HUGE)) == 1
    assert _thp_eligible(buffer(4 << 20, np.float32, SMALL)) == 0
    assert mine.flags.writeable and mine.flags.c_contiguous and mine.sum() == 4 << 20


def test_the_traffic_is_the_program_auto_runs_without_the_fast_path(monkeypatch):
    """``tune_live`` pits every winner against ``shm`` with the program ``auto`` would run
    without the fast path as traffic: recursive doubling at 1 KiB, ring at 1 MiB."""
    from commflow.tune import online

    seen = []

    def halve_(comm, kind, size, names, **options):
        seen.append((size, options["incumbent"], options["traffic"]))
        return "shm", 1e-6

    monkeypatch.setattr(online, "candidates",
                        lambda comm, kind: ["shm", "shm:spin=0", "ring", "recursive_doubling"])
    monkeypatch.setattr(online, "halve", halve_)

    class _Fast:
        size, rank, fast_path = 2, 0, True

    online.tune_live(_Fast(), [1024, 1 << 20], collectives=["allreduce"], budget=1.0)
    assert seen == [(1024, "shm", "recursive_doubling")] * 2 + [(1 << 20, "shm", "ring")] * 2
