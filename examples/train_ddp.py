"""Train a small GPT with DistributedDataParallel over commflow (or gloo, to compare).

    commflow run -n 2 examples/train_ddp.py
    torchrun --nproc_per_node 2 examples/train_ddp.py
    commflow run -n 2 examples/train_ddp.py --backend gloo
    commflow run -n 2 examples/train_ddp.py --backend both              # side by side
    commflow run -n 2 examples/train_ddp.py --backend both --hook bf16  # compressed buckets
    commflow run -n 2 examples/train_ddp.py --backend both --hook int8 --losses

The model is a decoder-only transformer in plain torch (3.3 M parameters by default); the data
is a synthetic language the script generates: a fixed random Markov chain over the vocabulary
in which each token has a few likely successors, so the loss falls from ln(vocab) towards the
chain's entropy. Each rank reads its own stream. ``--backend both`` trains a commflow replica
and a gloo replica of the same model on the same data, one step each in turn, so that both see
the same load on a shared machine (and print the same losses). With a compression hook
(``fp16``, ``bf16``, ``int8``, ``int4``, ``powersgd``, ``topk``; error feedback on) the commflow
replica's losses show what compression costs against gloo's float32 ones; ``--losses`` prints
every step's loss.

Rank 0 prints, per replica, the loss and one summary line: the median step time (slowest rank),
tokens per second over all ranks, and the share of the step spent waiting for communication,
measured as the extra forward+backward time over the same passes run under ``no_sync()`` (no
gradient exchange), relative to the whole step.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from commflow.torch import hooks  # importing commflow.torch registers the "commflow" backend


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a 4x MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """Token and position embeddings, blocks, and an output layer tied to the embedding."""

    def __init__(self, vocab: int, seq: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(dim)
        for table in (self.tokens, self.positions):
            nn.init.normal_(table.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1]))
        return self.norm(self.blocks(x)) @ self.tokens.weight.T


class MarkovText:
    """Batches of a random Markov chain: each token has ``branches`` likely successors."""

    def __init__(self, vocab: int, seq: int, batch: int, seed: int, branches: int = 4) -> None:
        chain = torch.Generator().manual_seed(1234)  # the same language on every rank
        self.successors = torch.randint(vocab, (vocab, branches), generator=chain)
        self.stream = torch.Generator().manual_seed(seed)
        self.vocab, self.seq, self.batch, self.branches = vocab, seq, batch, branches

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets, ``batch x seq`` each."""
        tokens = torch.empty(self.batch, self.seq + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(self.vocab, (self.batch,), generator=self.stream)
        picks = torch.randint(self.branches, (self.batch, self.seq), generator=self.stream)
        for t in range(self.seq):
            tokens[:, t + 1] = self.successors[tokens[:, t], picks[:, t]]
        return tokens[:, :-1], tokens[:, 1:]


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--backend",
        default="commflow",
        choices=["commflow", "gloo", "both"],
        help="both: a commflow and a gloo replica, trained in alternation",
    )
    p.add_argument(
        "--hook",
        default="none",
        choices=["none", "allreduce", "fp16", "bf16", "int8", "int4", "powersgd", "topk"],
        help="route buckets through a commflow comm hook (compressed ones with error feedback)",
    )
    p.add_argument("--losses", action="store_true", help="print every training step's loss")
    p.add_argument("--steps", type=int, default=20, help="timed training steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed first steps")
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket cap (MiB)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: cores / ranks)")
    return p.parse_args()


def register_hook(ddp: DistributedDataParallel, name: str) -> None:
    """Route the buckets through a commflow comm hook (``none``: DDP's own allreduce)."""
    if name == "allreduce":
        ddp.register_comm_hook(hooks.HookState(), hooks.allreduce_hook)
    elif name in ("fp16", "bf16"):
        dtype = torch.float16 if name == "fp16" else torch.bfloat16
        ddp.register_comm_hook(hooks.CompressionState(dtype=dtype), hooks.compressed_allreduce_hook)
    elif name in ("int8", "int4"):
        from commflow.compress import ddp_hook

        state = ddp_hook.QuantizedState(codec=name)
        ddp.register_comm_hook(state, ddp_hook.quantized_allreduce_hook)
    elif name == "powersgd":
        from commflow.torch import powersgd

        ddp.register_comm_hook(powersgd.PowerSGDState(rank=4), powersgd.powersgd_hook)
    elif name == "topk":
        from commflow.torch import topk

        ddp.register_comm_hook(topk.TopKState(ratio=0.1), topk.topk_allreduce_hook)


