"""Training-step time: DDP on gloo, DDP on the commflow backend, and commflow's
PriorityScheduler (on the commflow backend, per-layer SGD in the forward pre-hooks), for a
VGG-style conv net and a small transformer, on ranks of this machine.

    PYTHONPATH=src python benchmarks/sched_live.py [--ranks 2] [--iters 20] [--warmup 5]
    commflow cluster up --hosts 2 --ranks-per-host 1 --bandwidth 1gbit --delay 100us
    PYTHONPATH=src python benchmarks/sched_live.py --hosts h0:1,h1:1

With ``--hosts`` the ranks run in the emulated cluster's hosts. Every run also predicts the
DDP and scheduler times with :mod:`commflow.sched`: each layer's forward and backward time
measured on rank 0 (module hooks), the allreduce cost fitted to allreduces timed on the
same ranks (256 KiB and 4 MiB), DDP as ``ddp`` (25 MiB buckets) and the scheduler as
priority with its partitions and credits.

Each configuration trains its own replica (an iteration: forward, backward, and for DDP the
optimizer step; the scheduler's steps happen in the next forward): ``--warmup`` iterations,
then ``--iters`` timed ones in ``--rounds`` blocks, the configurations taking turns in rotating
order (each block after one untimed iteration; the scheduler finishes after each block), so
that a change of load on a shared machine hits all of them. Reported: the slowest rank's median
iteration time.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import commflow.torch  # noqa: F401  (registers the backend)
from commflow.runtime.launcher import launch
from commflow.torch import PriorityScheduler

LR = 0.01


def vgg() -> tuple[torch.nn.Module, Callable[[], tuple[torch.Tensor, torch.Tensor]]]:
    """VGG-style: 3x3 conv blocks (32, 64, 128 channels) on 32x32 images, two FC layers."""
    def block(cin: int, cout: int, convs: int) -> list[torch.nn.Module]:
        layers: list[torch.nn.Module] = []
        for i in range(convs):
            layers += [torch.nn.Conv2d(cin if i == 0 else cout, cout, 3, padding=1),
                       torch.nn.ReLU()]
        return [*layers, torch.nn.MaxPool2d(2)]

    model = torch.nn.Sequential(
        *block(3, 32, 2), *block(32, 64, 2), *block(64, 128, 2), torch.nn.Flatten(),
        torch.nn.Linear(128 * 4 * 4, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10),
    )
    return model, lambda: (torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,)))


class _Transformer(torch.nn.Module):
    def __init__(self, vocab: int = 2000, dim: int = 128, layers: int = 2) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        layer = torch.nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=0.0, batch_first=True)
        self.body = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens))).flatten(0, 1)


def transformer() -> tuple[torch.nn.Module, Callable[[], tuple[torch.Tensor, torch.Tensor]]]:
    """Two encoder layers (d=128, 4 heads), 2,000-token vocabulary, 4 x 32 tokens."""
    return _Transformer(), lambda: (torch.randint(0, 2000, (4, 32)),
                                    torch.randint(0, 2000, (4 * 32,)))


def _times(step: Callable[[], None], warmup: int, iters: int) -> list[float]:
    for _ in range(warmup):
        step()
    dist.barrier()
    stamps = [time.perf_counter()]
    for _ in range(iters):
        step()
        stamps.append(time.perf_counter())
    return [b - a for a, b in zip(stamps, stamps[1:], strict=False)]


def _runs(base: torch.nn.Module, data, gloo, args: argparse.Namespace
          ) -> dict[str, tuple[Callable, Callable]]:
    """Per configuration: (one training iteration, what to call after the timed ones)."""
    loss_fn = torch.nn.CrossEntropyLoss()
    runs = {}
    for name, group in (("DDP gloo", gloo), ("DDP commflow", None)):
        ddp = DistributedDataParallel(copy.deepcopy(base), process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=LR)

        def step(ddp=ddp, opt=opt) -> None:
            x, y = data()
            opt.zero_grad()
            loss_fn(ddp(x), y).backward()
            opt.step()

        runs[name] = (step, lambda: None)
    model = copy.deepcopy(base)
    sched = PriorityScheduler(model, partition_bytes=int(args.partition_mb * 2**20),
                              credits=args.credits, fuse_bytes=int(args.fuse_mb * 2**20),
                              optimizer_factory=lambda ps: torch.optim.SGD(ps, lr=LR))

    def scheduled() -> None:
        x, y = data()
        loss_fn(model(x), y).backward()

    runs["PriorityScheduler"] = (scheduled, sched.finish)
    return runs


def _layer_times(model: torch.nn.Module, data, reps: int = 5) -> list[tuple[float, float, int]]:
    """(forward s, backward s, gradient bytes) of each leaf module with parameters, in
    forward order, medians over ``reps`` single-process iterations, scaled so that they add
    up to the whole forward and backward (the modules without parameters and the loss shared
    out in proportion); 0 s for a module its parent uses without calling its forward."""
    leaves = [m for m in model.modules() if not list(m.children()) and
              any(True for _ in m.parameters(recurse=False))]
    marks: dict[str, list[tuple[int, float]]] = {"fwd": [], "bwd": []}
    handles = []
    for i, m in enumerate(leaves):
        handles.append(m.register_forward_pre_hook(
            lambda mod, inp, i=i: marks["fwd"].append((i, time.perf_counter()))))
        handles.append(m.register_forward_hook(
            lambda mod, inp, out, i=i: marks["fwd"].append((-1 - i, time.perf_counter()))))
        handles.append(m.register_full_backward_pre_hook(
            lambda mod, g, i=i: marks["bwd"].append((i, time.perf_counter()))))
        handles.append(m.register_full_backward_hook(
            lambda mod, gi, go, i=i: marks["bwd"].append((-1 - i, time.perf_counter()))))
    samples: list[list[tuple[float, float]]] = [[] for _ in leaves]
    totals = []
    for _ in range(reps):
        marks["fwd"].clear()
        marks["bwd"].clear()
        x, y = data()
        start = time.perf_counter()
        _loss(model, x, y).backward()
        totals.append(time.perf_counter() - start)
        for k, phase in enumerate(("fwd", "bwd")):
            start = {i: t for i, t in marks[phase] if i >= 0}
            for i, t in marks[phase]:
                if i < 0 and -1 - i in start:
                    value = t - start[-1 - i]
                    pair = samples[-1 - i]
                    if k == 0:
                        pair.append((value, 0.0))
                    else:
                        pair[-1] = (pair[-1][0], value)
    for h in handles:
        h.remove()
    model.zero_grad()
    measured = sum(statistics.median(f + b for f, b in pairs) for pairs in samples if pairs)
    scale = statistics.median(totals) / measured  # activations, loss: shared out by time
    out = []
    for m, pairs in zip(leaves, samples, strict=True):
        grad = sum(p.numel() * p.element_size() for p in m.parameters(recurse=False))
        if not pairs:  # used by its parent without its own forward (attention's out_proj)
            out.append((0.0, 0.0, grad))
            continue
        out.append((scale * statistics.median(f for f, _ in pairs),
                    scale * statistics.median(b for _, b in pairs), grad))
    return out


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.CrossEntropyLoss()(model(x), y)


def _allreduce_cost():
    """The commflow group's allreduce, ``alpha + bytes / bandwidth``, fitted to medians of
    timed calls at 256 KiB and 4 MiB (float32), slowest rank."""
    from commflow.sched import fitted_cost

    points = {}
    for size in (256 << 10, 4 << 20):
        t = torch.ones(size // 4)
        times = []
        for _ in range(10):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - start)
        slowest = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        points[float(size)] = float(slowest[0])
    return fitted_cost(points, name="measured allreduce")


def _predict(model: torch.nn.Module, data, cost, args: argparse.Namespace) -> dict[str, float]:
    """Simulated iteration times of DDP and of the scheduler (see the module docstring)."""
    from commflow.sched import Layer, Policy, Workload, simulate

    measured = _layer_times(copy.deepcopy(model), data)
    work = Workload("model", tuple(Layer(f"L{i}", f, b, g)
                                   for i, (f, b, g) in enumerate(measured)))
    sched = Policy("scheduler", order="priority", partition_bytes=args.partition_mb * (1 << 20),
                   credits=args.credits, bucket_bytes=args.fuse_mb * (1 << 20))
    return {"DDP": simulate(work, "ddp", cost).iteration_time,
            "scheduler": simulate(work, sched, cost).iteration_time}


def _rank(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("commflow")
    gloo = dist.new_group(backend="gloo")
    rows = []
    for make in (vgg, transformer):
        torch.manual_seed(0)
        base, data = make()
        nparams = sum(p.numel() for p in base.parameters())
        runs = _runs(base, data, gloo, args)
        times: dict[str, list[float]] = {name: [] for name in runs}
        names = list(runs)
        for name in names:
            _times(runs[name][0], args.warmup, 0)
            runs[name][1]()
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                step, finish = runs[name]
                times[name] += _times(step, 1, args.iters // args.rounds)
                finish()
        medians = torch.tensor([statistics.median(t) for t in times.values()],
                               dtype=torch.float64)
        dist.all_reduce(medians, op=dist.ReduceOp.MAX)
        predicted = _predict(base, data, _allreduce_cost(), args)
        rows.append((make.__name__, nparams, dict(zip(runs, medians.tolist(), strict=True)),
                     predicted))
    if dist.get_rank() == 0:
        names = list(rows[0][2])
        print(f"ranks {dist.get_world_size()}, median of {args.iters} iterations in "
              f"{args.rounds} rounds, slowest rank, ms; scheduler: {args.partition_mb:g} MiB "
              f"partitions, {args.credits} credits, layers fused up to {args.fuse_mb:g} MiB; "
              f"predicted: commflow.sched")
        print("| model | params | " + " | ".join(names)
              + " | scheduler / DDP gloo | scheduler / DDP commflow | predicted DDP | "
              "predicted scheduler | predicted scheduler / DDP |")
        print("|---|---|" + "---|" * (len(names) + 5))
        for model, nparams, med, pred in rows:
            cells = " | ".join(f"{1e3 * med[n]:.1f}" for n in names)
            ratios = " | ".join(f"{med['PriorityScheduler'] / med[n]:.2f}"
                                for n in ("DDP gloo", "DDP commflow"))
            print(f"| {model} | {nparams / 1e6:.2f} M | {cells} | {ratios} | "
                  f"{1e3 * pred['DDP']:.1f} | {1e3 * pred['scheduler']:.1f} | "
                  f"{pred['scheduler'] / pred['DDP']:.2f} |")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20, help="timed iterations per configuration")
    ap.add_argument("--rounds", type=int, default=4, help="blocks the iterations are cut in")
    ap.add_argument("--warmup", type=int, default=5, help="untimed iterations before round 1")
    ap.add_argument("--partition-mb", type=float, default=4.0, help="scheduler partition size")
    ap.add_argument("--credits", type=int, default=2, help="scheduler partitions in flight")
    ap.add_argument("--fuse-mb", type=float, default=0.0,
                    help="scheduler: join consecutive layers up to this many MiB")
    ap.add_argument("--hosts", default=None, help="run in emulated hosts, e.g. h0:1,h1:1")
    args = ap.parse_args()
    if "RANK" in os.environ:
        _rank(args)
        return
    nranks = args.ranks
    if args.hosts:
        nranks = sum(int(h.split(":")[1]) for h in args.hosts.split(","))
    env = {"OMP_NUM_THREADS": "1"}
    if args.hosts:  # torch's gloo would resolve the host name to loopback in a namespace
        env["GLOO_SOCKET_IFNAME"] = "eth0"
    status = launch([sys.executable, *sys.argv], nranks, hosts=args.hosts,
                    prefix_output=False, env=env)
    sys.exit(status)


if __name__ == "__main__":
    main()
