"""Every export obeys every rule the MSCCL, msccl-executor and RCCL parsers enforce (checked by
an independent statement of those rules, tests/ir/msccl_conformance.py), and the checker
catches each rule broken on purpose."""

from __future__ import annotations

import pytest

from commflow import topology
from commflow.collectives import Collective
from commflow.errors import ProgramError
from commflow.ir import to_msccl_xml
from commflow.synth import remembered, synthesize_for

from .msccl_conformance import selected, violations
from .test_msccl import registered

RUNTIMES = ("msccl", "msccl-executor", "rccl")


def export_or_none(program, runtime):
    for proto in ("Simple", "LL"):
        try:
            return to_msccl_xml(program, runtime, proto=proto)
        except ProgramError:
            continue
    return None


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("nranks", [4, 8])
def test_every_registered_algorithm_exports_within_the_rules(runtime, nranks):
    exported = 0
    for program in [*registered(nranks), *registered(nranks, chunks=2, channels=2)]:
        if runtime == "msccl" and program.collective in (Collective.GATHER, Collective.SCATTER):
            continue
        if program.root not in (None, 0):
            continue
        text = export_or_none(program, runtime)
        if text is None:  # refused: over the runtime's steps per threadblock
            assert runtime != "msccl"
            continue
        assert violations(text, runtime) == [], program.name
        exported += 1
    assert exported >= 15


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce"])
def test_synthesized_dgx1_programs_export_within_the_rules(collective):
    with remembered():  # the runtimes' searches share their candidates
        for runtime in RUNTIMES:  # the pieces synthesize_for picks on DGX-1
            program, text = synthesize_for(collective, topology.dgx1(), runtime,
                                           pieces=(16, 8, 2, 1), rings=False)
            assert violations(text, runtime) == []
            params = dict(program.params)
            if runtime == "msccl":  # 4,096 elements per file: few pieces, one stream per edge
                assert "split" not in params and "levels" not in params and params["pieces"] <= 2
                assert 'type="re"' not in text  # no local reduces: they come with levels
            elif collective == "allgather":  # elements per rank: 128 pieces merged 4 at a time
                assert params["split"] == 60 and params["pieces"] == 128
                assert params["merge"] == "3:4" and 'cnt="4"' in text  # 171.1 GB/s
            else:  # reductions: 16 pieces in one stream per edge, cut into threadblocks
                assert params["split"] == 60 and params["pieces"] == 16


def test_a_ring_is_selected_at_every_power_of_two_size_in_its_range():
    from commflow.algorithms import build

    text = to_msccl_xml(build("allreduce", "ring", 8), "rccl", min_bytes=1024,
                        max_bytes=1 << 30)
    for exponent in range(10, 31):
        assert selected(text, (1 << exponent) // 4, 4)
    assert not selected(text, (1 << 31) // 4, 4) and not selected(text, 128, 4)


BASE = to_msccl_xml(registered(4)[0], "rccl")


@pytest.mark.parametrize(
    ("change", "runtime", "rule"),
    [
        (lambda t: t.replace('coll="allgather"', 'coll="reduce_scatter"'), "rccl", "coll"),
        (lambda t: t.replace('maxBytes="1073741824"', 'maxBytes="9223372036854775807"'),
         "msccl", "maxBytes"),
        (lambda t: t.replace('type="cpy"', 'type="copy"', 1), "rccl", "type"),
        (lambda t: t.replace('cnt="1"', 'cnt="80"', 1), "rccl", "cnt"),
        (lambda t: t.replace('depid="1"', 'depid="200"', 1), "rccl", "signed byte"),
        (lambda t: t.replace('nchannels="1"', 'nchannels="40"'), "rccl", "nchannels"),
        (lambda t: t.replace(' deps="1"', ' deps="50"', 1), "rccl", "missing step"),
        (lambda t: t.replace('type="cpy" srcbuf="s" srcoff="0"', 'type="cpy" srcbuf="s" srcoff="9"',
                             1), "rccl", "outside the buffer"),
        (lambda t: t.replace('hasdep="1"', 'hasdep="0"'), "rccl", "hasdep"),
        (lambda t: t.replace(' s="1"', ' s="5"', 1), "rccl", "s=5"),
    ],
)
def test_the_checker_catches_each_rule(change, runtime, rule):
    assert violations(BASE, "rccl") == []
    broken = change(BASE)
    assert broken != BASE
    assert any(rule in v for v in violations(broken, runtime))


def test_the_checker_counts_steps_threadblocks_and_elements():
    from commflow.algorithms import build

    deep = to_msccl_xml(build("allgather", "ring", 8, chunks=8), "msccl", proto="LL")
    assert violations(deep, "msccl") == []
    assert any(v.endswith("steps > 64") for v in violations(deep, "rccl"))
