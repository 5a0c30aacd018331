"""Every collective of the ``commflow`` backend against closed forms, on 2 and 3 ranks.

One world per rank count runs every call once (process start-up dominates the cost); each
test checks one call's results on every rank against values computed here with numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

from .harness import run_group

SIZES = (2, 3)


def rows(src: int, dst: int) -> int:
    """Rows rank ``src`` sends to rank ``dst`` in the uneven all-to-all tests."""
    return src + 2 * dst + 1


def _unsupported(call) -> str:
    try:
        call()
    except NotImplementedError as err:
        return str(err)
    return "no error"


def _every_call() -> dict[str, object]:
    r, n = dist.get_rank(), dist.get_world_size()
    out: dict[str, object] = {"backend": dist.get_backend()}

    t = torch.arange(6, dtype=torch.float32) + r
    dist.all_reduce(t)
    out["all_reduce"] = t.tolist()
    for name, op in [
        ("prod", dist.ReduceOp.PRODUCT),
        ("min", dist.ReduceOp.MIN),
        ("max", dist.ReduceOp.MAX),
        ("avg", dist.ReduceOp.AVG),
    ]:
        t = torch.arange(1, 5, dtype=torch.float64) * (r + 1)
        dist.all_reduce(t, op=op)
        out[f"all_reduce_{name}"] = t.tolist()
    for dtype in (torch.int64, torch.float16, torch.bfloat16):
        t = torch.arange(5).to(dtype) * (r + 1)
        dist.all_reduce(t)
        out[f"all_reduce_{dtype}"] = t.tolist()
    big = torch.full((300_000,), float(r + 1))  # above the small-message threshold: ring
    work = dist.all_reduce(big, async_op=True)
    work.wait()
    out["all_reduce_async"] = (
        work.is_completed(),
        float(big[0]),
        float(big[-1]),
        work.get_future().value()[0] is big,
    )
    tensors = [torch.full((3,), float(r)), torch.full((2,), 2.0 * r)]
    dist.all_reduce_coalesced(tensors)
    out["all_reduce_coalesced"] = [x.tolist() for x in tensors]

    t = torch.full((3,), float(r))
    dist.broadcast(t, src=n - 1)
    out["broadcast"] = t.tolist()
    t = torch.full((2,), r + 1.0)
    dist.reduce(t, dst=1)
    out["reduce"] = t.tolist()

    parts = [torch.empty(2) for _ in range(n)]
    dist.all_gather(parts, torch.full((2,), float(r)))
    out["all_gather"] = [p.tolist() for p in parts]
    whole = torch.empty(n, 2)
    dist.all_gather_single(whole, torch.full((2,), float(r)))
    out["all_gather_single"] = whole.tolist()
    gathered = [torch.empty(2) for _ in range(n)] if r == 0 else None
    dist.gather(torch.full((2,), float(r)), gathered, dst=0)
    out["gather"] = [g.tolist() for g in gathered] if gathered else None
    mine = torch.empty(2)
    dist.scatter(
        mine, [torch.full((2,), 10.0 + j) for j in range(n)] if r == n - 1 else None, src=n - 1
    )
    out["scatter"] = mine.tolist()

    mine = torch.empty(2)
    dist.reduce_scatter(mine, [torch.full((2,), j + 10.0 * r) for j in range(n)])
    out["reduce_scatter"] = mine.tolist()
    mine = torch.empty(2)
    dist.reduce_scatter_single(mine, torch.arange(2.0 * n) * (r + 1))
    out["reduce_scatter_single"] = mine.tolist()

    x = torch.arange(2.0 * n) + 100 * r
    y = torch.empty(2 * n)
    dist.all_to_all_single(y, x)
    out["all_to_all_single"] = y.tolist()
    send = [rows(r, j) for j in range(n)]
    recv = [rows(i, r) for i in range(n)]
    x = torch.cat([torch.full((rows(r, j), 2), 100.0 * r + j) for j in range(n)])
    y = torch.empty(sum(recv), 2)
    dist.all_to_all_single(y, x, output_split_sizes=recv, input_split_sizes=send)
    out["all_to_all_single_uneven"] = y.tolist()
    outs = [torch.empty(rows(i, r), dtype=torch.int64) for i in range(n)]
    dist.all_to_all(outs, [torch.full((rows(r, j),), 100 * r + j) for j in range(n)])
    out["all_to_all"] = [o.tolist() for o in outs]
    dist.barrier()
    objects: list[object] = [None] * n
    dist.all_gather_object(objects, {"rank": r, "text": "a" * (r + 1)})  # uneven pickles
    listed: list[object] = [("from", r)]
    dist.broadcast_object_list(listed, src=n - 1)
    out["objects"] = (objects, listed)

    everyone = dist.new_group()  # a communicator of its own beside the world's, same ranks
    sums = []
    for i in range(10):
        dist.broadcast(torch.full((3,), float(r)), src=n - 1)
        x = torch.full((2,), float(i + r))
        dist.all_reduce(x, group=everyone)
        sums.append(x[0].item())
    out["every_rank_group"] = sums

    sub = dist.new_group([0, n - 1])
    t = torch.full((1,), float(r))
    if r in (0, n - 1):
        dist.all_reduce(t, group=sub)
        dist.broadcast(t2 := torch.full((1,), float(r)), group=sub, group_src=1)
        out["subgroup"] = (t.tolist(), t2.tolist(), dist.get_rank(sub), dist.get_world_size(sub))
    dist.all_reduce(t := torch.ones(1))
    out["after_subgroup"] = t.tolist()

    outs = [[torch.zeros(2), torch.zeros(1)] for _ in range(n)]
    dist.all_gather_coalesced(outs, [torch.full((2,), float(r)), torch.tensor([10.0 * r])])
    out["all_gather_coalesced"] = [[a.tolist(), b.tolist()] for a, b in outs]

    if r == 0:
        got = []
        for _ in range(n - 1):
            t = torch.zeros(1)
            got.append([dist.recv(t), t.item()])
        out["any_source"] = sorted(got)
    else:
        dist.send(torch.full((1,), float(r)), 0)

    out["unsupported"] = [
        _unsupported(lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND)),
    ]
    return out


@pytest.fixture(scope="module", params=SIZES)
def world(request) -> tuple[int, list[dict]]:
    return request.param, run_group(_every_call, request.param)


def test_backend_name(world):
    _, results = world
    assert all(res["backend"] == "commflow" for res in results)


def test_all_reduce(world):
    n, results = world
    base = np.arange(6.0)
    factors = np.arange(1, n + 1)
    x = np.arange(1, 5.0)
    for res in results:
        assert res["all_reduce"] == (n * base + n * (n - 1) / 2).tolist()
        assert res["all_reduce_prod"] == (x**n * np.prod(factors)).tolist()
        assert res["all_reduce_min"] == x.tolist()
        assert res["all_reduce_max"] == (x * n).tolist()
        assert res["all_reduce_avg"] == (x * factors.mean()).tolist()
        for dtype in ("torch.int64", "torch.float16", "torch.bfloat16"):
            assert res[f"all_reduce_{dtype}"] == (np.arange(5) * factors.sum()).tolist()
        assert res["all_reduce_async"] == (True, factors.sum(), factors.sum(), True)
        assert res["all_reduce_coalesced"] == [[n * (n - 1) / 2] * 3, [n * (n - 1.0)] * 2]


def test_broadcast_and_reduce(world):
    n, results = world
    for r, res in enumerate(results):
        assert res["broadcast"] == [n - 1.0] * 3
        if r == 1:
            assert res["reduce"] == [n * (n + 1) / 2] * 2


def test_gathers_and_scatter(world):
    n, results = world
    expected = [[float(j)] * 2 for j in range(n)]
    for r, res in enumerate(results):
        assert res["all_gather"] == expected
        assert res["all_gather_single"] == expected
        assert res["gather"] == (expected if r == 0 else None)
        assert res["scatter"] == [10.0 + r] * 2


def test_reduce_scatter(world):
    n, results = world
    for r, res in enumerate(results):
        assert res["reduce_scatter"] == [n * r + 10.0 * n * (n - 1) / 2] * 2
        assert (
            res["reduce_scatter_single"]
            == (np.arange(2.0 * n)[2 * r : 2 * r + 2] * n * (n + 1) / 2).tolist()
        )


def test_all_to_all_even_and_uneven(world):
    n, results = world
    for r, res in enumerate(results):
        assert res["all_to_all_single"] == [
            v + 100 * j for j in range(n) for v in (2 * r, 2 * r + 1)
        ]
        assert res["all_to_all_single_uneven"] == [
            [100.0 * i + r] * 2 for i in range(n) for _ in range(rows(i, r))
        ]
        assert res["all_to_all"] == [[100 * i + r] * rows(i, r) for i in range(n)]


def test_object_collectives(world):
    n, results = world
    for res in results:
        objects, listed = res["objects"]
        assert objects == [{"rank": j, "text": "a" * (j + 1)} for j in range(n)]
        assert listed == [("from", n - 1)]


def test_group_of_every_rank_interleaves_with_the_world(world):
    n, results = world
    for res in results:
        assert res["every_rank_group"] == [n * i + n * (n - 1) / 2 for i in range(10)]


def test_subgroup_runs_among_its_members_only(world):
    n, results = world
    for r, res in enumerate(results):
        if r in (0, n - 1):
            assert res["subgroup"] == ([n - 1.0], [n - 1.0], 0 if r == 0 else 1, 2)
        else:
            assert "subgroup" not in res
        assert res["after_subgroup"] == [float(n)]


def test_unsupported_calls_name_themselves(world):
    _, results = world
    for res in results:
        (band,) = res["unsupported"]
        assert "all_reduce with ReduceOp.BAND is not supported" in band


def test_all_gather_coalesced_and_receive_from_any_source(world):
    n, results = world
    for res in results:
        assert res["all_gather_coalesced"] == [[[float(q)] * 2, [10.0 * q]] for q in range(n)]
    assert results[0]["any_source"] == [[q, float(q)] for q in range(1, n)]
