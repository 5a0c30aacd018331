"""Training-step time: DDP on gloo, DDP on the commflow backend, and commflow's
PriorityScheduler (per-layer SGD in the forward pre-hooks, on the commflow backend or with
``--backend gloo`` on gloo), for a VGG-style conv net and a transformer, on ranks of this
machine, with the simulator's predictions.

    PYTHONPATH=src python benchmarks/sched_live.py [--ranks 2] [--iters 20] [--warmup 5]
    commflow cluster up --hosts 2 --ranks-per-host 1 --bandwidth 1gbit --delay 100us
    PYTHONPATH=src python benchmarks/sched_live.py --hosts h0:1,h1:1 --fuse-mb 1 [--backend gloo]

With ``--hosts`` the ranks run in the emulated cluster's hosts. The scheduler runs with
``background=True`` (a sender thread: backward never stalls for a credit). Every run also
predicts the DDP and scheduler times with :mod:`commflow.sched`: each layer's forward (plus
its SGD step) and backward time measured on rank 0 (module hooks; the other ranks measure at
the same time), scaled to the median "compute only" iteration: a local replica's forward,
backward and SGD step without any communication, timed in the same rotation as the others
(slowest rank). The notes under the table give the prediction again from the "scheduler
compute" column instead: the scheduler's iterations less the time its forward pre-hooks waited
for reductions (``wait_time``); on a machine loaded by other jobs the two differ, a process that
blocks on the network getting more CPU when it wakes than one that never blocks. The allreduce
cost is fitted to allreduces of 256 KiB, 1 MiB and 4 MiB timed after every round (medians,
slowest rank); DDP is simulated as ``ddp`` (25 MiB buckets, the first 1 MiB), the scheduler as
priority with its partitions, credits and fusion (both backends run several allreduces at once
between hosts: gloo in its worker threads, commflow on its communicator's lanes).

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
    """VGG-style: 3x3 conv blocks (32, 64, 128 channels) on 48 32x32 images, then three FC
    layers (2048 -> 1024 -> 1024 -> 10): most compute in the convolutions near the input,
    most gradient bytes in the FC layers near the output (3.45 M parameters)."""
    def block(cin: int, cout: int) -> list[torch.nn.Module]:
        return [torch.nn.Conv2d(cin, cout, 3, padding=1), torch.nn.ReLU(),
                torch.nn.Conv2d(cout, cout, 3, padding=1), torch.nn.ReLU(),
                torch.nn.MaxPool2d(2)]

    model = torch.nn.Sequential(
        *block(3, 32), *block(32, 64), *block(64, 128), torch.nn.Flatten(),
        torch.nn.Linear(128 * 4 * 4, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(), torch.nn.Linear(1024, 10),
    )
    return model, lambda: (torch.randn(48, 3, 32, 32), torch.randint(0, 10, (48,)))


class _Transformer(torch.nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        layer = torch.nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=0.0, batch_first=True)
        self.body = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens))).flatten(0, 1)


def transformer() -> tuple[torch.nn.Module, Callable[[], tuple[torch.Tensor, torch.Tensor]]]:
    """Four encoder layers (d=256, 4 heads), 2,000-token vocabulary, 12 x 32 tokens
    (4.19 M parameters)."""
    return _Transformer(2000, 256, 4), lambda: (torch.randint(0, 2000, (12, 32)),
                                                torch.randint(0, 2000, (12 * 32,)))


def _times(step: Callable[[], float], finish: Callable[[], None], warmup: int,
           iters: int) -> list[tuple[float, float]]:
    """(seconds, seconds waited for communication) of ``iters`` iterations after ``warmup``."""
    for _ in range(warmup):
        step()
    finish()  # the scheduler's thread issues collectives: none may be pending at a barrier
    dist.barrier()
    out = []
    for _ in range(iters):
        start = time.perf_counter()
        waited = step()
        out.append((time.perf_counter() - start, waited))
    return out


def _runs(base: torch.nn.Module, data, gloo, args: argparse.Namespace
          ) -> dict[str, tuple[Callable, Callable]]:
    """Per configuration: (one training iteration, what to call after the timed ones)."""
    loss_fn = torch.nn.CrossEntropyLoss()
    runs = {}
    for name, group in (("DDP gloo", gloo), ("DDP commflow", None)):
        ddp = DistributedDataParallel(copy.deepcopy(base), process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=LR)

        def step(ddp=ddp, opt=opt) -> float:
            x, y = data()
            opt.zero_grad()
            loss_fn(ddp(x), y).backward()
            opt.step()
            return 0.0

        runs[name] = (step, lambda: None)
    model = copy.deepcopy(base)
    sched = PriorityScheduler(model, gloo if args.backend == "gloo" else None,
                              partition_bytes=int(args.partition_mb * 2**20),
                              credits=args.credits, fuse_bytes=int(args.fuse_mb * 2**20),
                              background=True,
                              optimizer_factory=lambda ps: torch.optim.SGD(ps, lr=LR))

    def scheduled() -> float:
        before = sched.wait_time
        x, y = data()
        loss_fn(model(x), y).backward()
        return sched.wait_time - before

    runs["PriorityScheduler"] = (scheduled, sched.finish)
    local = copy.deepcopy(base)
    local_opt = torch.optim.SGD(local.parameters(), lr=LR)

    def compute() -> float:
        x, y = data()
        local_opt.zero_grad()
        loss_fn(local(x), y).backward()
        local_opt.step()
        return 0.0

    runs["compute only"] = (compute, lambda: None)
    return runs


def _layer_times(model: torch.nn.Module, data, reps: int = 5) -> list[tuple[float, float, int]]:
    """(forward s, backward s, gradient bytes) of each module that owns parameters, in
    module order, medians over ``reps`` single-process iterations. Forward and backward are
    scaled so that they add up to the whole forward and backward (the modules without
    parameters and the loss shared out in proportion), 0 s for a module its parent uses
    without calling its forward; the forward then gets the module's SGD step added (both
    DDP and the scheduler step a layer before its next forward)."""
    owners = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    marks: dict[str, list[tuple[int, float]]] = {"fwd": [], "bwd": []}
    handles = []
    for i, m in enumerate(owners):
        handles.append(m.register_forward_pre_hook(
            lambda mod, inp, i=i: marks["fwd"].append((i, time.perf_counter()))))
        handles.append(m.register_forward_hook(
            lambda mod, inp, out, i=i: marks["fwd"].append((-1 - i, time.perf_counter()))))
        handles.append(m.register_full_backward_pre_hook(
            lambda mod, g, i=i: marks["bwd"].append((i, time.perf_counter()))))
        handles.append(m.register_full_backward_hook(
            lambda mod, gi, go, i=i: marks["bwd"].append((-1 - i, time.perf_counter()))))
    optimizers = [torch.optim.SGD(m.parameters(recurse=False), lr=LR) for m in owners]
    samples: list[list[tuple[float, float]]] = [[] for _ in owners]
    steps: list[list[float]] = [[] for _ in owners]
    for _ in range(reps):
        marks["fwd"].clear()
        marks["bwd"].clear()
        model.zero_grad()
        x, y = data()
        _loss(model, x, y).backward()
        for i, opt in enumerate(optimizers):
            start = time.perf_counter()
            opt.step()
            steps[i].append(time.perf_counter() - start)
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
    totals = []  # the hooks slow autograd down: the whole step is timed without them
    for _ in range(reps):
        model.zero_grad()
        x, y = data()
        start = time.perf_counter()
        _loss(model, x, y).backward()
        totals.append(time.perf_counter() - start)
    model.zero_grad()
    measured = sum(statistics.median(f + b for f, b in pairs) for pairs in samples if pairs)
    scale = statistics.median(totals) / measured  # activations, loss: shared out by time
    out = []
    for m, pairs, step in zip(owners, samples, steps, strict=True):
        grad = sum(p.numel() * p.element_size() for p in m.parameters(recurse=False))
        forward = backward = 0.0
        if pairs:  # else used by its parent without its own forward (attention's out_proj)
            forward = scale * statistics.median(f for f, _ in pairs)
            backward = scale * statistics.median(b for _, b in pairs)
        out.append((forward + statistics.median(step), backward, grad))
    return out


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.CrossEntropyLoss()(model(x), y)


SIZES = (256 << 10, 1 << 20, 4 << 20)
"""Bytes of the allreduces timed to fit the cost model."""


def _allreduce_times(group, reps: int = 3) -> list[list[float]]:
    """Seconds of ``reps`` blocking allreduces (float32) of each of :data:`SIZES` on
    ``group``."""
    out = []
    for size in SIZES:
        t = torch.ones(size // 4)
        times = []
        for _ in range(reps):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t, group=group)
            times.append(time.perf_counter() - start)
        out.append(times)
    return out


def _predict(profile: list[tuple[float, float, int]], compute: float, points: dict[float, float],
             args: argparse.Namespace) -> dict[str, object]:
    """Simulated iteration times of DDP and of the scheduler (see the module docstring): the
    per-layer ``profile`` scaled to ``compute`` seconds per iteration, the allreduce cost fitted
    to ``points`` (bytes: seconds)."""
    from commflow.sched import Layer, Policy, Workload, fitted_cost, simulate

    cost = fitted_cost(points, name="measured allreduce")
    scale = compute / sum(f + b for f, b, _ in profile)
    work = Workload("model", tuple(Layer(f"L{i}", scale * f, scale * b, g)
                                   for i, (f, b, g) in enumerate(profile)))
    sched = Policy("scheduler", order="priority", partition_bytes=args.partition_mb * (1 << 20),
                   credits=args.credits, bucket_bytes=args.fuse_mb * (1 << 20))
    note = (f"{work.describe()} (with the SGD step); allreduce {1e3 * cost.alpha:.2f} ms + "
            f"bytes at {cost.bandwidth / 1e6:.0f} MB/s (all gradients: "
            f"{1e3 * cost.time('allreduce', work.grad_bytes):.1f} ms)")
    return {"DDP": simulate(work, "ddp", cost).iteration_time,
            "scheduler": simulate(work, sched, cost).iteration_time, "note": note}


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
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
        names = list(runs)
        profile = _layer_times(copy.deepcopy(base), data)
        allreduces: list[list[float]] = [[] for _ in SIZES]
        for name in names:
            _times(*runs[name], args.warmup, 0)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                step, finish = runs[name]
                times[name] += _times(step, finish, 1, args.iters // args.rounds)
                finish()
            for kept, new in zip(allreduces, _allreduce_times(
                    gloo if args.backend == "gloo" else None), strict=True):
                kept += new
        # the scheduler's compute: its iterations less what its pre-hooks waited
        busy = [t - w for t, w in times["PriorityScheduler"]]
        medians = torch.tensor([statistics.median(t for t, _ in ts) for ts in times.values()]
                               + [statistics.median(busy)]
                               + [statistics.median(t) for t in allreduces], dtype=torch.float64)
        dist.all_reduce(medians, op=dist.ReduceOp.MAX)
        measured = dict(zip([*runs, "scheduler compute"], medians.tolist(), strict=False))
        points = dict(zip(map(float, SIZES), medians.tolist()[len(runs) + 1:], strict=True))
        predicted = _predict(profile, measured["compute only"], points, args)
        busy_based = _predict(profile, measured["scheduler compute"], points, args)
        predicted["note"] += (f"; from the scheduler's compute instead: DDP "
                              f"{1e3 * busy_based['DDP']:.1f} ms, scheduler "
                              f"{1e3 * busy_based['scheduler']:.1f} ms")
        rows.append((make.__name__, nparams, measured, predicted))
    if dist.get_rank() == 0:
        names = list(rows[0][2])
        print(f"ranks {dist.get_world_size()}, median of {args.iters} iterations in "
              f"{args.rounds} rounds, slowest rank, ms; scheduler: {args.partition_mb:g} MiB "
              f"partitions, {args.credits} credits, layers fused up to {args.fuse_mb:g} MiB, "
              f"on {args.backend}; predicted: commflow.sched, DDP and scheduler on "
              f"{args.backend}")
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
        for model, _, _, pred in rows:
            print(f"- {model}: {pred['note'].removeprefix('model: ')}")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20, help="timed iterations per configuration")
    ap.add_argument("--rounds", type=int, default=4, help="blocks the iterations are cut in")
    ap.add_argument("--warmup", type=int, default=5, help="untimed iterations before round 1")
    ap.add_argument("--partition-mb", type=float, default=2.0, help="scheduler partition size")
    ap.add_argument("--credits", type=int, default=2, help="scheduler partitions in flight")
    ap.add_argument("--fuse-mb", type=float, default=0.0,
                    help="scheduler: join consecutive layers up to this many MiB")
    ap.add_argument("--backend", choices=("commflow", "gloo"), default="commflow",
                    help="the scheduler's process group (and the allreduces timed for the "
                    "prediction)")
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
