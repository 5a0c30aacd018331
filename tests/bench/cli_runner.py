"""Run ``commflow bench`` in-process for the bench tests."""

from __future__ import annotations

from commflow.cli import main


def run_bench(capsys, *args: str) -> tuple[int, str, str]:
    """``commflow bench ARGS``: (exit code, stdout, stderr)."""
    capsys.readouterr()
    try:
        main(["bench", *args])
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err
