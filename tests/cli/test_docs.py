"""Every command in docs/cli.md still runs, in order, with the exit status and the kind of
output (its first word) the doc shows. Numbers are not compared: they follow the models;
the NCCL tuner CSV shown is compared whole.

A command may start with ``VAR=value`` words (its environment) and end with
``  # exit status N`` where its first output line does not tell the status."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def documented_commands() -> list[tuple[str, str]]:
    """``(command, first output line)`` for every ``$`` line of the console blocks."""
    found = []
    for block in re.findall(r"```console\n(.*?)```", DOC.read_text(), flags=re.DOTALL):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("$ "):
                following = lines[i + 1] if i + 1 < len(lines) else ""
                found.append((line[2:], "" if following.startswith("$ ") else following))
    return found


def expected_status(first_line: str) -> int:
    if first_line.startswith("error:"):
        return 2
    return 1 if first_line.startswith("FAILED:") else 0


def test_documented_commands_run(commflow, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    commands = documented_commands()
    assert sum(c.startswith("commflow ") for c, _ in commands) >= 20
    for command, first_line in commands:
        command, _, status = command.partition("  # exit status ")
        words = shlex.split(command.split(" && ")[0])
        env = {}
        while "=" in words[0]:  # VAR=value prefixes set the command's environment
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        if words[0] == "python":
            assert words[1] == "-c"
            exec(words[2], {})  # the doc's one-line file edits
            continue
        if words[0] == "echo":
            assert words[2] == ">"
            Path(words[3]).write_text(words[1] + "\n")
            continue
        with monkeypatch.context() as scope:
            for key, value in env.items():
                scope.setenv(key, value)
            run = commflow(*words[1:])
        assert run.code == (int(status) if status else expected_status(first_line)), (
            command, run.stderr)
        output = (run.stdout + run.stderr).split()
        assert output[:1] == first_line.split()[:1], command
    shown = re.search(r"```text\n(# collective_type.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert (tmp_path / "dgx1-nccl.csv").read_text() == shown.group(1)  # the NCCL CSV shown
