"""Ranks on two hosts (one rank each, the engine transport between them): the commflow
backend's all-reduces run on the communicator's lanes, several in flight, and
PriorityScheduler (in the background, and in the loop) and DDP over it still train like DDP on
gloo."""

from __future__ import annotations

import os
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist

from commflow.runtime.transport import engine
from commflow.torch.checks import PIECE_BYTES, split_pieces

from .harness import run_group
from .test_sched import MODELS, _ddp, _scheduled

NAMES = ("mlp", "attention", "mixed dtypes")


def _on_two_hosts() -> dict[str, object]:
    os.environ.update(COMMFLOW_HOST=os.environ["RANK"], COMMFLOW_DELAY_US="100")
    dist.init_process_group("commflow", timeout=timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    out: dict[str, object] = {"slots": dist.group.WORLD.comm.slots}
    big = torch.arange(5 << 18, dtype=torch.int32) * (dist.get_rank() + 1)  # 5 MiB: 4 pieces
    dist.all_reduce(big)
    avg = torch.full((3 << 18,), float(dist.get_rank()), dtype=torch.float64)  # 6 MiB
    dist.all_reduce(avg, op=dist.ReduceOp.AVG)
    out["big"] = (big.numpy().copy(), avg.numpy().copy())
    for name in NAMES:
        out[name] = {"ddp gloo": _ddp(name, gloo), "ddp commflow": _ddp(name, None),
                     "background": _scheduled(name, True, background=True),
                     "in the loop": _scheduled(name, True)}
    dist.destroy_process_group()
    return out


def test_large_allreduces_are_cut_into_pieces_of_a_mebibyte_or_more():
    sizes = {n: [p.size for p in split_pieces(np.zeros(n, np.float32), 4)]
             for n in (10, PIECE_BYTES // 4, PIECE_BYTES // 2 - 1, PIECE_BYTES // 2 + 5,
                       PIECE_BYTES)}
    assert sizes == {10: [10], 262144: [262144], 524287: [524287], 524293: [262147, 262146],
                     1048576: [262144] * 4}
    assert len(split_pieces(np.zeros(PIECE_BYTES, np.float64), 2)) == 2


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_group(_on_two_hosts, 2, backend=None, timeout=60)


def test_two_hosts_of_one_rank_run_several_allreduces_at_once(results):
    assert [r["slots"] for r in results] == [engine.SLOTS] * 2
    for res in results:  # the pieces of a large all-reduce land where they belong
        big, avg = res["big"]
        np.testing.assert_array_equal(big, np.arange(5 << 18, dtype=np.int32) * 3)
        np.testing.assert_array_equal(avg, np.full(3 << 18, 0.5))
    # more than one of the scheduler's allreduces was incomplete at some launch: credits 2
    assert max(max(r[name]["in the loop"]["outstanding"]) for r in results
               for name in NAMES) == 2


def _params(res: dict, name: str, mode: str) -> list[np.ndarray]:
    got = res[name][mode]
    return got if isinstance(got, list) else got["params"]


@pytest.mark.parametrize("mode", ["ddp commflow", "background", "in the loop"])
def test_parameters_equal_ddp_on_gloo_across_hosts(results, mode):
    assert set(NAMES) <= set(MODELS)
    for res in results:
        for name in NAMES:
            for p, q in zip(_params(res, name, mode), res[name]["ddp gloo"], strict=True):
                np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-6, err_msg=name)
    for name in NAMES:  # the replicas stay identical
        for p, q in zip(*(_params(r, name, mode) for r in results), strict=True):
            np.testing.assert_array_equal(p, q)
