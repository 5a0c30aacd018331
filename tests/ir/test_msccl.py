"""MSCCL XML export: structure MSCCL's parser demands, and an independent interpreter of the
XML (threadblocks, FIFO connections, depid/deps flags) that must compute the collective."""

from __future__ import annotations

import dataclasses
import random
import xml.etree.ElementTree as ET
from collections import defaultdict, deque

import numpy as np
import pytest

import commflow.algorithms as algorithms
from commflow import topology
from commflow.collectives import Collective, Element, postcondition, precondition
from commflow.errors import AlgorithmError, ProgramError, VerificationError
from commflow.ir import Program, ProgramBuilder, inp, make_program, out, scr, to_msccl_xml, verify
from commflow.ir.target import get_target
from commflow.synth import synthesize

from .msccl_conformance import violations
from .programs import ring_allgather, ring_allreduce, two_channel_allgather
from .test_serialize import scratch_allgather, switch_reduce

BUFFERS = {"i": "input", "o": "output", "s": "scratch"}


def multi_dep_allreduce() -> Program:
    """Two ranks; the output copy on channel 0 waits for two reductions on channels 1 and 2."""
    b = ProgramBuilder(Collective.ALLREDUCE, 2, chunk_factor=2, name="multi-dep")
    for r in range(2):
        deps = []
        for k in range(2):
            b.send(r, 1 - r, inp(k), channel=k + 1)
            deps.append(b.recv_reduce(r, 1 - r, inp(k), scr(k), channel=k + 1))
        b.copy(r, scr(0, 2), out(0, 2), deps=deps)
    return b.build()


def registered(nranks: int, **kwargs) -> list[Program]:
    """A program of every registered algorithm that applies (and that MSCCL can run)."""
    programs = []
    for algo in algorithms.available():
        try:
            programs.append(algorithms.build(algo.collective, algo.name, nranks, **kwargs))
        except AlgorithmError:
            continue
    return programs


def parse(text: str) -> ET.Element:
    algo = ET.fromstring(text)
    assert algo.tag == "algo"
    return algo


def check_structure(program: Program, algo: ET.Element) -> None:
    """The rules MSCCL's XML parser enforces, plus agreement with the program."""
    t = program.table
    assert int(algo.get("ngpus")) == program.nranks
    channels = [int(tb.get("chan")) for tb in algo.iter("tb")]
    assert int(algo.get("nchannels")) == max(channels) + 1 <= int(t.chan.max()) + 1
    rooted_blocks = program.collective in (Collective.GATHER, Collective.SCATTER)
    per_loop = program.chunk_factor if rooted_blocks else max(program.expected_buffers())
    assert int(algo.get("nchunksperloop")) == per_loop
    assert algo.get("proto") in ("Simple", "LL", "LL128")
    assert (algo.get("inplace"), algo.get("outofplace")) == ("0", "1")
    gpus = algo.findall("gpu")
    assert [int(g.get("id")) for g in gpus] == list(range(program.nranks))
    for rank, gpu in enumerate(gpus):
        part = program.participants[rank]
        sizes = (int(gpu.get("i_chunks")), int(gpu.get("o_chunks")), int(gpu.get("s_chunks")))
        assert sizes == (part.input_chunks, part.output_chunks, part.scratch_chunks)
        tbs = gpu.findall("tb")
        assert [int(tb.get("id")) for tb in tbs] == list(range(len(tbs)))
        sends = [(tb.get("send"), tb.get("chan")) for tb in tbs if tb.get("send") != "-1"]
        recvs = [(tb.get("recv"), tb.get("chan")) for tb in tbs if tb.get("recv") != "-1"]
        assert len(sends) == len(set(sends)) and len(recvs) == len(set(recvs))
        non_nop = 0
        for tb in tbs:
            steps = tb.findall("step")
            assert [int(s.get("s")) for s in steps] == list(range(len(steps)))
            for step in steps:
                kind = step.get("type")
                assert kind in ("s", "r", "rrc", "rcs", "rrcs", "cpy", "re", "nop")
                if kind in ("s", "rcs", "rrcs"):
                    assert int(tb.get("send")) >= 0
                if kind in ("r", "rrc", "rcs", "rrcs"):
                    assert int(tb.get("recv")) >= 0
                depid, deps = int(step.get("depid")), int(step.get("deps"))
                if depid >= 0:
                    target = tbs[depid].findall("step")[deps]
                    assert target.get("hasdep") == "1" and target.get("type") != "nop"
                    assert depid != int(tb.get("id"))
                else:
                    assert deps == -1 and kind != "nop"
                non_nop += (kind != "nop") + (kind in ("rcs", "rrcs"))
        assert non_nop == int(np.sum(t.part == rank))


