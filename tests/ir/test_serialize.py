"""JSON round trips are exact, and every malformed field is named by its JSON path."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import commflow.algorithms as algorithms
from commflow.collectives import Collective
from commflow.errors import AlgorithmError, ProgramError
from commflow.ir import (
    Program,
    ProgramBuilder,
    from_json,
    inp,
    load_program,
    out,
    save_program,
    scr,
    to_json,
    verify,
)

from .programs import ring_allgather, ring_allreduce, two_channel_allgather

COLUMNS = ("part", "chan", "op", "peer", "src_buf", "src_off", "dst_buf", "dst_off", "count")


def assert_same(a: Program, b: Program) -> None:
    """Every field, column and dependency of two programs is identical."""
    assert (a.name, a.collective, a.nranks, a.chunk_factor, a.root) == (
        b.name,
        b.collective,
        b.nranks,
        b.chunk_factor,
        b.root,
    )
    assert a.participants == b.participants
    assert a.params == b.params
    for k in (*COLUMNS, "dep_ptr", "dep_idx"):
        x, y = getattr(a.table, k), getattr(b.table, k)
        assert x.dtype == y.dtype and np.array_equal(x, y), k


def switch_reduce() -> Program:
    """Two ranks reduce through a switch (scratch only), rooted at rank 1, with params."""
    b = ProgramBuilder(
        Collective.REDUCE,
        2,
        chunk_factor=1,
        name="switch-reduce",
        root=1,
        params={"fanout": 2, "tiers": (1, (2, 3)), "label": "x"},
    )
    sw = b.add_switch()
    b.send(0, sw, inp(0))
    b.recv(sw, 0, scr(0))
    b.send(1, sw, inp(0), channel=1)
    b.recv_reduce(sw, 1, scr(0), scr(1), channel=1)
    b.send(sw, 1, scr(1), channel=1)
    b.recv(1, sw, out(0), channel=1)
    return b.build()


def scratch_allgather() -> Program:
    """Allgather through scratch with a local copy and reduce-free cross-channel deps."""
    b = ProgramBuilder(Collective.ALLGATHER, 2, chunk_factor=1, name="scratch-ag")
    for r in range(2):
        c = b.copy(r, inp(0), out(r), channel=2)
        b.send(r, 1 - r, inp(0), deps=[c])
        got = b.recv(r, 1 - r, scr(0))
        b.copy(r, scr(0), out(1 - r), channel=2, deps=[got])
    return b.build()


HAND_WRITTEN = [
    ring_allgather(5),
    ring_allreduce(4),
    two_channel_allgather(3),
    switch_reduce(),
    scratch_allgather(),
]


def registered(nranks: int) -> list[Program]:
    """One program per registered algorithm that applies to ``nranks`` ranks."""
    programs = []
    for algo in algorithms.available():
        try:
            programs.append(algorithms.build(algo.collective, algo.name, nranks, chunks=2))
        except AlgorithmError:
            continue
    return programs


@pytest.mark.parametrize("program", HAND_WRITTEN, ids=lambda p: p.name)
def test_round_trip_is_exact(program):
    back = from_json(to_json(program))
    assert_same(program, back)
    assert to_json(back) == to_json(program)


def test_round_trip_keeps_switches_params_and_root():
    back = from_json(to_json(switch_reduce(), indent=2))
    assert back.root == 1
    assert [p.kind.name for p in back.participants] == ["RANK", "RANK", "SWITCH"]
    assert back.participants[2].scratch_chunks == 2
    assert dict(back.params) == {"fanout": 2, "tiers": (1, (2, 3)), "label": "x"}


def test_round_trip_of_every_registered_algorithm():
    programs = registered(6)
    assert len(programs) >= 5
    for program in programs:
        back = from_json(to_json(program))
        assert_same(program, back)
        verify(back)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(2, 9), which=st.integers(0, 2))
def test_round_trip_property(n, which):
    program = (ring_allgather, ring_allreduce, two_channel_allgather)[which](n)
    assert_same(program, from_json(to_json(program)))


def test_document_layout_matches_the_schema():
    doc = json.loads(to_json(two_channel_allgather(2)))
    assert doc["format"] == "commflow.program" and doc["version"] == 1
    assert (doc["collective"], doc["nranks"], doc["chunk_factor"], doc["root"]) == (
        "allgather",
        2,
        1,
        None,
    )
    rank0 = doc["participants"][0]
    assert rank0["kind"] == "rank" and rank0["scratch_chunks"] == 0
    assert [c["id"] for c in rank0["channels"]] == [0, 1]
    assert rank0["channels"][1]["steps"] == [
        {"op": "copy", "peer": None, "src": ["input", 0, 1], "dst": ["output", 0, 1], "deps": []}
    ]
    assert rank0["channels"][0]["steps"][0] == {
        "op": "send",
        "peer": 1,
        "src": ["output", 0, 1],
        "dst": None,
        "deps": [[1, 0]],
    }


def test_channels_in_any_order_are_accepted():
    doc = json.loads(to_json(two_channel_allgather(2)))
    for part in doc["participants"]:
        part["channels"].reverse()
    assert_same(two_channel_allgather(2), from_json(json.dumps(doc)))


BASE = json.loads(to_json(two_channel_allgather(3)))


def _set(path: list, value) -> str:
    doc = copy.deepcopy(BASE)
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return json.dumps(doc)


_DELETE = object()
STEP = ["participants", 2, "channels", 0, "steps", 1]


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (["format"], "other", "format: expected 'commflow.program'"),
        (["version"], 2, "version: this commflow reads version 1"),
        (["name"], 3, "name: expected a string, got an integer 3"),
        (["collective"], "allsum", "collective: unknown collective 'allsum'"),
        (["nranks"], 0, "nranks: must be between 1 and"),
        (["nranks"], True, "nranks: expected an integer, got a boolean"),
        (["chunk_factor"], 1.5, "chunk_factor: expected an integer, got a number 1.5"),
        (["root"], 0, "root: allgather has no root; write null"),
        (["params"], [], "params: expected an object"),
        (["extra"], 1, "document: unknown field(s) extra"),
        (["participants"], _DELETE, "document: missing field(s) participants"),
        (["participants", 1, "kind"], "switch", "participants[1].kind: expected 'rank'"),
        (["participants", 1, "scratch_chunks"], -1, "participants[1].scratch_chunks: must be"),
        (["participants", 1, "scratch_chunks"], 2, "participants[1].scratch_chunks: declares 2"),
        (["participants", 0, "channels", 1, "id"], 0, "participants[0].channels[1].id: channel "),
        (["participants", 0, "channels", 0, "steps"], [], "channels[0].steps: a channel needs"),
        ([*STEP, "op"], "sned", "participants[2].channels[0].steps[1].op: unknown op 'sned'"),
        ([*STEP, "op"], ["send"], "steps[1].op: unknown op ['send']"),
        ([*STEP, "peer"], None, "steps[1].peer: expected an integer, got null"),
        ([*STEP, "peer"], 2**40, "steps[1].peer: must be between 0 and 2147483647"),
        ([*STEP, "src"], ["input", 0, 1], "steps[1].src: a recv step has no src: write null"),
        ([*STEP, "dst"], ["output", 1], "steps[1].dst: expected [buffer, index, count]"),
        ([*STEP, "dst"], ["outptu", 1, 1], "steps[1].dst[0]: unknown buffer 'outptu'"),
        ([*STEP, "dst"], ["output", -1, 1], "steps[1].dst[1]: must be between 0"),
        ([*STEP, "dst"], ["output", 1, 0], "steps[1].dst[2]: must be between 1"),
        ([*STEP, "dst"], ["output", 2, 2], "chunk reference outside its buffer"),
        ([*STEP, "deps"], [[1]], "steps[1].deps[0]: expected [channel, position]"),
        ([*STEP, "deps"], [[1, 5]], "steps[1].deps[0]: participant 2 has no step 5 on channel 1"),
        ([*STEP, "deps"], [[0, 1]], "dependency on itself"),
        ([*STEP, "extra"], 0, "participants[2].channels[0].steps[1]: unknown field(s) extra"),
        ([*STEP[:-1], 0, "peer"], 2, "peer is the participant itself"),
        ([*STEP[:-1], 0, "peer"], 7, "peer out of range"),
    ],
)
def test_malformed_field_names_its_path(path, value, message):
    with pytest.raises(ProgramError) as err:
        from_json(_set(path, value))
    assert message in str(err.value)


def test_copy_with_mismatched_counts_is_rejected():
    doc = json.loads(to_json(two_channel_allgather(2)))
    doc["participants"][0]["channels"][1]["steps"][0]["dst"] = ["output", 0, 2]
    with pytest.raises(ProgramError, match=r"channels\[1\]\.steps\[0\]\.dst: moves 2 chunk"):
        from_json(json.dumps(doc))


def test_not_json_and_not_an_object():
    with pytest.raises(ProgramError, match="not a JSON document"):
        from_json("{nope")
    with pytest.raises(ProgramError, match="document: expected an object, got a list"):
        from_json("[]")


@pytest.mark.parametrize("value", [object(), float("nan")])
def test_unserializable_param_is_reported(value):
    b = ProgramBuilder(Collective.ALLGATHER, 1, chunk_factor=1, name="p", params={"f": value})
    b.copy(0, inp(0), out(0))
    with pytest.raises(ProgramError, match="p: a parameter has no JSON form"):
        to_json(b.build())


def test_save_and_load(tmp_path):
    path = tmp_path / "ring.json"
    save_program(ring_allreduce(3), path)
    assert_same(ring_allreduce(3), load_program(path))
    path.write_text(path.read_text().replace('"recv_reduce"', '"sned"', 1))
    with pytest.raises(ProgramError, match=rf"^{path}: participants\[0\]\..*unknown op 'sned'"):
        load_program(path)
    with pytest.raises(ProgramError, match="cannot read program file .*missing.json"):
        load_program(tmp_path / "missing.json")
    with pytest.raises(ProgramError, match="cannot write program file"):
        save_program(ring_allreduce(3), tmp_path / "no" / "dir.json")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ProgramError, match="binary.json is not a text file"):
        load_program(tmp_path / "binary.json")


def test_hundred_thousand_steps_round_trip():
    program = ring_allreduce(160)
    assert program.nsteps > 100_000
    assert_same(program, from_json(to_json(program)))
