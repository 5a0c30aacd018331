"""Synthesized programs passed as ``algo=`` run on real ranks and equal numpy exactly.

Programs come from :func:`commflow.synth.synthesize` on small topologies whose ranks are this
machine's processes: the ``ring4`` preset and an irregular three-rank box (a double link, a
single link, and a slower switch every rank hangs off). Inputs are small integers, so every sum
is exact; sizes include one element per block, whole multiples of the chunk factor and sizes
that are not (the plans then follow :func:`commflow.ir.element_trace`).
"""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from commflow import topology
from commflow.collectives import Collective
from commflow.errors import AlgorithmError, VerificationError
from commflow.ir import Program, from_json, load_program, save_program, to_json
from commflow.runtime import programs
from commflow.runtime.launcher import launch
from commflow.synth import synthesize
from commflow.topology import Node, NodeKind, duplex, make_topology

from .harness import run_world

DOCS = Path(__file__).resolve().parents[2] / "docs" / "runtime.md"

COLLECTIVES = (
    Collective.ALLGATHER,
    Collective.REDUCESCATTER,
    Collective.ALLREDUCE,
    Collective.BROADCAST,
    Collective.REDUCE,
    Collective.ALLTOALL,
)
FLAT = (Collective.ALLREDUCE, Collective.BROADCAST, Collective.REDUCE)
"""Collectives whose unit is the whole array (the others: one rank's block)."""


def _irregular() -> topology.Topology:
    """Three ranks: 0-1 two 50 GB/s links, 1-2 one, and every rank 25 GB/s to a switch."""
    nodes = [Node(i, NodeKind.RANK, f"gpu{i}") for i in range(3)]
    nodes.append(Node(3, NodeKind.SWITCH, "switch"))
    links = duplex(0, 1, 50e9, 1e-6, 2) + duplex(1, 2, 50e9, 1e-6)
    for rank in range(3):
        links += duplex(rank, 3, 25e9, 1e-6)
    return make_topology("irregular3", nodes, links)


def _programs(topo: topology.Topology) -> dict[Collective, Program]:
    root = topo.nranks - 1  # rooted programs take the last rank as root
    return {c: synthesize(c, topo, pieces=2, root=root) for c in COLLECTIVES}


RING4 = _programs(topology.load("ring4"))
IRREGULAR3 = _programs(_irregular())  # for correctness: links of three speeds, parallel ones


def _inputs(rank: int, elements: int, dtype: str) -> np.ndarray:
    """Rank ``rank``'s input: small integers that differ by rank and position."""
    return ((np.arange(elements) * 7 + rank * 3) % 11 - 5).astype(dtype)


def _run(comm, coll: Collective, prog: Program, count: int, dtype: str):
    """Run ``prog`` on units of ``count`` elements; return ``(got, want)`` on this rank."""
    n, r, root = comm.size, comm.rank, comm.size - 1
    whole = count if coll in FLAT else count * n
    inputs = [_inputs(q, whole, dtype) for q in range(n)]
    mine, total = inputs[r], np.sum(inputs, axis=0, dtype=dtype)
    if coll is Collective.ALLGATHER:
        return comm.allgather(mine[:count], algo=prog), np.concatenate([a[:count] for a in inputs])
    if coll is Collective.REDUCESCATTER:
        return comm.reduce_scatter(mine, algo=prog), total[r * count : (r + 1) * count]
    if coll is Collective.ALLREDUCE:
        out = mine.copy()
        comm.allreduce(out, algo=prog, out=out)  # in place
        return out, total
    if coll is Collective.BROADCAST:
        return comm.broadcast(mine.copy(), root, algo=prog), inputs[root]
    if coll is Collective.REDUCE:
        got = comm.reduce(mine.copy(), root, algo=prog, async_op=True).wait()
        return got, total if r == root else mine
    blocks = [a.reshape(n, count) for a in inputs]
    return comm.alltoall(mine, algo=prog), np.concatenate([b[r] for b in blocks])


def _check_all(comm, progs: dict[Collective, Program]) -> list[str]:
    failures = []
    for coll, prog in progs.items():
        cf = prog.chunk_factor
        for count in (1, 2 * cf, 2 * cf + 3):
            for dtype in ("float32", "int32"):
                got, want = _run(comm, coll, prog, count, dtype)
                if got.dtype != want.dtype or not np.array_equal(got, want):
                    failures.append(
                        f"{coll.value} ({prog.name}, cf {cf}) {dtype} count={count}: "
                        f"got {got.tolist()} want {want.tolist()}"
                    )
    return failures


@pytest.mark.parametrize("progs", [RING4, IRREGULAR3], ids=["ring4", "irregular3"])
def test_synthesized_programs_equal_numpy_on_real_ranks(progs):
    nranks = next(iter(progs.values())).nranks
    results = run_world(_check_all, nranks, progs, timeout=60)
    failures = [f for per_rank in results for f in per_rank]
    assert not failures, "\n".join(failures[:10])


def test_chunk_factors_are_not_trivial():
    """The sizes above exercise real pieces: every program cuts blocks into several chunks."""
    assert min(p.chunk_factor for p in [*RING4.values(), *IRREGULAR3.values()]) >= 2
    assert RING4[Collective.ALLREDUCE].chunk_factor > 4


