"""``all_reduce_coalesced`` on the commflow backend fuses: one runtime allreduce per dtype,
results equal to numpy's closed form (exactly for integers) and to gloo's, on 2 and 3 ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

from .harness import run_group

SHAPES = {
    "f32 a": ((3, 5), torch.float32),
    "i64 a": ((7,), torch.int64),
    "f32 b": ((70_000,), torch.float32),  # above the small-message fast path
    "f64 a": ((4,), torch.float64),
    "i64 b": ((2, 3), torch.int64),
    "f32 c": ((1,), torch.float32),
    "i32 a": ((5,), torch.int32),  # alone in its dtype: reduced in place
}
GROUPS = 4
"""Distinct dtypes in SHAPES: the runtime allreduces one mixed call should make."""


def _data(rank: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(10 + rank)
    out = {}
    for name, (shape, dtype) in SHAPES.items():
        if dtype.is_floating_point:
            out[name] = rng.standard_normal(shape).astype(str(dtype).split(".")[1])
        else:
            out[name] = rng.integers(-1000, 1000, shape).astype(str(dtype).split(".")[1])
    return out


def _tensors() -> list[torch.Tensor]:
    return [torch.from_numpy(a.copy()) for a in _data(dist.get_rank()).values()]


def _coalesced() -> dict[str, object]:
    pg = dist.group.WORLD
    calls: list[tuple[str, int]] = []
    allreduce = pg.comm.allreduce

    def counted(x, op="sum", **kwargs):
        calls.append((str(x.dtype), x.size))
        return allreduce(x, op, **kwargs)

    pg.comm.allreduce = counted
    out: dict[str, object] = {}
    mixed = _tensors()
    with dist._coalescing_manager():  # mixed dtypes reach allreduce_coalesced
        for t in mixed:
            dist.all_reduce(t)
    out["sum"], out["sum calls"] = [t.numpy() for t in mixed], list(calls)
    calls.clear()
    ints = [t for t in _tensors() if not t.is_floating_point()]
    with dist._coalescing_manager():
        for t in ints:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["max"], out["max calls"] = [t.numpy() for t in ints], list(calls)
    calls.clear()
    same = [t for t in _tensors() if t.dtype == torch.float32]
    dist.all_reduce_coalesced(same, async_op=True).wait()
    out["f32"], out["f32 calls"] = [t.numpy() for t in same], list(calls)
    pg.comm.allreduce = allreduce
    gloo = dist.new_group(backend="gloo")
    reference = _tensors()
    for t in reference:
        dist.all_reduce(t, group=gloo)
    out["gloo"] = [t.numpy() for t in reference]
    return out


@pytest.fixture(scope="module", params=[2, 3])
def world(request) -> tuple[int, list[dict]]:
    return request.param, run_group(_coalesced, request.param)


def _closed_form(n: int, reduce) -> list[np.ndarray]:
    per_rank = [list(_data(r).values()) for r in range(n)]
    return [reduce([ranks[i] for ranks in per_rank]) for i in range(len(SHAPES))]


def test_fused_sums_equal_numpy_exactly_for_ints_and_gloo_for_floats(world):
    n, results = world
    exact = _closed_form(n, lambda xs: np.sum(np.stack(xs).astype(np.float64), axis=0))
    for res in results:
        for name, got, want, gloo in zip(SHAPES, res["sum"], exact, res["gloo"], strict=True):
            assert got.dtype == gloo.dtype
            if got.dtype.kind == "i":
                np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=name)
                np.testing.assert_array_equal(got, gloo, err_msg=name)
            else:
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=name)
                np.testing.assert_allclose(got, gloo, rtol=1e-6, atol=1e-6, err_msg=name)


def test_one_runtime_allreduce_per_dtype_with_the_packed_sizes(world):
    n, results = world
    for res in results:
        assert len(res["sum calls"]) == GROUPS
        sizes: dict[str, int] = {}
        for shape, dtype in SHAPES.values():
            key = str(dtype).split(".")[1]
            sizes[key] = sizes.get(key, 0) + int(np.prod(shape))
        assert sorted(res["sum calls"]) == sorted(sizes.items())
        assert res["max calls"] == [("int64", 13), ("int32", 5)]
        assert res["f32 calls"] == [("float32", 15 + 70_000 + 1)]


def test_fused_max_and_same_dtype_call(world):
    n, results = world
    ints = [i for i, (_, dtype) in enumerate(SHAPES.values()) if not dtype.is_floating_point]
    floats = [i for i, (_, dtype) in enumerate(SHAPES.values()) if dtype == torch.float32]
    largest = _closed_form(n, lambda xs: np.max(np.stack(xs), axis=0))
    summed = _closed_form(n, lambda xs: np.sum(np.stack(xs).astype(np.float64), axis=0))
    for res in results:
        for got, i in zip(res["max"], ints, strict=True):
            np.testing.assert_array_equal(got, largest[i])
        for got, i in zip(res["f32"], floats, strict=True):
            np.testing.assert_allclose(got, summed[i], rtol=1e-6, atol=1e-6)
