"""The entry point: help with examples everywhere, error mapping, the installed script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

COMMANDS = [
    ["topo", "show"],
    ["topo", "list"],
    ["algos"],
    ["build"],
    ["verify"],
    ["export"],
    ["sim"],
    ["bound"],
    ["run"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help_with_examples(commflow, command):
    run = commflow(*command, "--help")
    assert run.code == 0
    assert "Examples" in run.stdout
    assert f"commflow {' '.join(command)}" in run.stdout


def test_top_level_help_lists_the_commands(commflow):
    run = commflow("--help")
    for name in ("topo", "algos", "build", "verify", "export", "sim", "bound"):
        assert f" {name} " in run.stdout


def test_usage_error_exits_2(commflow):
    run = commflow("sim", "allreduce")
    assert run.code == 2 and "--topo" in run.stderr


def test_installed_script_maps_errors_without_traceback():
    script = Path(sys.executable).with_name("commflow")
    run = subprocess.run(
        [str(script), "bound", "allgather", "--topo", "nowhere"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 2
    assert run.stderr.startswith("error: unknown topology 'nowhere'")
    assert "Traceback" not in run.stderr
