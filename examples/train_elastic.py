"""Data-parallel training that survives a killed rank, with no checkpoint on disk.

    commflow run -n 4 --keep-going examples/train_elastic.py --kill-rank 2 --kill-step 6

Every rank holds a full replica of a small torch MLP and its optimizer (SGD with momentum),
learns a synthetic regression from its own batches, and averages the gradients with
``comm.allreduce``, so the replicas stay identical. ``--kill-rank R --kill-step S`` makes rank R
kill itself (SIGKILL) at step S, after its backward pass, while the others wait in the
allreduce. Then every survivor:

1. gets ``CommAbortedError`` from the allreduce;
2. calls ``comm.shrink()``: a communicator of the survivors, ranked densely in the old order;
3. agrees on the last step every survivor applied (an allreduce of the step counts, ``min``): a
   rank whose allreduce had completed before the death already applied the interrupted step,
   and goes back to the state it kept in memory from before that step (one snapshot per rank);
4. takes the new rank 0's replica (parameters and momentum, one broadcast): a peer's copy, as a
   replacement rank would need;
5. goes on, averaging over the survivors.

Rank 0 prints the loss and the recovery (time from the error to the first step on the
survivors); every rank prints the SHA-256 of its final parameters.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import time

import numpy as np
import torch
from torch import nn

import commflow
from commflow.runtime import CommAbortedError


def batch(rank: int, step: int, size: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch of step ``step``: inputs and targets of a fixed linear map with
    noise (the same map on every rank)."""
    truth = torch.Generator().manual_seed(7)
    w = torch.randn(dim, 1, generator=truth)
    gen = torch.Generator().manual_seed(1_000_003 * rank + step)
    x = torch.randn(size, dim, generator=gen)
    return x, x @ w + 0.01 * torch.randn(size, 1, generator=gen)


class Trainer:
    """A replica: model, optimizer, the step count and the state from before the last step."""

    def __init__(self, dim: int, lr: float) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(dim, 64), nn.Tanh(), nn.Linear(64, 1))
        self.params = list(self.model.parameters())
        self.opt = torch.optim.SGD(self.params, lr=lr, momentum=0.9)
        self.steps = 0
        self.kept: tuple[int, np.ndarray] | None = None

    def state(self) -> np.ndarray:
        """Parameters and momentum buffers as one float32 vector (a copy)."""
        parts = [p.detach().reshape(-1) for p in self.params]
        parts += [self.opt.state[p]["momentum_buffer"].reshape(-1) for p in self.params
                  if "momentum_buffer" in self.opt.state[p]]
        return torch.cat(parts).numpy().copy()

    def load(self, vector: np.ndarray) -> None:
        """Set parameters and momentum buffers from :meth:`state`'s vector."""
        pos = 0
        with torch.no_grad():
            targets = list(self.params)
            targets += [self.opt.state[p]["momentum_buffer"] for p in self.params
                        if "momentum_buffer" in self.opt.state[p]]
            for t in targets:
                t.copy_(torch.from_numpy(vector[pos:pos + t.numel()]).view_as(t))
                pos += t.numel()

    def step(self, comm, x: torch.Tensor, y: torch.Tensor, die: bool) -> float:
        """One step: local gradients, averaged over ``comm``'s ranks, then the update."""
        loss = nn.functional.mse_loss(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        if die:
            os.kill(os.getpid(), signal.SIGKILL)
        grads = torch.cat([p.grad.reshape(-1) for p in self.params]).numpy()
        comm.allreduce(grads, out=grads)
        grads /= comm.size
        pos = 0
        for p in self.params:
            p.grad.copy_(torch.from_numpy(grads[pos:pos + p.numel()]).view_as(p))
            pos += p.numel()
        self.kept = (self.steps, self.state())
        self.opt.step()
        self.steps += 1
        return loss.item()

    def recover(self, comm) -> None:
        """Agree with ``comm``'s ranks on the last step all applied, go back to it when this
        rank is one ahead, then take rank 0's replica."""
        counts = np.array([self.steps], np.int64)
        comm.allreduce(counts, "min", out=counts)
        if self.steps > counts[0]:
            self.steps, kept = self.kept
            self.load(kept)
        vector = self.state()
        comm.broadcast(vector, root=0)
        self.load(vector)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--kill-rank", type=int, default=-1, help="rank that dies (-1: none)")
    p.add_argument("--kill-step", type=int, default=5, help="step at which it dies")
    args = p.parse_args()
    torch.set_num_threads(1)
    comm = commflow.init()
    me = comm.rank  # the job's rank: names this rank's data stream for the whole run
    trainer = Trainer(args.dim, args.lr)
    while trainer.steps < args.steps:
        x, y = batch(me, trainer.steps, args.batch, args.dim)
        die = me == args.kill_rank and trainer.steps == args.kill_step
        try:
            loss = trainer.step(comm, x, y, die)
        except CommAbortedError as error:
            start = time.perf_counter()
            lost = comm.size
            comm = comm.shrink(timeout=30)
            trainer.recover(comm)
            ms = (time.perf_counter() - start) * 1e3
            if comm.rank == 0:
                print(f"step {trainer.steps}: {str(error).split(';')[0]}; {comm.size} of {lost} "
                      f"ranks go on (ranks {comm.ranks}); recovered in {ms:.0f} ms")
            continue
        if comm.rank == 0 and (trainer.steps % 5 == 0 or trainer.steps == 1):
            print(f"step {trainer.steps}: loss {loss:.4f} on {comm.size} ranks")
    digest = hashlib.sha256(trainer.state().tobytes()).hexdigest()[:16]
    print(f"finished {trainer.steps} steps on {comm.size} ranks; state sha256 {digest}")


if __name__ == "__main__":
    main()