def run_xml(program: Program, algo: ET.Element, seed: int, slots: int | None = 8) -> None:
    """Execute the XML as MSCCL would, in a random interleaving of threadblocks; assert that
    it finishes and leaves the collective's postcondition in every output buffer.

    A connection holds ``slots`` slots (``None``: unbounded) and a chunk takes 4 (MSCCL's
    Simple protocol): a send waits until its message fits, or the connection is empty."""
    n, cf, root = program.nranks, program.chunk_factor, program.root
    mem: dict[tuple[int, str, int], Element] = dict(precondition(program.collective, n, cf, root))
    tbs = [(rank, tb) for rank, gpu in enumerate(algo.findall("gpu")) for tb in gpu.findall("tb")]
    steps = [tb.findall("step") for _, tb in tbs]
    index = {(rank, int(tb.get("id"))): k for k, (rank, tb) in enumerate(tbs)}
    flag = [-1] * len(tbs)
    pc = [0] * len(tbs)
    fifo: dict[tuple[int, int, int], deque] = defaultdict(deque)
    rng = random.Random(seed)

    def read(rank, buf, off, cnt):
        values = [mem.get((rank, BUFFERS[buf], off + k)) for k in range(cnt)]
        assert all(v is not None for v in values), f"rank {rank} reads empty {buf}[{off}]"
        return values

    def combine(a: Element, b: Element) -> Element:
        assert a.index == b.index and not a.ranks & b.ranks, "bad reduction"
        return Element(a.index, a.ranks | b.ranks)

    def step_once(k: int) -> bool:
        rank, tb = tbs[k]
        if pc[k] == len(steps[k]):
            return False
        st = steps[k][pc[k]]
        depid, deps = int(st.get("depid")), int(st.get("deps"))
        if depid >= 0 and flag[index[(rank, depid)]] < deps:
            return False
        kind, cnt, chan = st.get("type"), int(st.get("cnt")), int(tb.get("chan"))
        sb, so = st.get("srcbuf"), int(st.get("srcoff"))
        db, do = st.get("dstbuf"), int(st.get("dstoff"))
        out_queue = fifo[(rank, int(tb.get("send")), chan)]
        if kind in ("s", "rcs", "rrcs") and slots is not None and out_queue:
            held = sum(4 * len(m) for m in out_queue)
            if held + 4 * cnt > slots:
                return False
        if kind in ("r", "rrc", "rcs", "rrcs"):
            queue = fifo[(int(tb.get("recv")), rank, chan)]
            if not queue:
                return False
            message = queue.popleft()
            assert len(message) == cnt
        if kind == "s":
            out_queue.append(read(rank, sb, so, cnt))
        elif kind in ("r", "rcs"):
            result = message
        elif kind in ("rrc", "rrcs"):
            result = [combine(a, b) for a, b in zip(read(rank, sb, so, cnt), message, strict=True)]
        elif kind == "cpy":
            result = read(rank, sb, so, cnt)
        elif kind == "re":
            pairs = zip(read(rank, db, do, cnt), read(rank, sb, so, cnt), strict=True)
            result = [combine(a, b) for a, b in pairs]
        if kind in ("r", "rrc", "rcs", "rrcs", "cpy", "re"):
            for j, value in enumerate(result):
                mem[(rank, BUFFERS[db], do + j)] = value
        if kind in ("rcs", "rrcs"):
            out_queue.append(result)
        if st.get("hasdep") == "1":
            flag[k] = int(st.get("s"))
        pc[k] += 1
        return True

    live = list(range(len(tbs)))
    while live:
        rng.shuffle(live)
        if not any(step_once(k) for k in live):
            stuck = [(tbs[k][0], tbs[k][1].get("id"), pc[k]) for k in live]
            raise AssertionError(f"deadlock at (rank, tb, step) {stuck}")
        live = [k for k in live if pc[k] < len(steps[k])]
    assert not any(fifo.values()), "messages left unreceived"
    for key, want in postcondition(program.collective, n, cf, root).items():
        assert mem.get(key) == want, f"{key}: {mem.get(key)} != {want}"


