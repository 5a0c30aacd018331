"""The README opens with the two set-up commands, and CI runs exactly the second one."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands() -> list[str]:
    return re.findall(r"```sh\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_opens_with_main_job_and_tests():
    main, tests = _commands()[:2]
    assert main.endswith(".venv/bin/commflow bench")
    assert "pytest" in tests and "ruff check ." in tests


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == _commands()[1]


def test_the_tour_prints_what_its_comments_say():
    import contextlib
    import io

    blocks = re.findall(r"```python\n(.+?)```", (ROOT / "README.md").read_text(), flags=re.S)
    blocks = [b for b in blocks if "commflow.init()" not in b]  # needs a world of ranks
    namespace: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        for block in blocks:
            exec(block, namespace)
    claimed = re.search(r"# (9\.\d\d ms, [\d.]+ GB/s)", "".join(blocks)).group(1)
    assert printed.getvalue().strip() == claimed.replace(", ", ", busbw ")
