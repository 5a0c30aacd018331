"""Helpers for CLI tests: run ``commflow`` in-process through :func:`commflow.cli.main`."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from commflow.cli import main


@dataclass
class Run:
    """Exit code and captured output of one ``commflow`` invocation."""

    code: int
    stdout: str
    stderr: str


@pytest.fixture
def commflow(capsys):
    """``commflow(*args) -> Run``: call the CLI entry point as the shell would."""

    def run(*args: str) -> Run:
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run
