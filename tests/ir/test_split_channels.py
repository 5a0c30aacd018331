"""split_channels: long streams cut into consecutive threadblocks run the same steps, in the
same order, and fit the runtimes' steps per threadblock."""

from __future__ import annotations

import math

import numpy as np
import pytest

from commflow import topology
from commflow.algorithms import build
from commflow.errors import ProgramError
from commflow.ir import verify
from commflow.ir.step import Op
from commflow.ir.transform import split_channels
from commflow.sim import simulate
from commflow.synth import synthesize

DGX1 = topology.dgx1()
COLUMNS = ("part", "op", "peer", "count", "src_buf", "src_off", "dst_buf", "dst_off")


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce"])
def test_cut_streams_keep_every_step_and_its_order(collective):
    program = synthesize(collective, DGX1, pieces=4)  # one stream per edge
    cut = split_channels(program, 5)
    verify(cut)
    verify(cut, target="rccl")
    before, after = program.table, cut.table
    for name in COLUMNS:  # the same steps, in the same order
        assert np.array_equal(getattr(before, name), getattr(after, name))
    # every channel of n messages becomes ceil(n / 5) channels of at most 5 messages each
    # (a stream's channel holds only its messages; copies sit in a channel of their own)
    expected = sum(math.ceil(n / 5) for n in np.diff(before.channel_starts).tolist())
    assert len(after.channel_starts) - 1 == expected
    assert not np.isin(before.op, (Op.REDUCE,)).any()
    assert np.diff(after.channel_starts).max() == 5
    assert dict(cut.params)["split"] == 5
    # each segment starts after the one before it: the schedule is the same
    same = simulate(program, DGX1, 1 << 20).time
    assert simulate(cut, DGX1, 1 << 20).time == pytest.approx(same, rel=1e-12)


def test_short_channels_are_left_alone():
    program = synthesize("allgather", DGX1, pieces=1)
    assert split_channels(program, 10_000) is program


def test_a_channel_with_two_peers_is_refused():
    ring = build("allgather", "ring", 4, chunks=3)  # a ring channel sends and receives
    with pytest.raises(ProgramError, match="more than one peer; cut only channels of one"):
        split_channels(ring, 2)
    with pytest.raises(ProgramError, match="most must be >= 1"):
        split_channels(ring, 0)


def test_early_streams_take_their_shorter_segment_first():
    program = synthesize("reducescatter", DGX1, pieces=4)
    stream = int(program.table.chan[program.table.op == Op.SEND][0])
    cut = split_channels(program, 5, early=[stream])
    verify(cut, target="rccl")
    t, c = program.table, cut.table
    for name in COLUMNS:  # the same steps, in the same order
        assert np.array_equal(getattr(t, name), getattr(c, name))
    segment = np.diff(c.channel_starts)
    owner = np.repeat(np.arange(len(t.channel_starts) - 1), np.diff(t.channel_starts))
    cut_owner = owner[c.channel_starts[:-1]]  # the stream each segment comes from
    for k in range(len(t.channel_starts) - 1):
        sizes = segment[cut_owner == k].tolist()
        n = int(np.diff(t.channel_starts)[k])
        short = [n % 5] if n % 5 else []
        full = [5] * (n // 5)
        early = t.chan[t.channel_starts[k]] == stream
        assert short or not early  # 56 messages: one, then 11 of 5
        expected = short + full if early else full + short
        assert sizes == expected, (k, sizes)
    assert simulate(cut, DGX1, 1 << 20).time == pytest.approx(
        simulate(program, DGX1, 1 << 20).time, rel=1e-12)
