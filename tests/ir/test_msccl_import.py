"""MSCCL XML import: exports come back as programs that verify and simulate to the same time;
hand-written files with fused steps, nops and in-place programs mean what MSCCL runs; and
malformed files are refused with the element named, never a traceback."""

from __future__ import annotations

import contextlib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commflow import topology
from commflow.collectives import Collective
from commflow.errors import ProgramError
from commflow.ir import from_msccl_xml, get_target, load_program, to_msccl_xml, verify
from commflow.sim import simulate

from .test_msccl import registered


def exported(program):
    target = "rccl" if program.collective in (Collective.GATHER, Collective.SCATTER) else "msccl"
    try:
        return to_msccl_xml(program, target)
    except ProgramError:  # would hang with Simple's two chunks in flight
        return to_msccl_xml(program, target, proto="LL")


@pytest.mark.parametrize("nranks", [4, 8])
def test_export_import_round_trip_verifies_and_simulates_the_same(nranks):
    topo = topology.ring(nranks, bandwidth=10e9, latency=1e-6)
    programs = [*registered(nranks), *registered(nranks, chunks=2, channels=2)]
    for program in programs:
        back = from_msccl_xml(exported(program))
        verify(back)
        assert back.collective is program.collective and back.nranks == program.nranks
        for model in ("alphabeta", "flow"):
            want = simulate(program, topo, 1 << 20, model=model).time
            assert simulate(back, topo, 1 << 20, model=model).time == pytest.approx(want,
                                                                                    rel=1e-9)


def _xml(coll: str, gpus: list[str], *, inplace: str = "0", outofplace: str = "1",
         ngpus: int = 2) -> str:
    return (f'<algo name="t" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="{ngpus}" '
            f'coll="{coll}" inplace="{inplace}" outofplace="{outofplace}" minBytes="0" '
            f'maxBytes="0">' + "".join(gpus) + "</algo>")


def _step(s, kind, src=("i", -1), dst=("o", -1), cnt=1, dep=(-1, -1), hasdep=0):
    return (f'<step s="{s}" type="{kind}" srcbuf="{src[0]}" srcoff="{src[1]}" '
            f'dstbuf="{dst[0]}" dstoff="{dst[1]}" cnt="{cnt}" depid="{dep[0]}" deps="{dep[1]}" '
            f'hasdep="{hasdep}"/>')


def ring_allreduce_rrs(inplace: bool) -> str:
    """2-rank allreduce as msccl-tools writes a ring: send, receive-reduce-send, receive; with
    ``inplace`` the single buffer is named i (an in-place-only file, o_chunks 0)."""
    b = "i" if inplace else "o"
    gpus = []
    for r in range(2):
        peer = 1 - r
        steps = (_step(0, "s", src=("i", r)) +
                 _step(1, "rrcs", src=("i", peer), dst=(b, peer)) +
                 _step(2, "r", dst=(b, r)))
        gpus.append(f'<gpu id="{r}" i_chunks="2" o_chunks="{0 if inplace else 2}" '
                    f's_chunks="0"><tb id="0" send="{peer}" recv="{peer}" chan="0">{steps}'
                    "</tb></gpu>")
    return _xml("allreduce", gpus, inplace="1" if inplace else "0",
                outofplace="0" if inplace else "1")


@pytest.mark.parametrize("inplace", [False, True])
def test_fused_steps_and_in_place_programs_compute_the_collective(inplace):
    program = from_msccl_xml(ring_allreduce_rrs(inplace))
    verify(program)
    assert program.collective is Collective.ALLREDUCE and program.chunk_factor == 2
    # per rank: send, receive-reduce + send (the rrcs), receive; in place: the input's copy
    ops = sorted(int(op) for op, part in zip(program.table.op, program.table.part, strict=True)
                 if part == 0)
    assert ops == sorted([0, 2, 0, 1] + ([3] if inplace else []))