HAND_WRITTEN = [
    ring_allgather(5),
    ring_allreduce(4),
    two_channel_allgather(3),
    scratch_allgather(),
    multi_dep_allreduce(),
]


@pytest.mark.parametrize("program", HAND_WRITTEN, ids=lambda p: p.name)
def test_hand_written_programs_export_and_run(program):
    algo = parse(to_msccl_xml(program))
    check_structure(program, algo)
    for seed in range(5):
        run_xml(program, algo, seed)


@pytest.mark.parametrize("nranks", [4, 6, 8])
def test_registered_algorithms_export_and_run(nranks):
    """Every registered program either exports and runs with MSCCL's bounded connections, or
    is refused because its sends would block each other there (and then runs unbounded)."""
    programs = [*registered(nranks), *registered(nranks, chunks=2, channels=2)]
    assert len(programs) >= 8
    refused = 0
    for program in programs:
        target = "rccl" if program.collective in (Collective.GATHER, Collective.SCATTER) \
            else "msccl"
        try:
            algo = parse(to_msccl_xml(program, target))
        except VerificationError as error:
            assert "deadlock on " + target in str(error)
            refused += 1
            algo = parse(to_msccl_xml(program, target, proto="LL"))
            for seed in range(2):
                run_xml(program, algo, seed, slots=None)
            continue
        check_structure(program, algo)
        for seed in range(2):
            run_xml(program, algo, seed)
    assert refused < len(programs) / 2


@pytest.mark.parametrize("chunks", [1, 2, 3, 4])
def test_bounded_slots_refuse_a_ring_with_three_chunks_in_flight(chunks):
    """Simple protocol: two chunks fit in a connection; a ring posting 3+ sends before its
    first receive hangs. The LL export (8 in flight) runs, but not with Simple's slots."""
    program = algorithms.build("allreduce", "ring", 8, chunks=chunks)
    if chunks <= 2:
        run_xml(program, parse(to_msccl_xml(program)), seed=0, slots=8)
        return
    with pytest.raises(VerificationError, match="deadlock on msccl .Simple, 8 slots"):
        to_msccl_xml(program)
    algo = parse(to_msccl_xml(program, proto="LL"))
    run_xml(program, algo, seed=0, slots=None)
    with pytest.raises(AssertionError, match="deadlock at"):
        run_xml(program, algo, seed=0, slots=8)


def test_fused_steps_halve_a_ring_allreduce():
    """15 steps per threadblock on 8 ranks, as msccl-tools emits (s, 7 rrcs, 6 rcs, r)."""
    algo = parse(to_msccl_xml(algorithms.build("allreduce", "ring", 8)))
    for gpu in algo.findall("gpu"):
        (tb,) = gpu.findall("tb")
        kinds = [step.get("type") for step in tb.findall("step")]
        assert kinds == ["s"] + ["rrcs"] * 7 + ["rcs"] * 6 + ["r"]


def test_size_range_and_root():
    program = algorithms.build("broadcast", "binomial_tree", 4, root=1)
    with pytest.raises(ProgramError, match="carries no root"):
        to_msccl_xml(program, "rccl")
    algo = parse(to_msccl_xml(algorithms.build("broadcast", "binomial_tree", 4, root=0), "rccl",
                              min_bytes=1024, max_bytes=1 << 20))
    assert (algo.get("minBytes"), algo.get("maxBytes")) == ("1024", "1048576")
    assert parse(to_msccl_xml(ring_allgather(3))).get("maxBytes") == str(1 << 30)
    for lo, hi in ((10, 5), (0, 2**63 - 1), (-1, 10)):
        with pytest.raises(ProgramError, match="size range"):
            to_msccl_xml(ring_allgather(3), min_bytes=lo, max_bytes=hi)


