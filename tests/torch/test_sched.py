"""PriorityScheduler trains like DDP (same seeds, parameters equal within float32
reduction-order tolerance after five steps, on 2 and 4 ranks of the commflow backend), keeps
its partitions and credits, launches in priority (layer) order, and refuses bad arguments."""

from __future__ import annotations

import threading
import time
from functools import partial

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from commflow.errors import CommflowError
from commflow.torch._sender import Sender
from commflow.torch.sched import PriorityScheduler

from .harness import run_group

STEPS = 5
PARTITION = 512
CREDITS = 2


class _Attention(torch.nn.Module):
    """Embedding, multi-head attention (whose ``out_proj`` is used functionally), head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(6, 16)
        self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        return self.head(self.attn(h, h, h, need_weights=False)[0]).mean(dim=1)


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32),
                               torch.nn.Tanh(), torch.nn.Linear(32, 4))


def _conv() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1),
        torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 5),
    )


class _Mixed(torch.nn.Module):
    """One layer with a float32 weight and a float64 bias: two gradient buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(6, 3))
        self.bias = torch.nn.Parameter(torch.randn(3, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.weight + self.bias.float())


class _Tied(torch.nn.Module):
    """The output layer shares the input layer's weight: a parameter two layers use."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(6, 6, bias=False)
        self.mid = torch.nn.Linear(6, 6)
        self.out = torch.nn.Linear(6, 6)
        self.out.weight = self.inp.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.mid(self.inp(x))))


MODELS = {  # name: (model, input shape, output width)
    "mlp": (_mlp, (8, 16), 4),
    "conv": (_conv, (4, 3, 6, 6), 5),
    "attention": (_Attention, (4, 5, 6), 3),
    "mixed dtypes": (_Mixed, (8, 6), 3),
    "tied weights": (_Tied, (8, 6), 6),
}
MODES = ("per-layer optimizer", "finish then step", "on a gloo group", "fused", "background")


def _batches(name: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    _, shape, width = MODELS[name]
    data = torch.Generator().manual_seed(100 + dist.get_rank())
    return [(torch.randn(shape, generator=data), torch.randn(shape[0], width, generator=data))
            for _ in range(STEPS)]


def _seeded(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return MODELS[name][0]()


def _sgd(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def _params(model: torch.nn.Module) -> list[np.ndarray]:
    return [p.detach().numpy().copy() for p in model.parameters()]


def _ddp(name: str, group) -> list[np.ndarray]:
    model = _seeded(name)
    ddp = DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.002)
    opt = _sgd(ddp.parameters())
    for x, y in _batches(name):
        opt.zero_grad()
        (ddp(x) - y).pow(2).mean().backward()
        opt.step()
    return _params(model)


def _outstanding(pg) -> list[int]:
    """Count, at each async allreduce the backend ``pg`` receives, how many of its async
    allreduces are then incomplete, the new one included (independent of the scheduler's own
    bookkeeping); the loop's blocking loss all-reduce is not the scheduler's and is skipped."""
    counts: list[int] = []
    works: list = []
    allreduce = pg.allreduce

    def counting(tensors, opts=None):
        work = allreduce(tensors, opts)
        if opts is not None and opts.asyncOp:
            works.append(work)
            counts.append(sum(not w.is_completed() for w in works))
        return work

    pg.allreduce = counting
    return counts


def _scheduled(name: str, per_layer: bool, group=None, fuse_bytes: int = 0,
               background: bool = False) -> dict[str, object]:
    """Parameters after STEPS, the launches, the layers' names in priority order, and the
    incomplete allreduces at each launch (on the commflow default group)."""
    model = _seeded(name)
    factory = _sgd if per_layer else None
    sched = PriorityScheduler(model, group, partition_bytes=PARTITION, credits=CREDITS,
                              optimizer_factory=factory, fuse_bytes=fuse_bytes,
                              background=background, trace=True)
    pg = dist.group.WORLD
    outstanding = _outstanding(pg) if group is None else None
    opt = None if per_layer else _sgd(model.parameters())
    waited = [sched.wait_time]
    start = time.perf_counter()
    for x, y in _batches(name):
        if opt is not None:
            opt.zero_grad(set_to_none=False)  # backward accumulates into the reduced buffers
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        if not background:
            # the loop's own collectives interleave with the scheduler's in the same order on
            # every rank: the scheduler issues allreduces only at hooks, never as others
            # complete (in the background, its thread issues them at times the loop cannot see)
            dist.all_reduce(loss.detach())
        if opt is not None:
            sched.finish()
            opt.step()
    sched.close()
    waited += [sched.wait_time, time.perf_counter() - start]
    if outstanding is not None:
        del pg.allreduce
    return {"params": _params(model), "trace": sched.trace, "outstanding": outstanding,
            "waited": waited,
            "layers": [layer for layer, _ in sched.layers]}


def _order(background: bool = False) -> dict[str, object]:
    """The launches of one step on three equal layers cut in four partitions, one credit;
    then, after ``close()``, a backward that launches nothing and leaves local gradients."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(8, 8) for _ in range(3)))
    sched = PriorityScheduler(model, partition_bytes=72, credits=1, trace=True,
                              background=background,
                              optimizer_factory=partial(torch.optim.SGD, lr=0.1))
    x = torch.ones(2, 8)
    model(x).sum().backward()
    model(x)
    sched.finish()
    launches = list(sched.trace)
    sched.close()
    model(x * (dist.get_rank() + 1)).sum().backward()
    return {"launches": launches, "after close": len(sched.trace) - len(launches),
            "first weight grad": model[0].weight.grad.numpy().copy()}


class _HalfUsed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = torch.nn.Parameter(torch.ones(2))
        self.unused = torch.nn.Parameter(torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.used


def _error(call) -> str:
    try:
        call()
    except CommflowError as err:
        return str(err)
    return "no error"


def _misuse() -> list[str]:
    """The errors of a layer missing a gradient and of a second backward."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), _HalfUsed())
    sched = PriorityScheduler(model)
    model(torch.ones(1, 2)).sum().backward()
    partial_grads = _error(sched.finish)
    model = torch.nn.Linear(2, 2)
    PriorityScheduler(model, optimizer_factory=partial(torch.optim.SGD, lr=0.1))
    loss = model(torch.ones(1, 2)).sum()
    loss.backward(retain_graph=True)
    return [partial_grads, _error(loss.backward)]


def _sender_failure() -> tuple[str, bool, str]:
    """A background job that fails: the waiter's error, whether the waited event was set so
    that nothing blocks, and the error of a later post."""
    done = threading.Event()
    sender = Sender(lambda: [done])

    def fail(_arg: object) -> None:
        raise RuntimeError("allreduce with peer 1 timed out")

    sender.post(fail, None)
    waited = _error(lambda: sender.wait(done))
    return waited, done.is_set(), _error(lambda: sender.post(fail, None))


def _everything() -> dict[str, object]:
    gloo = dist.new_group(backend="gloo")
    out: dict[str, object] = {"order": _order(), "background order": _order(True),
                              "misuse": _misuse(), "sender failure": _sender_failure()}
    for name in MODELS:
        out[name] = {"ddp": _ddp(name, gloo), "per-layer optimizer": _scheduled(name, True),
                     "finish then step": _scheduled(name, False),
                     "on a gloo group": _scheduled(name, True, gloo),
                     "fused": _scheduled(name, True, fuse_bytes=1 << 20),
                     "background": _scheduled(name, True, background=True)}
    return out


@pytest.fixture(scope="module", params=[2, 4])
def results(request) -> list[dict]:
    return run_group(_everything, request.param, timeout=60)


@pytest.mark.parametrize("mode", MODES)
def test_parameters_equal_ddp_on_gloo_after_five_steps(results, mode):
    start = {name: _params(_seeded(name)) for name in MODELS}
    for res in results:
        for name in MODELS:
            reference = res[name]["ddp"]
            params = res[name][mode]["params"]
            assert any(np.abs(p - q).max() > 1e-3 for p, q in zip(reference, start[name],
                                                                   strict=True))
            for p, q in zip(params, reference, strict=True):
                np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-6, err_msg=name)
    for name in MODELS:  # the replicas stay identical
        for res in results[1:]:
            for p, q in zip(res[name][mode]["params"], results[0][name][mode]["params"],
                            strict=True):
                np.testing.assert_array_equal(p, q)


def test_partitions_and_credits_are_kept(results):
    for res in results:
        for name in MODELS:
            nbytes = sum(p.numel() * p.element_size() for p in _seeded(name).parameters())
            for mode in MODES:
                trace = res[name][mode]["trace"]
                assert sum(launch.nbytes for launch in trace) == nbytes * STEPS
                assert max(launch.nbytes for launch in trace) <= PARTITION
                assert min(launch.in_flight for launch in trace) >= 1
                most = max(launch.in_flight for launch in trace)
                assert most == CREDITS or (mode == "fused" and most <= CREDITS)
                outstanding = res[name][mode]["outstanding"]
                if mode != "on a gloo group":
                    assert len(outstanding) == len(trace)
                    assert max(outstanding) <= CREDITS
        trace = res["conv"]["per-layer optimizer"]["trace"]
        assert max(launch.nbytes for launch in trace) == PARTITION
        parts = [(launch.layer, launch.part, launch.nbytes)
                 for launch in res["mixed dtypes"]["per-layer optimizer"]["trace"][:2]]
        assert parts == [(0, 0, 72), (0, 1, 24)]  # the float32 buffer, then the float64 one


def test_wait_time_counts_the_waits_within_the_loop(results):
    # 0 before the first step; then the reductions' waits in pre-hooks and finish(), some
    # time (each layer's reduction is waited for) but less than the whole loop
    for res in results:
        for name in MODELS:
            for mode in MODES:
                before, after, wall = res[name][mode]["waited"]
                assert before == 0.0
                assert 0.0 < after < wall


def test_fusion_joins_consecutive_small_layers_into_one_reduction(results):
    # every model here is far under 1 MiB: one layer, one reduction group, whatever it has
    for res in results:
        for name in MODELS:
            layers = res[name]["fused"]["layers"]
            unfused = res[name]["per-layer optimizer"]["layers"]
            assert layers == ["+".join(unfused)]
            assert {launch.layer for launch in res[name]["fused"]["trace"]} == {0}


def test_layers_follow_forward_order_and_fold_functional_modules(results):
    layers = results[0]["attention"]["per-layer optimizer"]["layers"]
    assert layers == ["embed", "attn", "head"]  # attn.out_proj is used by attn's forward
    layers = results[0]["conv"]["per-layer optimizer"]["layers"]
    assert layers == ["0", "2", "5"]
    layers = results[0]["tied weights"]["per-layer optimizer"]["layers"]
    assert layers == ["inp", "mid", "out"]  # the shared weight belongs to inp, updated first


def test_launches_follow_layer_priority_when_several_are_ready(results):
    # Backward: layer 2's gradients come first; each later layer-ready event frees one credit
    # (one wait), so layer 1 and then layer 0 overtake the rest of layer 2. Next forward: each
    # layer takes its own partitions first, then refills the credit with the next layer's.
    expected = [("backward", 2, 0), ("backward", 2, 1), ("backward", 1, 0), ("backward", 0, 0),
                *(("forward", 0, k) for k in (1, 2, 3)), *(("forward", 1, k) for k in (1, 2, 3)),
                ("forward", 2, 2), ("forward", 2, 3)]
    for res in results:
        trace = res["order"]["launches"]
        assert [(launch.phase, launch.layer, launch.part) for launch in trace] == expected
        assert {(launch.nbytes, launch.in_flight) for launch in trace} == {(72, 1)}


def test_background_thread_launches_in_the_same_order(results):
    # the sender thread follows the same events; from the first forward pre-hook on it drains
    # the whole queue by priority, which is the order the pre-hooks ask for
    for res in results:
        trace = res["background order"]["launches"]
        hooks = res["order"]["launches"]
        assert [(launch.phase, launch.layer, launch.part) for launch in trace] == [
            (launch.phase, launch.layer, launch.part) for launch in hooks]
        assert res["background order"]["after close"] == 0


def test_close_removes_the_hooks(results):
    for res in results:
        assert res["order"]["after close"] == 0
    # the model is linear and rank r's input is (r + 1) x: local gradients scale with r + 1
    grads = [res["order"]["first weight grad"] for res in results]
    assert np.abs(grads[0]).min() > 0
    for rank, grad in enumerate(grads):
        np.testing.assert_allclose(grad, (rank + 1) * grads[0], rtol=1e-6)


def test_bad_arguments_raise_value_error():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="partition_bytes must be a positive number of bytes, "
                       "got 0"):
        PriorityScheduler(model, partition_bytes=0)
    with pytest.raises(ValueError, match="partition_bytes must be a positive"):
        PriorityScheduler(model, partition_bytes=-4)
    with pytest.raises(ValueError, match=r"smaller than one parameter element \(4 bytes\)"):
        PriorityScheduler(model, partition_bytes=2)
    with pytest.raises(ValueError, match=r"credits \(partitions in flight\) must be at least 1, "
                       "got 0"):
        PriorityScheduler(model, credits=0)
    with pytest.raises(ValueError, match="credits"):
        PriorityScheduler(model, credits=1.5)
    with pytest.raises(ValueError, match="fuse_bytes must be a number of bytes >= 0"):
        PriorityScheduler(model, fuse_bytes=-1)
    with pytest.raises(CommflowError, match="call dist.init_process_group"):
        PriorityScheduler(model)


def test_misuse_raises_commflow_error_naming_the_layer(results):
    for rank, res in enumerate(results):
        partial_grads, second = res["misuse"]
        assert partial_grads.startswith(
            f"PriorityScheduler: layer '1' on rank {rank} got no gradient for 1.unused in the "
            f"last backward"
        )
        assert second.startswith(
            f"PriorityScheduler: a parameter of layer 'Linear' on rank {rank} got a second "
            f"gradient before the layer's reduction was applied"
        )


def test_a_failed_background_reduction_raises_in_the_training_thread(results):
    for rank, res in enumerate(results):
        waited, released, posted = res["sender failure"]
        expected = (f"PriorityScheduler on rank {rank}: a background reduction failed: "
                    f"allreduce with peer 1 timed out; the gradients of this step are lost")
        assert waited.startswith(expected)
        assert released
        assert posted.startswith(expected)
