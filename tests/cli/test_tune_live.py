"""`commflow tune --live`: a measured table that `auto` can load."""

from __future__ import annotations

from commflow.collectives import Collective
from commflow.runtime import programs
from commflow.tuning_table import from_json


def test_cli_live_writes_a_table_auto_can_load(commflow, tmp_path):
    path = tmp_path / "live.json"
    run = commflow("tune", "allreduce", "--live", "2", "-b", "1K", "-e", "64K", "-f", "64",
                   "--budget", "10", "-o", str(path))
    assert run.code == 0, run.stderr
    assert run.stdout.startswith("# live 2 ranks, model live, 2 sizes 1K..64K")
    table = from_json(path.read_text())
    assert table.lookup("allreduce", 2, 1024) in programs.names(Collective.ALLREDUCE)
    both = commflow("tune", "allreduce", "--live", "2", "--topo", "dgx1")
    assert both.code == 2 and "give --topo (offline) or --live N" in both.stderr
