"""Train a small MLP with a 2-D DeviceMesh (data parallel x tensor parallel) the way
torchtitan does: tensor parallelism through DTensor (``parallelize_module`` with
``ColwiseParallel``/``RowwiseParallel``) inside each data-parallel replica, FSDP2
(``fully_shard``) across replicas, and a loss averaged with a functional collective.

Run on 4 CPU ranks (dp=2 x tp=2), on commflow or gloo; both print the same losses::

    commflow run -n 4 examples/train_fsdp_tp.py
    commflow run -n 4 examples/train_fsdp_tp.py --backend gloo
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

import commflow.torch  # noqa: F401  (registers the "commflow" backend)


class Block(torch.nn.Module):
    """A feed-forward block: up-projection, GELU, down-projection, residual."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def train(backend: str, dp: int, tp: int, steps: int, dim: int) -> list[float]:
    """Train ``steps`` steps on a ``dp`` x ``tp`` mesh; returns the dp-averaged losses."""
    dist.init_process_group(backend)
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(dim), Block(dim))
    for block in model:
        parallelize_module(
            block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()}
        )
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(1 + mesh["dp"].get_local_rank())
    losses = []
    for _ in range(steps):
        x = torch.randn(8, dim, generator=generator)
        opt.zero_grad()
        loss = (model(x) - x.flip(-1)).square().mean()
        loss.backward()
        opt.step()
        mean = funcol.all_reduce(loss.detach(), "avg", (mesh, 0))
        losses.append(float(mean))
    dist.destroy_process_group()
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="commflow", help="commflow or gloo")
    parser.add_argument("--dp", type=int, default=2, help="data-parallel degree")
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel degree")
    parser.add_argument("--steps", type=int, default=4, help="training steps")
    parser.add_argument("--dim", type=int, default=16, help="model width")
    args = parser.parse_args()
    torch.set_num_threads(1)
    losses = train(args.backend, args.dp, args.tp, args.steps, args.dim)
    print("losses " + " ".join(f"{v:.6f}" for v in losses))


if __name__ == "__main__":
    main()
