"""Entry-point polish: --version, -h everywhere, choices in help, one-line usage errors with
suggestions, whole tables when standard output is a pipe."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import typer

from commflow.cli import app
from commflow.cli._group import reflow, suggest
from commflow.cli.synth import Objective
from commflow.synth import OBJECTIVES


def _commands() -> list[list[str]]:
    found = []
    for name, command in typer.main.get_command(app).commands.items():
        subcommands = getattr(command, "commands", {})
        found += [[name, sub] for sub in subcommands] if subcommands else [[name]]
    return found


def test_version_comes_from_the_package_metadata(commflow):
    for flag in ("--version", "-V"):
        run = commflow(flag)
        assert (run.code, run.stdout) == (0, f"commflow {version('commflow')}\n")


@pytest.mark.parametrize("command", [[], *_commands()], ids=lambda c: " ".join(c) or "top")
def test_dash_h_is_help_on_every_command(commflow, command):
    short, long = commflow(*command, "-h"), commflow(*command, "--help")
    assert short.code == long.code == 0
    assert short.stdout == long.stdout and "Usage: commflow" in short.stdout


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        (["sim"], "<alphabeta|flow>"),
        (["tune"], "<alphabeta|flow>"),
        (["export"], "<Simple|LL|LL128>"),
        (["verify"], "<live|msccl|msccl-executor|rccl>"),
        (["export"], "<msccl|msccl-executor|rccl>"),
        (["synth"], "<bandwidth|latency|balanced>"),
        (["plan"], "<bf16|fp16|fp8>"),
        (["bench"], "<sum|prod|min|max|avg>"),
        (["bench", "--nccl-tests"], "<sum|prod|min|max|avg>"),
        (["p2p"], "<latency|bw|bibw>"),
    ],
)
def test_fixed_choices_are_listed_in_help(commflow, monkeypatch, command, shown):
    monkeypatch.setenv("COLUMNS", "250")
    assert shown in commflow(*command, "-h").stdout


def test_synth_objectives_are_the_synthesizers_and_balanced():
    assert [o.value for o in Objective] == [*OBJECTIVES, "balanced"]


def test_a_value_outside_the_choices_is_one_error_line(commflow):
    run = commflow("sim", "allreduce", "--topo", "dgx1", "--algo", "ring", "--model", "fluid")
    assert (run.code, run.stdout) == (2, "")
    assert run.stderr == (
        "error: Invalid value for '--model' / '-m': 'fluid' is not one of 'alphabeta', "
        "'flow'. (see 'commflow sim -h')\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["simulate"], "no command 'simulate'; did you mean sim? (see 'commflow -h')"),
        (["bnech"], "no command 'bnech'; did you mean bench? (see 'commflow -h')"),
        (["topo", "shw"], "no command 'shw'; did you mean show? (see 'commflow topo -h')"),
        (["zzz"], "no command 'zzz' (see 'commflow -h')"),
    ],
)
def test_an_unknown_command_suggests_the_closest(commflow, args, message):
    run = commflow(*args)
    assert (run.code, run.stdout, run.stderr) == (2, "", f"error: {message}\n")


def test_suggestions_prefer_prefixes_then_spelling():
    known = ["bench", "bound", "build", "sim", "synth"]
    assert suggest("simulate", known) == ["sim"]
    assert suggest("bulid", known) == ["build", "bound"]
    assert suggest("xyz", known) == []


def test_tables_are_whole_when_stdout_is_a_pipe():
    script = Path(sys.executable).with_name("commflow")
    run = subprocess.run(
        [str(script), "synth", "allgather", "--topo", "ring4", "-b", "1K", "-e", "1K", "-m",
         "alphabeta"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True,
        env={k: v for k, v in os.environ.items() if k != "COLUMNS"},
        check=False,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[2].split() == [
        "size", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "bound(GB/s)", "%bound",
        "ring(GB/s)", "multi_ring(GB/s)", "double_binary_tree(GB/s)",
    ]
    assert len(lines) == 4 and lines[3].split()[0] == "1K"


def test_bench_help_offers_nccl_tests_mode_and_its_help_has_its_flags(commflow, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    assert "--nccl-tests" in commflow("bench", "-h").stdout
    text = commflow("bench", "--nccl-tests", "-h").stdout
    assert "Usage: commflow bench" in text
    for flag in ("--ngpus", "--iters", "--warmup_iters", "--check", "--average", "--datatype"):
        assert flag in text


def test_json_is_a_flag_on_every_command_that_has_it():
    group = typer.main.get_command(app)
    found = []
    for command in _commands():
        cmd = group
        for name in command:
            cmd = cmd.commands[name]
        for param in cmd.params:
            if "--json" in param.opts:
                found.append(" ".join(command))
                assert param.is_flag, command
    assert {"bench", "sim", "bound", "p2p", "topo show", "algos"} <= set(found)


def test_shell_completion_completes_commands():
    script = subprocess.run([sys.executable, "-m", "commflow.cli", "--show-completion", "bash"],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "SHELL": "/bin/bash",
                                 # take "bash" as given, not from the parent processes (a
                                 # run under sh failed with "Shell not supported")
                                 "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert script.returncode == 0 and "_commflow_completion" in script.stdout
    env = {**os.environ, "_COMMFLOW_COMPLETE": "complete_bash", "COMP_WORDS": "commflow sc",
           "COMP_CWORD": "1"}
    words = subprocess.run([sys.executable, "-m", "commflow.cli"], capture_output=True,
                           text=True, timeout=60, env=env).stdout.split()
    assert words == ["sched"]


def test_help_paragraphs_are_reflowed_to_the_terminal():
    doc = """First line of a summary
    that goes on.

    A paragraph
    in two lines.

    [bold]Examples[/bold]

      commflow x
      commflow y
    """
    assert reflow(doc).splitlines() == [
        "First line of a summary that goes on.", "", "A paragraph in two lines.", "",
        "[bold]Examples[/bold]", "", "  commflow x", "  commflow y"]
