"""pack_channels: threadblocks of a rank that run one after the other share one, at the same
simulated times, within the runtimes' rules."""

from __future__ import annotations

import numpy as np
import pytest

from commflow import topology
from commflow.algorithms import build
from commflow.errors import ProgramError
from commflow.ir import verify
from commflow.ir.msccl import to_msccl_xml
from commflow.ir.pack import pack_channels
from commflow.ir.step import Op
from commflow.ir.transform import split_channels
from commflow.sim import simulate
from commflow.synth import synthesize
from tests.ir.msccl_conformance import violations

DGX1 = topology.dgx1()
SIZE = 1 << 29  # one loop of the kernel: each channel runs its steps once
COLUMNS = ("op", "peer", "count", "src_buf", "src_off", "dst_buf", "dst_off")


def _channels(program):
    t = program.table
    return [range(a, b) for a, b in zip(t.channel_starts[:-1].tolist(),
                                        t.channel_starts[1:].tolist(), strict=True)]


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce"])
def test_packed_channels_run_at_the_same_times_in_fewer_threadblocks(collective):
    program = synthesize(collective, DGX1, pieces=8)
    n = program.nranks
    streams = np.unique(program.table.chan[program.table.op == Op.SEND])
    cut = split_channels(program, 12, early=streams[streams // n < streams % n].tolist())
    finish = simulate(cut, DGX1, SIZE, model="flow", target="msccl-executor").finish
    packed = pack_channels(cut, finish, 12)
    joins = dict(packed.params)["packed"]
    assert joins > 0 and len(_channels(packed)) == len(_channels(cut)) - joins
    verify(packed, target="msccl-executor")
    assert violations(to_msccl_xml(packed, "msccl-executor"), "msccl-executor") == []
    again = simulate(packed, DGX1, SIZE, model="flow", target="msccl-executor")
    assert again.time == pytest.approx(float(finish.max()), rel=1e-12)
    # the same steps, each rank's in the same order within what was a channel
    t, c = cut.table, packed.table
    key = lambda table: np.lexsort([getattr(table, k) for k in COLUMNS[::-1]] + [table.part])  # noqa: E731
    for name in COLUMNS:
        assert np.array_equal(getattr(t, name)[key(t)], getattr(c, name)[key(c)])
    for steps in _channels(packed):
        ops, peers = c.op[steps], c.peer[steps]
        assert len(steps) <= 12
        sends, recvs = peers[ops == Op.SEND], peers[ops != Op.SEND]
        assert len(set(sends.tolist())) <= 1 and len(set(recvs.tolist())) <= 1
        if len(sends) and len(recvs):  # joined: one part's steps all before the other's
            done = again.finish[steps]
            kinds = (ops == Op.SEND).astype(int)
            switch = int(np.flatnonzero(np.diff(kinds))[0]) + 1
            assert np.count_nonzero(np.diff(kinds)) == 1
            assert done[:switch].max() <= done[switch:].min() + 1e-15


def test_channels_that_exceed_most_or_talk_both_ways_stay_apart():
    program = split_channels(synthesize("reducescatter", DGX1, pieces=8), 6)
    finish = simulate(program, DGX1, SIZE, model="flow", target="msccl-executor").finish
    assert pack_channels(program, finish, 1) is program  # no two channels fit in one step
    ring = build("allgather", "ring", 8, chunks=2)  # each channel sends and receives
    assert pack_channels(ring, simulate(ring, DGX1, SIZE).finish, 64) is ring
    with pytest.raises(ProgramError, match="one finish time per step"):
        pack_channels(program, finish[:-1], 6)


def test_mi250x2_reduce_scatter_fits_rccl_once_its_threadblocks_are_packed():
    # 128 chunks per root merged (1, 1, 2, 2):3 cut at 60 messages needs 63-66 threadblocks
    # on some ranks where RCCL runs 64; the shorter segments of the streams from a lower
    # rank to a higher one first, then packed: 63 at most, at the same simulated times
    topo = topology.load("mi250x2")
    program = synthesize("reducescatter", topo, pieces=128, merge=((1, 1, 2, 2), 3))
    n = program.nranks
    with pytest.raises(ProgramError, match="threadblocks where rccl allows 64"):
        to_msccl_xml(split_channels(program, 60), "rccl")
    streams = np.unique(program.table.chan[program.table.op == Op.SEND])
    cut = split_channels(program, 60, early=streams[streams // n < streams % n].tolist())
    result = simulate(cut, topo, 1 << 30, model="flow", target="rccl")
    packed = pack_channels(cut, result.finish, 60)
    xml = to_msccl_xml(packed, "rccl")
    assert violations(xml, "rccl") == []
    assert max(gpu.count("<tb ") for gpu in xml.split("<gpu ")[1:]) == 63
    again = simulate(packed, topo, 1 << 30, model="flow", target="rccl")
    assert again.time == pytest.approx(result.time, rel=1e-12)
