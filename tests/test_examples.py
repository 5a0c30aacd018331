"""Every script in examples/ runs, and prints what the library computes."""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import commflow

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run(name: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def check_sim_dgx1(stdout: str) -> None:
    topo = commflow.load_topology("dgx1")
    blocks = re.split(r"^(\w+): (\d+) steps, verified$", stdout, flags=re.MULTILINE)
    algos = blocks[1::3]
    assert algos == ["ring", "double_binary_tree"]
    for algo, steps, body in zip(blocks[1::3], blocks[2::3], blocks[3::3], strict=True):
        program = commflow.build("allreduce", algo, 8, chunks=4)
        assert int(steps) == program.nsteps
        rows = re.findall(
            r"^\s+(\d+) B\s+time\s+([\d.]+) us\s+busbw\s+([\d.]+) GB/s\s+bound\s+"
            r"([\d.]+) us",
            body,
            flags=re.MULTILINE,
        )
        assert len(rows) == 4
        for size, time_us, busbw, bound_us in rows:
            result = commflow.simulate(program, topo, int(size))
            bound = commflow.lower_bound("allreduce", topo, int(size))
            assert time_us == f"{result.time * 1e6:.2f}"
            assert busbw == f"{result.busbw / 1e9:.2f}"
            assert bound_us == f"{bound.time * 1e6:.2f}"
            assert bound.time <= result.time
    assert re.search(
        r"^binding cut: \{box0\.gpu\d.*\} at [\d.]+ GB/s \(bandwidth\)$", stdout, flags=re.MULTILINE
    )


def check_custom_program(stdout: str) -> None:
    lines = stdout.splitlines()
    assert lines[0] == "verified: allgather my_ring_allgather on 4 ranks, 28 steps"
    assert lines[1].startswith("rejected: rank 3, channel 0: mismatched send/recv")
    algo = ET.fromstring("\n".join(lines[2:]))
    assert (algo.get("coll"), algo.get("ngpus"), algo.get("nchunksperloop")) == (
        "allgather",
        "4",
        "4",
    )
    for gpu in algo.findall("gpu"):
        (tb,) = gpu.findall("tb")  # copy, then the ring: one threadblock per rank
        # each receive-then-forward fuses into receive-copy-send, as msccl-tools writes it
        assert [s.get("type") for s in tb.findall("step")] == ["cpy", "s", "rcs", "rcs", "r"]


CHECKS = {"sim_dgx1.py": check_sim_dgx1, "custom_program.py": check_custom_program}


LAUNCHED = {"train_ddp.py": "tests/torch/test_example.py (under commflow run and torchrun)",
            "train_fsdp_tp.py": "tests/torch/test_fsdp_tp.py (against gloo, 4 ranks)",
            "train_elastic.py": "tests/runtime/test_resilience.py (4 ranks, one killed)"}
"""Examples that need several ranks, checked where their launchers are tested."""


def test_every_example_is_checked():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted({**CHECKS, **LAUNCHED})


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_example_output(name):
    CHECKS[name](run(name))
