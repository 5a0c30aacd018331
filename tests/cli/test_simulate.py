"""``commflow sim`` and ``commflow bound``: numbers equal the library's, nccl-tests layout."""

from __future__ import annotations

import json

import pytest

from commflow.algorithms import build
from commflow.sim import lower_bound, simulate
from commflow.topology import load

ALGO = "double_binary_tree"
SIZES = [1024, 8192, 65536]


def test_sim_json_matches_library(commflow):
    run = commflow(
        "sim",
        "allreduce",
        "--topo",
        "dgx1",
        "--algo",
        ALGO,
        "-b",
        "1K",
        "-e",
        "64K",
        "-f",
        "8",
        "--model",
        "flow",
        "--json",
    )
    assert run.code == 0, run.stderr
    records = json.loads(run.stdout)
    topo = load("dgx1")
    program = build("allreduce", ALGO, 8)
    assert [r["size"] for r in records] == SIZES
    for record, size in zip(records, SIZES, strict=True):
        result = simulate(program, topo, size, model="flow")
        bound = lower_bound("allreduce", topo, size)
        assert record == {
            "collective": "allreduce",
            "algo": ALGO,
            "topology": "dgx1",
            "model": "flow",
            "size": size,
            "count": size // 4,
            "dtype": "float32",
            "time_us": result.time * 1e6,
            "algbw": result.algbw / 1e9,
            "busbw": result.busbw / 1e9,
            "bound_time_us": bound.time * 1e6,
            "bound_busbw": bound.busbw / 1e9,
        }


def test_sim_table_rows(commflow):
    run = commflow(
        "sim",
        "allreduce",
        "--topo",
        "dgx1",
        "--algo",
        ALGO,
        "-b",
        "1K",
        "-e",
        "64K",
        "-f",
        "8",
        "-d",
        "half",
    )
    lines = run.stdout.splitlines()
    assert (
        lines[0] == f"# allreduce/{ALGO} on dgx1 (8 ranks), model alphabeta, "
        f"{build('allreduce', ALGO, 8).nsteps} steps"
    )
    assert lines[1] == "# binding cut all but {box0.gpu0}: 150.00 GB/s across it"
    assert lines[2].split() == [
        "#",
        "size(B)",
        "count",
        "type",
        "time(us)",
        "algbw(GB/s)",
        "busbw(GB/s)",
        "bound(us)",
        "%bound",
    ]
    topo, program = load("dgx1"), build("allreduce", ALGO, 8)
    rows = [line.split() for line in lines[3:]]
    assert len(rows) == len(SIZES)
    for row, size in zip(rows, SIZES, strict=True):
        result = simulate(program, topo, size)
        bound = lower_bound("allreduce", topo, size)
        assert row == [
            str(size),
            str(size // 2),
            "float16",
            f"{result.time * 1e6:.2f}",
            f"{result.algbw / 1e9:.2f}",
            f"{result.busbw / 1e9:.2f}",
            f"{bound.time * 1e6:.2f}",
            f"{bound.time / result.time * 100:.1f}",
        ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--topo", "dgx9", "--algo", ALGO], "error: unknown topology 'dgx9'"),
        (["--topo", "dgx1", "--algo", "nope"], "error: no algorithm 'nope' for allreduce"),
        (["--topo", "dgx1", "--algo", ALGO, "-b", "1X"], "error: cannot parse size '1X'"),
        (["--topo", "dgx1", "--algo", ALGO, "-b", "1M", "-e", "1K"], "error: bad size range"),
        (["--topo", "dgx1", "--algo", ALGO, "-d", "float17"], "error: unknown data type"),
        (["--topo", "dgx1", "--algo", ALGO, "--model", "x"],
         "error: Invalid value for '--model' / '-m': 'x' is not one of 'alphabeta', 'flow'"),
    ],
)
def test_sim_errors(commflow, args, message):
    run = commflow("sim", "allreduce", *args)
    assert run.code == 2 and run.stdout == ""
    assert run.stderr.startswith(message) and run.stderr.count("\n") == 1