class Replica:
    """One DDP copy of the model with its optimizer, data stream, losses and timings (s)."""

    def __init__(self, args: argparse.Namespace, name: str, group=None) -> None:
        torch.manual_seed(0)
        self.model = GPT(args.vocab, args.seq, args.dim, args.layers, args.heads)
        self.ddp = DistributedDataParallel(
            self.model, process_group=group, bucket_cap_mb=args.bucket_mb
        )
        self.name = name
        if name == "commflow" and args.hook != "none":
            register_hook(self.ddp, args.hook)
            self.name += f" ({args.hook} hook)"
        self.opt = torch.optim.AdamW(self.ddp.parameters(), lr=3e-3)
        self.data = MarkovText(args.vocab, args.seq, args.batch, seed=dist.get_rank())
        self.losses: list[float] = []
        self.steps: list[float] = []
        self.passes = {True: [], False: []}  # forward+backward with / without gradient sync

    def step(self, *, sync: bool, timed: bool) -> None:
        """One training step; without ``sync`` only the local forward and backward passes."""
        x, y = self.data.next()
        start = time.perf_counter()
        with nullcontext() if sync else self.ddp.no_sync():
            loss = F.cross_entropy(self.ddp(x).flatten(0, 1), y.flatten())
            loss.backward()
        passes = time.perf_counter() - start
        if sync:
            self.opt.step()
            self.losses.append(loss.item())
        self.opt.zero_grad(set_to_none=True)
        if timed:
            self.passes[sync].append(passes)
            if sync:
                self.steps.append(time.perf_counter() - start)

    def summary(self, args: argparse.Namespace) -> list[str]:
        """The loss and timing lines (step time: the slowest rank's median; a collective)."""
        world = dist.get_world_size()
        step = torch.tensor([statistics.median(self.steps)])
        dist.all_reduce(step, op=dist.ReduceOp.MAX)
        step_s = step.item()
        exposed = statistics.median(self.passes[True]) - statistics.median(self.passes[False])
        params = sum(p.numel() for p in self.model.parameters())
        return [
            f"{self.name}: loss {self.losses[0]:.3f} -> {self.losses[-1]:.3f} (ln vocab = "
            f"{math.log(args.vocab):.3f}, chain entropy = {math.log(self.data.branches):.3f})",
            f"{self.name}: {world} ranks, {params / 1e6:.2f}M params, step {step_s * 1e3:.1f} ms "
            f"(median of {args.steps}), {world * args.batch * args.seq / step_s:.0f} tokens/s, "
            f"communication {100 * max(0.0, exposed) / step_s:.1f}% of the step",
        ] + ([f"{self.name}: losses " + " ".join(f"{x:.4f}" for x in self.losses)]
             if args.losses else [])


def main() -> None:
    args = parse()
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // ranks_here))
    names = ["commflow", "gloo"] if args.backend == "both" else [args.backend]
    dist.init_process_group(names[0])
    replicas = [Replica(args, names[0])]
    if args.backend == "both":
        replicas.append(Replica(args, "gloo", dist.new_group(backend="gloo")))
    for step in range(args.warmup + args.steps):
        for replica in replicas:  # interleaved: both see the same machine load
            replica.step(sync=True, timed=step >= args.warmup)
    for _ in range(args.steps):
        for replica in replicas:
            replica.step(sync=False, timed=True)
    lines = [line for replica in replicas for line in replica.summary(args)]
    if dist.get_rank() == 0:
        print("\n".join(lines))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
