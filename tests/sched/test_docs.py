"""docs/scheduling.md: its Python example prints what the page shows (its commands:
tests/test_doc_consoles.py)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

DOC = (Path(__file__).resolve().parents[2] / "docs" / "scheduling.md").read_text()


def test_the_python_example_prints_the_toy():
    code = re.search(r"```python\n(.*?)```", DOC, flags=re.DOTALL).group(1)
    shown = re.search(r"prints\n\n```text\n(.*?)```", DOC, flags=re.DOTALL).group(1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code, {})
    assert printed.getvalue() == shown