def test_limits_are_refused_with_the_limit_named():
    deep = algorithms.build("allgather", "ring", 8, chunks=8)  # 1 + 8 * 8 steps per rank
    with pytest.raises(ProgramError, match="has 65 steps where rccl allows 64 per threadblock"):
        to_msccl_xml(deep, "rccl", proto="LL")
    check_structure(deep, parse(to_msccl_xml(deep, "msccl", proto="LL")))
    wide = algorithms.build("allgather", "ring", 8, channels=40)
    with pytest.raises(ProgramError, match="needs 40 channels where msccl has 32"):
        to_msccl_xml(wide)


def test_elements_are_counted_per_file_in_msccl_and_per_rank_in_rccl():
    wide = algorithms.build("allgather", "ring", 16, chunks=2, channels=8)
    with pytest.raises(ProgramError, match="at least 4257 elements per file where msccl's "
                       "parser keeps 4096"):  # refused by the bound, before any layout
        to_msccl_xml(wide, "msccl", proto="LL")
    roomier = dataclasses.replace(get_target("msccl", protocol="LL"), max_nodes=4300)
    with pytest.raises(ProgramError, match="would hold 4369 elements per file where msccl's "
                       "parser keeps 4300"):  # within the bound, over once laid out
        to_msccl_xml(wide, roomier, proto="LL")
    for runtime in ("rccl", "msccl-executor"):
        text = to_msccl_xml(wide, runtime, proto="LL")
        assert text.count("<step ") > 4096
        assert violations(text, runtime) == []
    small = dataclasses.replace(get_target("rccl", protocol="LL"), max_nodes=200)
    with pytest.raises(ProgramError, match="at least 282 elements for one rank where rccl's"):
        to_msccl_xml(wide, small, proto="LL")


def test_ring_channel_is_one_threadblock_without_dependencies():
    algo = parse(to_msccl_xml(ring_allreduce(4)))
    for rank, gpu in enumerate(algo.findall("gpu")):
        (tb,) = gpu.findall("tb")
        assert (tb.get("send"), tb.get("recv"), tb.get("chan")) == (
            str((rank + 1) % 4),
            str((rank - 1) % 4),
            "0",
        )
        assert [s.get("type") for s in tb.findall("step")[:4]] == ["s", "rrcs", "rrcs", "rrcs"]
        assert {s.get("depid") for s in tb.findall("step")} == {"-1"}


def test_recv_reduce_names_local_operand_as_src_and_sends_name_the_receivers_dst():
    algo = parse(to_msccl_xml(ring_allreduce(4)))
    steps = algo.find("gpu").find("tb").findall("step")
    # rank 0: send input[0]; receive-reduce chunk 3: output[3] = received + input[3]
    first_send, first_rrc = steps[0].attrib, steps[1].attrib
    assert (first_send["srcbuf"], first_send["srcoff"]) == ("i", "0")
    assert (first_send["dstbuf"], first_send["dstoff"]) == ("o", "0")
    assert (first_rrc["srcbuf"], first_rrc["srcoff"], first_rrc["dstbuf"]) == ("i", "3", "o")
    assert first_rrc["dstoff"] == "3"


def test_extra_dependencies_become_nops_before_the_step():
    algo = parse(to_msccl_xml(multi_dep_allreduce()))
    gpu = algo.find("gpu")
    local = next(tb for tb in gpu.findall("tb") if tb.get("send") == "-1")
    nop, copy_ = local.findall("step")
    assert nop.get("type") == "nop" and nop.get("cnt") == "0"
    assert copy_.get("type") == "cpy" and copy_.get("s") == "1"
    waited = {(nop.get("depid"), nop.get("deps")), (copy_.get("depid"), copy_.get("deps"))}
    chans = {gpu.findall("tb")[int(d)].get("chan") for d, _ in waited}
    assert len(waited) == 2 and chans == {"0", "1"}  # channels 1 and 2, renumbered per pair


def test_channels_are_numbered_per_connection_within_msccls_32():
    program = synthesize("allreduce", topology.dgx1(), pieces=2)  # channels u * 8 + v
    assert int(program.table.chan.max()) >= 32
    algo = parse(to_msccl_xml(program))
    check_structure(program, algo)
    assert algo.get("nchannels") == "1"  # one stream per edge: one channel per connection
    for seed in range(3):
        run_xml(program, algo, seed)


