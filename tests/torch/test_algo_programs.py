"""A program file as the algorithm of the torch backend: ``COMMFLOW_ALGO=allgather:FILE.json``
loads the program once and the ranks run it for real."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import commflow.torch as cft
from commflow import topology
from commflow.collectives import Collective
from commflow.errors import AlgorithmError, ProgramError
from commflow.ir import Program, load_program, save_program
from commflow.synth import synthesize

from .harness import run_group


@pytest.fixture
def allgather_file(tmp_path):
    path = tmp_path / "ag2.json"
    save_program(synthesize("allgather", topology.load("ring2"), pieces=3), path)
    return str(path)


def test_a_program_file_is_loaded_once_for_its_collective(allgather_file):
    first = cft.parse_algorithms(f"allgather:{allgather_file}")[Collective.ALLGATHER]
    again = cft.parse_algorithms(f"allreduce:ring, all_gather:{allgather_file}")
    assert isinstance(first, Program) and first.name == "allgather/synth_trees"
    assert again[Collective.ALLGATHER] is first
    assert again[Collective.ALLREDUCE] == "ring"


def test_a_program_file_for_another_collective_or_missing_is_refused(allgather_file, tmp_path):
    with pytest.raises(AlgorithmError, match="implements allgather, not allreduce"):
        cft.parse_algorithms(f"allreduce:{allgather_file}")
    missing = str(tmp_path / "missing.json")
    with (
        pytest.raises(ProgramError, match="^use_algorithms: cannot read program file"),
        cft.use_algorithms(allgather=missing),
    ):
        pass


def _allgather_under_env(path: str) -> tuple[list[str], list[float]]:
    """Allgather 7 elements per rank under ``COMMFLOW_ALGO``; the algorithms the communicator
    was given, and the result."""
    comm, seen = dist.group.WORLD.comm, []
    real = comm.allgather

    def spy(*args, algo="auto", **kwargs):
        seen.append(algo.name if isinstance(algo, Program) else algo)
        return real(*args, algo=algo, **kwargs)

    comm.allgather = spy
    os.environ[cft.ENV_VAR] = f"allgather:{path}"
    rank, n = dist.get_rank(), dist.get_world_size()
    out = torch.empty(7 * n)
    dist.all_gather_into_tensor(out, torch.arange(7.0) + 10 * rank)
    return seen, out.tolist()


def test_ranks_run_the_program_named_by_commflow_algo(allgather_file):
    assert 7 % load_program(allgather_file).chunk_factor  # uneven chunks
    want = [float(i + 10 * r) for r in range(2) for i in range(7)]
    result = (["allgather/synth_trees"], want)
    assert run_group(_allgather_under_env, 2, allgather_file) == [result, result]
