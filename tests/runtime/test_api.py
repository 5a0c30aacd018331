"""Communicator API details: in-place calls, async handles, torch tensors, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from commflow.runtime.calls import in_place

from .harness import run_world


def _in_place(comm):
    n, r = comm.size, comm.rank
    for algo, rs_algo in (("ring", "halving_doubling"), ("shm", "shm")):
        x = np.arange(3000, dtype=np.int32) + r
        same = comm.allreduce(x, out=x, algo=algo)
        assert same is x
        assert np.array_equal(x, np.arange(3000) * n + sum(range(n)))
        y = np.arange(6 * n, dtype=np.float64) + r
        z = comm.reduce_scatter(y, algo=rs_algo, out=y[6 * r:6 * r + 6])
        assert np.array_equal(z, np.arange(6 * r, 6 * r + 6) * n + sum(range(n)))
        g = np.full(4 * n, -1, dtype=np.int32)
        g[4 * r:4 * r + 4] = r
        comm.allgather(g[4 * r:4 * r + 4], out=g, algo=algo)
        assert np.array_equal(g, np.repeat(np.arange(n), 4))
    b = np.full(5, r, dtype=np.int64)
    comm.broadcast(b, root=n - 1)
    assert np.array_equal(b, np.full(5, n - 1))
    return True


def _async(comm):
    n, r = comm.size, comm.rank
    handles = [comm.allreduce(np.full(1000, r + i, np.float32), async_op=True, algo=algo)
               for i, algo in enumerate(["ring", "shm", "recursive_doubling"])]
    gathered = comm.allgather(np.array([r]), async_op=True)
    sums = [h.wait(timeout=30) for h in handles]
    assert all(h.is_completed() for h in handles)
    assert [float(s[0]) for s in sums] == [sum(range(n)) + i * n for i in range(3)]
    assert gathered.wait().tolist() == list(range(n))
    after = comm.allreduce(np.ones(3, np.int8))  # a blocking call after async ones
    return after.tolist()


def _torch_tensors(comm):
    import torch

    r, n = comm.rank, comm.size
    t = torch.full((4, 3), float(r + 1), dtype=torch.bfloat16)
    comm.allreduce(t, out=t)
    assert t.dtype == torch.bfloat16 and torch.all(t == n * (n + 1) / 2)
    g = comm.allgather(torch.tensor([r, r], dtype=torch.int64))
    assert isinstance(g, torch.Tensor) and g.tolist() == [q for q in range(n) for _ in range(2)]
    a = comm.alltoall(torch.arange(2 * n, dtype=torch.float32) + 10 * r)
    assert a.tolist() == [10 * q + 2 * r + k for q in range(n) for k in range(2)]
    return True


def _bad_input(comm):
    errors = []
    for call in (lambda: comm.allreduce([1, 2, 3]),
                 lambda: comm.allreduce(np.ones(4, np.complex64)),
                 lambda: comm.allreduce(np.ones((4, 4))[:, 0]),
                 lambda: comm.allreduce(np.ones(4, np.int32), "avg"),
                 lambda: comm.allreduce(np.ones(4), "mean"),
                 lambda: comm.reduce_scatter(np.ones(comm.size + 1)),
                 lambda: comm.allreduce(np.ones(4), algo="nope"),
                 lambda: comm.broadcast(np.ones(4), root=comm.size),
                 lambda: comm.allreduce(np.ones(4), out=np.ones(5))):
        try:
            call()
        except Exception as err:
            errors.append(type(err).__name__ + ": " + str(err))
    return errors


@pytest.mark.parametrize("nranks", [2, 3])
def test_in_place_calls(nranks):
    assert all(run_world(_in_place, nranks))


def test_async_handles_complete_in_order():
    assert run_world(_async, 3) == [[3, 3, 3]] * 3


def test_torch_cpu_tensors_zero_copy_including_bfloat16():
    assert all(run_world(_torch_tensors, 2))


def test_bad_input_gets_clear_errors_without_communication():
    errors = run_world(_bad_input, 2)[0]
    assert len(errors) == 9, errors
    expected = ["expected a numpy array", "unsupported dtype", "C-contiguous",
                "needs a floating-point dtype", "unknown reduction op", "equal blocks",
                "no algorithm 'nope'", "root 2 is outside", "output must have shape"]
    for want, got in zip(expected, errors, strict=True):
        assert want in got, (want, got)


def test_in_place_is_the_same_buffer_on_every_rank_or_the_rank_s_block():
    x = np.arange(12, dtype=np.float32)
    for rank in range(3):
        assert in_place(x, x, rank)  # an in-place allreduce, on any rank (was rank 0 only)
        assert not in_place(x, x.copy(), rank)
        assert in_place(x[4 * rank:4 * rank + 4], x, rank)  # allgather's input, its block
        assert in_place(x, x[4 * rank:4 * rank + 4], rank)  # reduce-scatter's output
        assert not in_place(x[4:8], x, rank) or rank == 1
    assert not in_place(x[1:], x[:-1], 0)  # overlapping, not in place: the caller copies
    assert not in_place(x[:0], x[:0], 0)
