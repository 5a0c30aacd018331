"""Training-step time: DDP on gloo, DDP on the commflow backend, and commflow's
PriorityScheduler (on the commflow backend, per-layer SGD in the forward pre-hooks), for a
VGG-style conv net and a small transformer, on ranks of this machine.

    PYTHONPATH=src python benchmarks/sched_live.py [--ranks 2] [--iters 20] [--warmup 5]

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
                              credits=args.credits,
                              optimizer_factory=lambda ps: torch.optim.SGD(ps, lr=LR))

    def scheduled() -> None:
        x, y = data()
        loss_fn(model(x), y).backward()

    runs["PriorityScheduler"] = (scheduled, sched.finish)
    return runs


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
        rows.append((make.__name__, nparams, dict(zip(runs, medians.tolist(), strict=True))))
    if dist.get_rank() == 0:
        names = list(rows[0][2])
        print(f"ranks {dist.get_world_size()}, median of {args.iters} iterations in "
              f"{args.rounds} rounds, slowest rank, ms; scheduler: {args.partition_mb:g} MiB "
              f"partitions, {args.credits} credits")
        print("| model | params | " + " | ".join(names)
              + " | scheduler / DDP gloo | scheduler / DDP commflow |")
        print("|---|---|" + "---|" * (len(names) + 2))
        for model, nparams, med in rows:
            cells = " | ".join(f"{1e3 * med[n]:.1f}" for n in names)
            ratios = " | ".join(f"{med['PriorityScheduler'] / med[n]:.2f}"
                                for n in ("DDP gloo", "DDP commflow"))
            print(f"| {model} | {nparams / 1e6:.2f} M | {cells} | {ratios} |")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20, help="timed iterations per configuration")
    ap.add_argument("--rounds", type=int, default=4, help="blocks the iterations are cut in")
    ap.add_argument("--warmup", type=int, default=5, help="untimed iterations before round 1")
    ap.add_argument("--partition-mb", type=float, default=4.0, help="scheduler partition size")
    ap.add_argument("--credits", type=int, default=2, help="scheduler partitions in flight")
    args = ap.parse_args()
    if "RANK" in os.environ:
        _rank(args)
        return
    status = launch([sys.executable, *sys.argv], args.ranks, prefix_output=False,
                    env={"OMP_NUM_THREADS": "1"})
    sys.exit(status)


if __name__ == "__main__":
    main()