def test_collective_names_per_runtime():
    b = ProgramBuilder(Collective.REDUCESCATTER, 2, chunk_factor=1, name="rs")
    for r in range(2):
        b.send(r, 1 - r, inp(1 - r))
        b.recv_reduce(r, 1 - r, inp(r), out(0))
    for program in (algorithms.build("reducescatter", "ring", 4), b.build()):
        assert parse(to_msccl_xml(program)).get("coll") == "reduce_scatter"
        assert parse(to_msccl_xml(program, "rccl")).get("coll") == "reducescatter"
        assert parse(to_msccl_xml(program, "msccl-executor")).get("coll") == "reducescatter"
    assert parse(to_msccl_xml(ring_allgather(3), proto="LL128")).get("proto") == "LL128"


def test_name_is_escaped():
    b = ProgramBuilder(Collective.ALLGATHER, 1, chunk_factor=1, name='a<b & "c"')
    b.copy(0, inp(0), out(0))
    assert parse(to_msccl_xml(b.build())).get("name") == 'a<b & "c"'


def test_gather_needs_the_rccl_runtime():
    b = ProgramBuilder(Collective.GATHER, 2, chunk_factor=1, name="g", root=0)
    b.copy(0, inp(0), out(0))
    b.send(1, 0, inp(0))
    b.recv(0, 1, out(1))
    program = b.build()
    with pytest.raises(ProgramError, match="msccl runtime has no gather collective"):
        to_msccl_xml(program)
    algo = parse(to_msccl_xml(program, "rccl"))
    assert (algo.get("coll"), algo.get("nchunksperloop")) == ("gather", "1")


def test_switch_programs_are_rejected():
    with pytest.raises(ProgramError, match="MSCCL has no in-network participants"):
        to_msccl_xml(switch_reduce())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"target": "nccl"}, "unknown target 'nccl'"), ({"target": "live"}, "reads no XML"),
     ({"proto": "ll"}, "unknown protocol")],
)
def test_bad_options(kwargs, message):
    with pytest.raises(ProgramError, match=message):
        to_msccl_xml(ring_allgather(2), **kwargs)


def test_dependency_on_a_later_step_of_the_same_channel_is_rejected():
    p = ring_allgather(2)
    t = p.table
    columns = {
        k: getattr(t, k)
        for k in ("part", "chan", "op", "peer", "src_buf", "src_off", "dst_buf", "dst_off", "count")
    }
    ptr = np.zeros(len(t) + 1, dtype=np.int64)
    ptr[2:] = 1  # step 1 (rank 0's send) depends on step 2 (its receive, same threadblock)
    bad = make_program(
        "bad", p.collective, 2, chunk_factor=1, columns=columns, dep_ptr=ptr, dep_idx=np.array([2])
    )
    with pytest.raises(VerificationError, match="deadlock on msccl"):
        to_msccl_xml(bad)


def test_unmatched_sends_are_rejected():
    b = ProgramBuilder(Collective.ALLGATHER, 2, chunk_factor=1, name="lonely")
    b.copy(0, inp(0), out(0))
    b.send(0, 1, inp(0))
    with pytest.raises(ProgramError, match="mismatched send/recv"):
        to_msccl_xml(b.build())


def test_offsets_beyond_sixteen_bits_are_refused():
    # two ranks exchange blocks of 40,000 chunks in 4 steps each: the second block starts at
    # output chunk 40,000, beyond the runtimes' int16 offsets
    b = ProgramBuilder(Collective.ALLGATHER, 2, chunk_factor=40000, name="wide")
    for r in range(2):
        b.copy(r, inp(0, 40000), out(r * 40000, 40000), channel=1)
    b.send(0, 1, inp(0, 40000))  # rank 0 sends first, rank 1 receives first: no deadlock
    b.recv(1, 0, out(0, 40000))
    b.recv(0, 1, out(40000, 40000))
    b.send(1, 0, inp(0, 40000))
    wide = b.build()
    verify(wide)
    with pytest.raises(ProgramError, match="offsets in 16 bits"):
        to_msccl_xml(wide, "rccl", proto="LL")
    loose = dataclasses.replace(get_target("rccl", protocol="LL"), max_offset=None,
                                max_count=None)
    text = to_msccl_xml(wide, loose)
    assert any("beyond the 16-bit offset fields" in v for v in violations(text, "rccl"))
