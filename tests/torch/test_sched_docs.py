"""docs/scheduling.md's live-scheduler example prints what the doc shows on 2 ranks, and DDP
with the same SGD prints the same numbers."""

from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .harness import run_group
from .test_docs import _run_script

DOC = Path(__file__).resolve().parents[2] / "docs" / "scheduling.md"


def live_section() -> str:
    return DOC.read_text().split("## Live: commflow.torch.sched", 1)[1].split("\n## ", 1)[0]


def _ddp_weight_sum() -> str:
    """The doc's model, data and SGD, under DDP."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.full((4, 8), float(dist.get_rank()))
    for _ in range(3):
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
    return f"rank {dist.get_rank()}: weight sum {model[0].weight.sum().item():.6f}"


def test_live_example_prints_what_the_doc_shows_and_matches_ddp():
    section = live_section()
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
               if "init_process_group" in block]
    assert "PriorityScheduler(" in code and "sched.finish()" in code
    documented = re.findall(r"^\[rank \d\] (.*)$", section, flags=re.MULTILINE)
    assert len(documented) == 2
    assert run_group(_run_script, 2, code, backend=None) == documented
    assert run_group(_ddp_weight_sum, 2) == documented
