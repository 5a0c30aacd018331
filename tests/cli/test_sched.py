"""`commflow sched`: table, JSON and timeline."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from commflow.cli import app
from commflow.sched import ring_cost, simulate
from commflow.sched.profiles import profile


def test_sched_prints_speedups_over_fifo_as_json(tmp_path):
    png = tmp_path / "t.png"
    result = CliRunner().invoke(app, ["sched", "vgg16", "-p", "fifo,priority,tuned",
                                      "--gbps", "10", "--json", "--png", str(png)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    cost = ring_cost(8, 10)
    fifo = simulate(profile("vgg16"), "fifo", cost).iteration_time
    priority = simulate(profile("vgg16"), "priority", cost).iteration_time
    rows = {r["policy"]: r for r in data["results"]}
    assert rows["fifo"]["iteration_s"] == fifo
    assert rows["priority"]["speedup"] == fifo / priority
    assert rows["bytescheduler-tuned"]["iteration_s"] >= data["lower_bound_s"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sched_errors_are_one_line():
    result = CliRunner().invoke(app, ["sched", "alexnet"])
    assert result.exit_code != 0
    assert "unknown profile 'alexnet'" in str(result.exception) + result.output
