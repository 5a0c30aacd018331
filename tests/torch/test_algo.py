"""Choosing algorithms per collective: COMMFLOW_ALGO and use_algorithms, parsed, validated,
nested, and passed to the runtime by every collective of the backend."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import commflow.torch as cft
from commflow.collectives import Collective
from commflow.errors import AlgorithmError

from .harness import run_group


def test_parse_reads_each_entry_and_accepts_torch_spellings():
    choice = cft.parse_algorithms(" allreduce:ring, all_gather:bruck,reduce_scatter:direct,")
    assert dict(choice) == {
        Collective.ALLREDUCE: "ring",
        Collective.ALLGATHER: "bruck",
        Collective.REDUCESCATTER: "direct",
    }
    assert dict(cft.parse_algorithms("")) == {}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("allreduce", "entry 'allreduce' must read collective:algorithm"),
        ("allreduce:", "must read collective:algorithm"),
        ("allsum:ring", "unknown collective 'allsum'"),
        ("allgather:halving_doubling", "no algorithm 'halving_doubling' for allgather"),
    ],
)
def test_parse_rejects_bad_entries(spec, message):
    with pytest.raises(AlgorithmError, match=message):
        cft.parse_algorithms(spec)


def test_context_overrides_environment_and_nests(monkeypatch):
    monkeypatch.setenv(cft.ENV_VAR, "allreduce:ring,broadcast:direct")
    assert cft.algorithm_for(Collective.ALLREDUCE) == "ring"
    assert cft.algorithm_for(Collective.ALLGATHER) == "auto"
    with cft.use_algorithms("allreduce:recursive_doubling", allgather="bruck"):
        assert cft.algorithm_for(Collective.ALLREDUCE) == "recursive_doubling"
        with cft.use_algorithms(allreduce="direct"):
            assert cft.algorithm_for(Collective.ALLREDUCE) == "direct"
            assert cft.algorithm_for(Collective.ALLGATHER) == "bruck"
        assert cft.algorithm_for(Collective.ALLREDUCE) == "recursive_doubling"
        assert cft.algorithm_for(Collective.BROADCAST) == "direct"
    assert cft.algorithm_for(Collective.ALLREDUCE) == "ring"
    assert cft.algorithm_for(Collective.ALLGATHER) == "auto"


def test_context_rejects_unknown_algorithms_before_entering():
    message = "use_algorithms: no algorithm 'fast' for allreduce"
    with pytest.raises(AlgorithmError, match=message), cft.use_algorithms(allreduce="fast"):
        pass
    assert cft.algorithm_for(Collective.ALLREDUCE) == "auto"


def _recorded_algorithms() -> dict[str, object]:
    """Every collective under COMMFLOW_ALGO or use_algorithms, with the algorithm each one
    passed to the communicator."""
    group = dist.group.WORLD
    seen: list[tuple[str, str]] = []
    comm = group.comm

    def spy(name):
        real = getattr(comm, name)

        def call(*args, algo="auto", **kwargs):
            seen.append((name, algo))
            return real(*args, algo=algo, **kwargs)

        return call

    for name in (
        "allreduce",
        "allgather",
        "reduce_scatter",
        "alltoall",
        "broadcast",
        "reduce",
        "gather",
        "scatter",
    ):
        setattr(comm, name, spy(name))
    n = dist.get_world_size()
    os.environ[cft.ENV_VAR] = "allreduce:ring,reducescatter:direct,gather:binomial_tree"
    dist.all_reduce(torch.ones(4))
    dist.reduce_scatter_single(torch.empty(1), torch.ones(n))
    dist.gather(torch.ones(1), [torch.empty(1) for _ in range(n)] if dist.get_rank() == 0 else None)
    with cft.use_algorithms(
        "allgather:bruck,alltoall:pairwise",
        allreduce="recursive_doubling",
        broadcast="direct",
        reduce="ring",
        scatter="binomial_tree",
    ):
        dist.all_reduce(torch.ones(4))
        dist.all_gather_single(torch.empty(n), torch.ones(1))
        dist.all_to_all_single(torch.empty(n), torch.ones(n))
        dist.broadcast(torch.ones(2), src=0)
        dist.reduce(torch.ones(2), dst=0)
        dist.scatter(torch.empty(1), [torch.ones(1)] * n if dist.get_rank() == 0 else None)
    os.environ[cft.ENV_VAR] = "allreduce:fastest"
    try:
        dist.all_reduce(torch.ones(4))
    except AlgorithmError as err:
        seen.append(("bad env", str(err)))
    try:
        dist.all_reduce(torch.ones(4, 2).t())
    except Exception as err:
        seen.append(("not contiguous", f"{type(err).__name__}: {err}"))
    return seen


def test_every_collective_passes_the_chosen_algorithm_to_the_runtime():
    for seen in run_group(_recorded_algorithms, 2):
        assert seen[:9] == [
            ("allreduce", "ring"),
            ("reduce_scatter", "direct"),
            ("gather", "binomial_tree"),
            ("allreduce", "recursive_doubling"),
            ("allgather", "bruck"),
            ("alltoall", "pairwise"),
            ("broadcast", "direct"),
            ("reduce", "ring"),
            ("scatter", "binomial_tree"),
        ]
        assert seen[9][0] == "bad env"
        assert "COMMFLOW_ALGO: no algorithm 'fastest' for allreduce" in seen[9][1]
        assert seen[10][0] == "not contiguous"
        assert seen[10][1].startswith("CommflowError: all_reduce tensor: tensor must be contiguous")
        assert len(seen) == 11