def test_bound_allgather_on_dgx1_meets_the_reference(commflow):
    # REFERENCES.md: DGX-1 allgather algbw <= 171.43 GB/s, latency bound 2 steps.
    run = commflow("bound", "allgather", "--topo", "dgx1", "--size", "1G", "--json")
    doc = json.loads(run.stdout)
    assert round(doc["algbw"], 2) == 171.43 and doc["steps"] == 2
    b = lower_bound("allgather", load("dgx1"), 1 << 30)
    assert doc["time_us"] == b.time * 1e6 and doc["busbw"] == b.busbw / 1e9
    assert doc["cut"] == [load("dgx1").nodes[i].name for i in b.cut]
    assert (doc["binding"], doc["exact"]) == ("bandwidth", True)
    text = commflow("bound", "allgather", "--topo", "dgx1", "--size", "1G").stdout
    assert "algbw          171.43 GB/s" in text
    assert f"bandwidth part {b.bandwidth_time * 1e6:.2f} us" in text
    assert "latency part   2.00 us (2 rank hops)" in text


def test_bound_a100_allgather(commflow):
    # REFERENCES.md: DGX A100 x1 allgather algbw bound 8*300/7 = 342.857 GB/s.
    doc = json.loads(commflow("bound", "allgather", "--topo", "dgx-a100", "--json").stdout)
    assert doc["algbw"] == pytest.approx(8 * 300 / 7)


def test_bound_bad_size(commflow):
    run = commflow("bound", "allgather", "--topo", "dgx1", "--size", "lots")
    assert run.code == 2 and "error: cannot parse size 'lots'" in run.stderr


def test_sim_compares_algorithms_and_plots(commflow, tmp_path):
    from commflow.algorithms import build_for

    png = tmp_path / "cmp.png"
    run = commflow("sim", "allreduce", "--topo", "dgx1", "--algo", "ring,direct", "-b", "1K",
                   "-e", "1M", "-f", "1024", "--json", "--plot", str(png))
    assert run.code == 0, run.stderr
    records = json.loads(run.stdout)
    assert [(r["algo"], r["size"]) for r in records] == [
        ("ring", 1024), ("ring", 1 << 20), ("direct", 1024), ("direct", 1 << 20)]
    topo = load("dgx1")
    ring = simulate(build_for("allreduce", "ring", topo), topo, 1 << 20)
    assert records[1]["busbw"] == pytest.approx(ring.busbw / 1e9, rel=1e-3)
    assert png.read_bytes()[:4] == b"\x89PNG"
    table = commflow("sim", "allreduce", "--topo", "dgx1", "--algo", "all", "-b", "1K",
                     "-e", "1G", "-f", "1048576")
    assert table.code == 0
    lines = table.stdout.splitlines()
    header = lines[1].split()
    assert "multi_ring" in header and "ina" not in header  # dgx1 has no switch
    assert lines[2].split()[-2] == "direct" and lines[3].split()[-2] == "multi_ring"
    bad = commflow("sim", "allreduce", "--topo", "dgx1", "--algo", "ring,ina")
    assert bad.code == 2 and "links to no switch" in bad.stderr


def test_sim_codec_times_the_encoded_bytes_against_the_logical_size(commflow):
    from commflow.algorithms import build_for
    from commflow.compress import simulate_compressed, wire_fraction

    topo = load("dgx1")
    program = build_for("allreduce", "ring", topo)
    plain = simulate(program, topo, 1 << 30)
    int8 = simulate_compressed(program, topo, 1 << 30, "int8")
    wire = simulate(program, topo, (1 << 30) * wire_fraction("int8", 4))
    assert int8.time == wire.time and int8.size == 1 << 30
    assert int8.busbw == pytest.approx(plain.busbw * plain.time / wire.time)
    run = commflow("sim", "allreduce", "--topo", "dgx1", "--algo", "ring", "--codec", "int8",
                   "-b", "1G", "-e", "1G", "--json")
    record = json.loads(run.stdout)[0]
    assert record["time_us"] == pytest.approx(wire.time * 1e6)
    assert record["busbw"] == pytest.approx(int8.busbw / 1e9)
    bad = commflow("sim", "allreduce", "--topo", "dgx1", "--algo", "ring", "--codec", "int2")
    assert bad.code == 2
