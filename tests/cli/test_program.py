"""``commflow build``, ``verify`` and ``export``: files that match the library's programs."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from commflow.algorithms import build
from commflow.ir import load_program, to_json, to_msccl_xml

ALGO = "double_binary_tree"


@pytest.fixture
def program_file(commflow, tmp_path):
    path = tmp_path / "dbt.json"
    run = commflow(
        "build", "allreduce", "--algo", ALGO, "-n", "8", "--chunks", "2", "-o", str(path)
    )
    assert run.code == 0, run.stderr
    return path


def test_build_writes_the_verified_program(commflow, program_file):
    want = build("allreduce", ALGO, 8, chunks=2)
    assert to_json(load_program(program_file)) == to_json(want)


def test_build_reports_what_it_wrote(commflow, tmp_path):
    path = tmp_path / "b.json"
    run = commflow(
        "build", "broadcast", "--algo", "binomial_tree", "-n", "5", "--root", "3", "-o", str(path)
    )
    steps = build("broadcast", "binomial_tree", 5, root=3).nsteps
    assert (
        run.stdout == f"wrote {path}: broadcast binomial_tree on 5 ranks, {steps} steps "
        "(verified)\n"
    )
    assert load_program(path).root == 3


def test_build_with_extra_param(commflow, tmp_path):
    path = tmp_path / "h.json"
    assert (
        commflow(
            "build",
            "allreduce",
            "--algo",
            "hierarchical",
            "-n",
            "8",
            "--param",
            "box=4",
            "-o",
            str(path),
        ).code
        == 0
    )
    assert dict(load_program(path).params)["box"] == 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--algo", "nope", "-n", "4"], "error: no algorithm 'nope' for allreduce; available:"),
        (["--algo", ALGO, "-n", "4", "--param", "box"], "error: --param 'box': write key=value"),
        (["--algo", ALGO, "-n", "4", "--param", "x=1"], "unknown parameter(s) ['x']"),
        (["--algo", ALGO, "-n", "0"], "nranks must be >= 1"),
    ],
)
def test_build_errors(commflow, tmp_path, args, message):
    run = commflow("build", "allreduce", *args, "-o", str(tmp_path / "x.json"))
    assert run.code == 2 and message in run.stderr
    assert not (tmp_path / "x.json").exists()


def test_verify_ok(commflow, program_file):
    run = commflow("verify", str(program_file))
    steps = build("allreduce", ALGO, 8, chunks=2).nsteps
    assert (run.code, run.stdout) == (0, f"OK: allreduce {ALGO} on 8 ranks, {steps} steps\n")


def test_verify_failure_exits_1_with_the_problem(commflow, program_file):
    doc = json.loads(program_file.read_text())
    doc["participants"][1]["channels"][0]["steps"].pop()
    program_file.write_text(json.dumps(doc))
    run = commflow("verify", str(program_file))
    assert run.code == 1 and run.stdout == ""
    assert run.stderr.startswith("FAILED: rank ") and "mismatched send/recv" in run.stderr


def test_export_refuses_a_program_that_verify_refuses(commflow, program_file, tmp_path):
    doc = json.loads(program_file.read_text())
    doc["participants"][1]["channels"][0]["steps"].pop()
    program_file.write_text(json.dumps(doc))
    run = commflow("export", str(program_file), "--xml", str(tmp_path / "x.xml"))
    assert run.code == 1 and run.stderr.startswith("FAILED: rank ")
    assert "mismatched send/recv" in run.stderr and "nothing written" in run.stderr
    assert not (tmp_path / "x.xml").exists()


def test_verify_of_malformed_file_names_the_field(commflow, program_file):
    program_file.write_text(program_file.read_text().replace('"send"', '"sned"', 1))
    run = commflow("verify", str(program_file))
    assert run.code == 2
    assert f"error: {program_file}: participants[0].channels[0].steps[" in run.stderr
    assert "unknown op 'sned'" in run.stderr


@pytest.mark.parametrize("target", ["msccl", "msccl-executor", "rccl"])
def test_export_writes_msccl_xml(commflow, program_file, tmp_path, target):
    xml = tmp_path / "out.xml"
    run = commflow("export", str(program_file), "--xml", str(xml), "--target", target,
                   "--max-bytes", "64M")
    assert run.code == 0 and f"as MSCCL XML ({target})" in run.stdout
    program = load_program(program_file)
    assert xml.read_text() == to_msccl_xml(program, target, max_bytes=64 << 20)
    assert ET.fromstring(xml.read_text()).get("ngpus") == "8"


def test_export_refuses_a_program_that_hangs_on_the_target(commflow, tmp_path):
    program_file = tmp_path / "ring.json"
    assert commflow("build", "allreduce", "--algo", "ring", "-n", "4", "--chunks", "3",
                    "-o", str(program_file)).code == 0
    run = commflow("export", str(program_file), "--xml", str(tmp_path / "o.xml"))
    assert run.code == 1 and "deadlock on msccl (Simple, 8 slots per connection" in run.stderr
    assert not (tmp_path / "o.xml").exists()
    run = commflow("export", str(program_file), "--xml", str(tmp_path / "o.xml"), "--proto", "LL")
    assert run.code == 0


def test_export_bad_protocol(commflow, program_file, tmp_path):
    run = commflow("export", str(program_file), "--xml", str(tmp_path / "o.xml"), "--proto", "X")
    assert run.code == 2 and run.stderr == (
        "error: Invalid value for '--proto': 'X' is not one of 'Simple', 'LL', 'LL128'. "
        "(see 'commflow export -h')\n"
    )
