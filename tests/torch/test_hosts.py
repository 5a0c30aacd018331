"""The commflow backend joins the host-aware world (engine between hosts) under `commflow run`
without a second store on MASTER_PORT: it rendezvouses through torch's own store."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import torch, torch.distributed as dist
import commflow.torch
dist.init_process_group("commflow")
t = torch.ones(4) * (dist.get_rank() + 1)
dist.all_reduce(t)
print("sum", dist.get_rank(), t.tolist(), flush=True)
dist.destroy_process_group()
"""


def test_backend_under_commflow_run_with_hosts_shares_torchs_store(tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, "-c", "from commflow.cli import main; main()", "run", "-n", "2",
         str(script)],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "COMMFLOW_HOST": "0"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for r in range(2):
        assert f"sum {r} [3.0, 3.0, 3.0, 3.0]" in done.stdout, done.stdout
