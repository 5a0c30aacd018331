"""Shared algorithm helpers: chunk layout, run merging and splitting, the power-of-two fold,
and the eager ordering of a channel's steps."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commflow.algorithms.common import (
    Action,
    ChunkLayout,
    Fold,
    copies,
    copy,
    emit_eager,
    merge_runs,
    recv,
    send,
    split,
)
from commflow.errors import AlgorithmError
from commflow.ir import Buffer, Op, Ref, inp, out, scr


@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.integers(0, 5))
def test_layout_matches_the_documented_formula(base, chunks, channels, block):
    layout = ChunkLayout(base, chunks, channels)
    assert layout.cf == base * chunks * channels
    for c in range(channels):
        for part in range(base):
            for j in range(chunks):
                want = block * layout.cf + c * (layout.cf // channels) + part * chunks + j
                assert layout.index(block, c, part, j) == want


@given(
    st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(0, 4), st.integers(1, 4)
)
def test_layout_runs_cover_exactly_the_channel_chunks(base, chunks, channels, first, nblocks):
    layout = ChunkLayout(base, chunks, channels)
    for c in range(channels):
        got = [i for start, n in layout.runs(first, nblocks, c) for i in range(start, start + n)]
        want = [
            layout.index(b, c, part, j)
            for b in range(first, first + nblocks)
            for part in range(base)
            for j in range(chunks)
        ]
        assert got == want
        assert len(layout.runs(first, nblocks, c)) == (1 if channels == 1 else nblocks)


def test_layout_rejects_empty_dimensions():
    with pytest.raises(AlgorithmError, match="must be >= 1"):
        ChunkLayout(1, 0, 1)


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), max_size=12))
def test_merge_runs_reproduces_pairs_in_maximal_runs(pairs):
    src = [s for s, _ in pairs]
    dst = [d for _, d in pairs]
    runs = merge_runs(src, dst)
    assert [(s + i, d + i) for s, d, n in runs for i in range(n)] == pairs
    for (s0, d0, n0), (s1, d1, _) in zip(runs, runs[1:], strict=False):
        assert (s1, d1) != (s0 + n0, d0 + n0)


def test_merge_runs_rejects_unequal_lengths():
    with pytest.raises(AlgorithmError, match="equal length"):
        merge_runs([1, 2], [1])


@given(st.integers(0, 9), st.integers(1, 30), st.integers(1, 8))
def test_split_cuts_into_contiguous_near_equal_pieces(index, count, pieces):
    parts = split(scr(index, count), pieces)
    assert len(parts) == min(pieces, count)
    assert parts[0].index == index and all(p.buffer is Buffer.SCRATCH for p in parts)
    assert all(a.index + a.count == b.index for a, b in zip(parts, parts[1:], strict=False))
    assert sum(p.count for p in parts) == count
    assert max(p.count for p in parts) - min(p.count for p in parts) <= 1


@given(st.integers(1, 300))
def test_fold_relabels_onto_a_power_of_two(nranks):
    fold = Fold(nranks)
    assert fold.pof2 <= nranks < 2 * fold.pof2 and fold.pof2 & (fold.pof2 - 1) == 0
    survivors = [r for r in range(nranks) if fold.new_rank(r) is not None]
    assert sorted(fold.new_rank(r) for r in survivors) == list(range(fold.pof2))
    assert all(fold.old_rank(fold.new_rank(r)) == r for r in survivors)
    assert fold.first_rank(0) == 0 and fold.first_rank(fold.pof2) == nranks
    for q in range(fold.pof2):
        covered = set(range(fold.first_rank(q), fold.first_rank(q + 1)))
        partner = fold.partner(fold.old_rank(q))
        assert covered == {fold.old_rank(q)} | ({partner} if partner is not None else set())
    for r in range(nranks):
        partner = fold.partner(r)
        assert partner is None or (
            fold.partner(partner) == r
            and (fold.new_rank(r) is None) != (fold.new_rank(partner) is None)
        )


class _Recorder:
    """Stands in for a ProgramBuilder and records the order of the steps added."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def _add(self, op: Op) -> int:
        self.ops.append(op)
        return len(self.ops) - 1

    def send(self, rank, peer, src, *, channel):
        return self._add(Op.SEND)

    def recv(self, rank, peer, dst, *, channel):
        return self._add(Op.RECV)

    def recv_reduce(self, rank, peer, src, dst, *, channel):
        return self._add(Op.RECV_REDUCE)

    def copy(self, rank, src, dst, *, channel):
        return self._add(Op.COPY)

    def reduce(self, rank, src, dst, *, channel):
        return self._add(Op.REDUCE)


_refs = st.builds(lambda i, n: out(i, n), st.integers(0, 6), st.integers(1, 3))
_actions = st.lists(
    st.one_of(
        st.builds(lambda r: send(1, r), _refs),
        st.builds(lambda r: recv(1, r), _refs),
        st.builds(lambda a, b: copy(a, b), _refs, _refs),
    ),
    max_size=14,
)


def _overlap(a: Ref, b: Ref) -> bool:
    return a.buffer == b.buffer and a.index < b.index + b.count and b.index < a.index + a.count


def _emitted(actions: list[Action]) -> list[int]:
    """Emitted order as indices into ``actions`` (sends and others each keep their order)."""
    rec = _Recorder()
    emit_eager(rec, 0, 0, actions)
    sends = iter(i for i, a in enumerate(actions) if a.op is Op.SEND)
    others = iter(i for i, a in enumerate(actions) if a.op is not Op.SEND)
    return [next(sends) if op is Op.SEND else next(others) for op in rec.ops]


def _last_writer(actions: list[Action], i: int) -> int:
    return max(
        (
            j
            for j in range(i)
            if actions[j].op is not Op.SEND and _overlap(actions[j].dst, actions[i].src)
        ),
        default=-1,
    )


@given(_actions)
def test_emit_eager_moves_sends_early_without_breaking_data_flow(actions):
    order = _emitted(actions)
    assert sorted(order) == list(range(len(actions)))
    where = {i: k for k, i in enumerate(order)}
    sends = [i for i, a in enumerate(actions) if a.op is Op.SEND]
    for n, i in enumerate(sends):
        # the steps before a send are exactly those that it, or an earlier send, waits for
        wait = max((_last_writer(actions, s) for s in sends[: n + 1]), default=-1)
        before = [j for j in order[: where[i]] if actions[j].op is not Op.SEND]
        assert before == [j for j in range(wait + 1) if actions[j].op is not Op.SEND]


def test_emit_eager_forwards_a_piece_before_receiving_the_next():
    actions = [recv(0, out(0)), recv(0, out(1)), send(2, out(0)), send(2, out(1))]
    assert _emitted(actions) == [0, 2, 1, 3]


def test_copies_merge_contiguous_chunks():
    assert copies(Buffer.INPUT, [0, 1, 2, 5], Buffer.OUTPUT, [4, 5, 6, 7]) == [
        copy(inp(0, 3), out(4, 3)),
        copy(inp(5), out(7)),
    ]