def _from_file(comm, path: str) -> list[int]:
    prog = load_program(path)
    return comm.allgather(np.full(5, comm.rank, np.int32), algo=prog).tolist()


def test_program_loaded_from_json_runs(tmp_path):
    path = tmp_path / "ag.json"
    save_program(RING4[Collective.ALLGATHER], path)
    results = run_world(_from_file, 4, str(path))
    assert results == [[r for r in range(4) for _ in range(5)]] * 4


@pytest.mark.parametrize(
    ("prog", "coll", "nranks", "root", "message"),
    [
        (
            RING4[Collective.ALLGATHER],
            Collective.ALLREDUCE,
            4,
            0,
            "implements allgather, not allreduce",
        ),
        (RING4[Collective.ALLREDUCE], Collective.ALLREDUCE, 3, 0, "is for 4 ranks, not 3"),
        (RING4[Collective.BROADCAST], Collective.BROADCAST, 4, 0, "has root 3, not 0"),
    ],
)
def test_adopt_rejects_a_program_for_another_call(prog, coll, nranks, root, message):
    with pytest.raises(AlgorithmError, match=message) as info:
        programs.adopt(prog, coll, nranks, root, rank=2)
    assert str(info.value).startswith(f"{coll.value} on rank 2: program {prog.name!r}")
    assert "pass a program built or synthesized for this call" in str(info.value)


def _mismatch(comm, wrong_size: Program, wrong_kind: Program) -> list[str]:
    errors = []
    for call in (
        lambda: comm.allreduce(np.ones(8, np.float32), algo=wrong_size),
        lambda: comm.allgather(np.ones(8, np.float32), algo=wrong_kind),
    ):
        try:
            call()
        except AlgorithmError as error:
            errors.append(str(error))
    return errors


def test_communicator_raises_on_every_rank_without_running():
    results = run_world(
        _mismatch, 3, RING4[Collective.ALLREDUCE], IRREGULAR3[Collective.REDUCESCATTER]
    )
    for rank, (size_error, kind_error) in enumerate(results):
        assert size_error.startswith(f"allreduce on rank {rank}: program 'allreduce/synth_trees'")
        assert "is for 4 ranks, not 3" in size_error
        assert kind_error.startswith(f"allgather on rank {rank}:")
        assert "implements reducescatter, not allgather" in kind_error


def test_a_program_is_verified_once_per_object(monkeypatch):
    calls = []
    monkeypatch.setattr(programs, "verify", calls.append)
    text = to_json(IRREGULAR3[Collective.ALLTOALL])
    first, second = from_json(text), from_json(text)  # equal programs, distinct objects
    names = [programs.adopt(p, Collective.ALLTOALL, 3, 0, 0) for p in (first, first, second)]
    assert calls == [first, second]
    assert len(set(names)) == 1 and names[0].startswith("alltoall/synth_lp@")
    assert programs.program(Collective.ALLTOALL, names[0], 3, None) in (first, second)


def test_a_program_that_fails_verification_is_refused_before_running():
    doc = json.loads(to_json(RING4[Collective.ALLGATHER]))
    doc["participants"][1]["channels"][0]["steps"][1]["dst"] = ["output", 0, 1]
    broken = from_json(json.dumps(doc))  # rank 1 receives output chunk 0 twice, never chunk 1
    with pytest.raises(VerificationError, match=r"^rank 1, .*: allgather/synth_trees: "):
        programs.adopt(broken, Collective.ALLGATHER, 4, 0, rank=0)


def _different_programs(comm, mine: Program, others: Program) -> list[int]:
    return comm.allgather(np.ones(12, np.float32), algo=mine if comm.rank == 0 else others)


def test_ranks_passing_different_programs_fail_with_a_mismatch():
    other = synthesize(Collective.ALLGATHER, topology.load("ring4"), pieces=3)
    assert other.name == RING4[Collective.ALLGATHER].name
    results = run_world(
        _different_programs,
        4,
        RING4[Collective.ALLGATHER],
        other,
        timeout=10,
        expect_failure=True,
    )
    assert [ok for ok, _ in results] == [False] * 4
    assert all(text.startswith("CommMismatchError: ") for _, text in results)


def _docs_section() -> str:
    return DOCS.read_text().split("## Running your own or a synthesized program", 1)[1]


def test_the_docs_example_runs_under_the_launcher(tmp_path, monkeypatch):
    section = _docs_section()
    script = re.search(r"```python\n(.*?)```", section, re.DOTALL)[1]
    console = re.search(r"```console\n(.*?)```", section, re.DOTALL)[1].splitlines()
    assert console[0] == "$ commflow synth allgather --topo ring4 --pieces 2 -o ag4.json"
    assert console[1] == "$ commflow run -n 4 ring4_allgather.py"
    monkeypatch.chdir(tmp_path)
    save_program(RING4[Collective.ALLGATHER], "ag4.json")  # what the synth line writes
    Path("ring4_allgather.py").write_text(script)
    out = io.BytesIO()
    assert launch([sys.executable, "ring4_allgather.py"], 4, stdout=out, timeout=60) == 0
    assert sorted(out.getvalue().decode().splitlines()) == console[2:]