def test_nops_carry_dependencies_to_the_next_step():
    """Rank 0 copies its input in two threadblocks; the second waits (through a nop) for the
    first before overwriting the same chunk; without the nop it is a data race."""
    def doc(with_nop: bool) -> str:
        wait = _step(0, "nop", dep=(0, 0)) if with_nop else ""
        second = _step(1 if with_nop else 0, "cpy", src=("i", 0), dst=("o", 0))
        gpus = [f'<gpu id="0" i_chunks="1" o_chunks="1" s_chunks="0">'
                f'<tb id="0" send="-1" recv="-1" chan="0">'
                f'{_step(0, "cpy", src=("i", 0), dst=("o", 0), hasdep=1)}</tb>'
                f'<tb id="1" send="-1" recv="-1" chan="0">{wait}{second}</tb></gpu>']
        return _xml("allreduce", gpus, ngpus=1)

    verify(from_msccl_xml(doc(with_nop=True)))
    with pytest.raises(ProgramError, match="data race"):
        verify(from_msccl_xml(doc(with_nop=False)))


def test_in_place_allgather_reads_its_own_block_of_the_output():
    gpus = []
    for r in range(2):
        peer = 1 - r
        steps = _step(0, "s", src=("o", r)) + _step(1, "r", dst=("o", peer))
        gpus.append(f'<gpu id="{r}" i_chunks="0" o_chunks="2" s_chunks="0">'
                    f'<tb id="0" send="{peer}" recv="{peer}" chan="0">{steps}</tb></gpu>')
    program = from_msccl_xml(_xml("allgather", gpus, inplace="1", outofplace="0"))
    verify(program)
    assert program.chunk_factor == 1


def test_load_program_and_bounded_verification_read_xml(tmp_path):
    path = tmp_path / "ring.xml"
    path.write_text(ring_allreduce_rrs(False))
    program = load_program(path)
    verify(program, target=get_target("rccl"))
    assert dict(program.params)["imported"] == "msccl"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.replace('coll="allreduce"', 'coll="allsum"'), "unknown collective"),
        (lambda t: t.replace('type="r"', 'type="recv"', 1), "unknown type 'recv'"),
        (lambda t: t.replace('cnt="1"', 'cnt="x"', 1), "is not an integer"),
        (lambda t: t.replace('srcbuf="i"', 'srcbuf="q"', 1), "use i, o or s"),
        (lambda t: t.replace(' depid="-1"', ' depid="9"', 1).replace('deps="-1"', 'deps="0"',
                                                                      1), "does not exist"),
        (lambda t: t.replace('ngpus="2"', 'ngpus="3"'), "ngpus=3"),
        (lambda t: t.replace('<step s="1"', '<step s="7"', 1), "numbered 0, 1, 2"),
        (lambda t: t.replace('send="1"', 'send="0"', 1), "is not another rank"),
        (lambda t: "<!DOCTYPE x [<!ENTITY a 'b'>]>" + t, "DOCTYPE"),
        (lambda t: t[:-20], "not MSCCL XML"),
        (lambda t: t.replace('outofplace="1"', 'outofplace="0"').replace(
            'coll="allreduce"', 'coll="reducescatter"'), "in-place-only reducescatter"),
        (lambda t: t.replace('srcoff="0"', 'srcoff="99999"', 1), "outside its buffer"),
    ],
)
def test_malformed_files_name_what_is_wrong(change, message):
    with pytest.raises(ProgramError, match=message):
        from_msccl_xml(change(ring_allreduce_rrs(False)))


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_fuzzed_attributes_raise_program_errors_only(data):
    text = exported(registered(4)[0])
    values = re.findall(r'(\w+)="([^"]*)"', text)
    key, _ = data.draw(st.sampled_from(values))
    junk = data.draw(st.sampled_from(["-5", "2147483648", "", "x", "1e3", "0", "99", "-1"]))
    spot = data.draw(st.integers(0, text.count(f'{key}="') - 1))
    pieces = text.split(f'{key}="')
    head = f'{key}="'.join(pieces[: spot + 1])
    tail = pieces[spot + 1]
    mutated = head + f'{key}="' + junk + tail[tail.index('"'):]
    try:
        program = from_msccl_xml(mutated)
    except ProgramError:
        return
    with contextlib.suppress(ProgramError):
        verify(program)
