"""Simulations shown on pages print exactly the output shown: every console block of these
pages whose command is ``commflow sim`` or ``commflow sched`` (measurements and servers are
checked elsewhere: tests/ina/test_docs.py)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from commflow.cli import app

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = ("scheduling.md", "ina.md")
DETERMINISTIC = ("sim", "sched")


def blocks(page: str) -> list[tuple[list[str], list[str]]]:
    found = []
    for block in re.findall(r"```console\n(.*?)```", (DOCS / page).read_text(), flags=re.DOTALL):
        command, *shown = block.rstrip("\n").split("\n")
        words = shlex.split(command.removeprefix("$ "))
        if words[:1] == ["commflow"] and words[1:2][0] in DETERMINISTIC:
            found.append((words, shown))
    return found


@pytest.mark.parametrize("page", PAGES)
def test_console_blocks_print_what_the_page_shows(page):
    runs = blocks(page)
    assert runs
    for words, shown in runs:
        assert words[0] == "commflow"
        result = CliRunner().invoke(app, words[1:], terminal_width=80)
        assert result.exit_code == 0, result.output
        assert [line.rstrip() for line in result.output.rstrip("\n").split("\n")] == shown
